"""Unpack a verified sdist, refusing any member that could write outside the tree."""

from __future__ import annotations

import tempfile
from pathlib import Path, PurePosixPath

from ..errors import UserError
from ..gitrepo import git, head
from ..pins import Upstream
from ..tarfiles import tarfile


def _check_member(member: tarfile.TarInfo, tarball: Path) -> None:
    name = PurePosixPath(member.name)
    if not name.parts:  # "" or "." (pathlib drops "." parts)
        raise UserError(f"{tarball.name}: refusing member {member.name!r}: it names no path")
    if name.is_absolute() or ".." in name.parts:
        raise UserError(f"{tarball.name}: refusing unsafe path {member.name!r}")
    if ".git" in name.parts:
        # A shipped .git would bring hooks and configuration that git honours.
        raise UserError(f"{tarball.name}: refusing {member.name!r}: sdists may not ship .git")
    if member.issym() or member.islnk():
        target = PurePosixPath(member.linkname)
        base = name.parent if member.issym() else PurePosixPath()
        if target.is_absolute() or _escapes(base / target):
            raise UserError(
                f"{tarball.name}: refusing link {member.name!r} -> {member.linkname!r}, "
                "which points outside the tree"
            )
    if member.isdev():
        raise UserError(f"{tarball.name}: refusing device file {member.name!r}")


def _escapes(path: PurePosixPath) -> bool:
    """Whether a relative path climbs above where it starts (pathlib has dropped its "."
    parts)."""
    depth = 0
    for part in path.parts:
        depth += -1 if part == ".." else 1
        if depth < 0:
            return True
    return False


def unpack_sdist(tarball: Path, destination: Path) -> None:
    """Unpack the sdist's single top-level directory as `destination`."""
    try:
        archive = tarfile.open(tarball)
    except (OSError, tarfile.TarError) as exc:
        raise UserError(f"cannot open {tarball} as a tarball: {exc}") from None
    with archive:
        members = archive.getmembers()
        for member in members:
            _check_member(member, tarball)
        tops = {PurePosixPath(m.name).parts[0] for m in members}
        if len(tops) != 1:
            raise UserError(f"{tarball.name}: expected one top-level directory, got {sorted(tops)}")
        with tempfile.TemporaryDirectory(dir=destination.parent) as scratch:
            try:
                archive.extractall(scratch, filter="data")
            except tarfile.FilterError as exc:
                raise UserError(f"{tarball.name}: refusing to unpack: {exc}") from exc
            (Path(scratch) / tops.pop()).rename(destination)


def make_pristine_tree(upstream: Upstream, sdist: Path, tree: Path) -> str:
    """Unpack `sdist` as a fresh git repo at `tree` with one commit; return that commit."""
    unpack_sdist(sdist, tree)
    git(tree, "init", "--quiet", "--initial-branch=main")
    git(tree, "add", "--all", "--force", ".")
    git(
        tree,
        "commit",
        "--quiet",
        "-m",
        f"{upstream.project} {upstream.version}: pristine sdist\n\n"
        f"sdist: {upstream.sdist}\nsha256: {upstream.sha256}\n",
    )
    return head(tree)
