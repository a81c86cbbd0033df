"""Unpack a verified sdist, refusing any member that could write outside the tree."""

from __future__ import annotations

import tempfile
from tarfile import TarInfo  # the type; the module in use is tarfiles.tarfile()
import zipfile
from pathlib import Path, PurePosixPath

from ..archives import check_wheel
from ..errors import UserError
from ..gitrepo import git, head
from ..pins import Upstream
from ..tarfiles import tarfile


def _check_member(member: TarInfo, tarball: Path) -> None:
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
    module = tarfile()
    try:
        archive = module.open(tarball)
    except (OSError, module.TarError) as exc:
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
            except module.FilterError as exc:
                raise UserError(f"{tarball.name}: refusing to unpack: {exc}") from exc
            (Path(scratch) / tops.pop()).rename(destination)


def unpack_wheel(wheel: Path, destination: Path) -> None:
    """Unpack an upstream wheel as `destination`, after checking it whole: member names,
    no links or devices, no .git, and a RECORD that matches every file."""

    def allowed(name: str) -> str | None:
        return "is inside a .git directory" if ".git" in name.split("/") else None

    check_wheel(wheel, allowed, "upstream wheel")
    with tempfile.TemporaryDirectory(dir=destination.parent) as scratch:
        root = Path(scratch) / "tree"
        with zipfile.ZipFile(wheel) as archive:
            for info in archive.infolist():
                if info.is_dir():
                    continue
                path = root / info.filename
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(archive.read(info))
                executable = (info.external_attr >> 16) & 0o111
                path.chmod(0o755 if executable else 0o644)
        root.rename(destination)


def make_pristine_tree(upstream: Upstream, source: Path, tree: Path) -> str:
    """Unpack the upstream's source file (its sdist, or its wheel) as a fresh git repo at
    `tree` with one commit; return that commit."""
    artifact = upstream.source
    if artifact.is_wheel:
        unpack_wheel(source, tree)
    else:
        unpack_sdist(source, tree)
    git(tree, "init", "--quiet", "--initial-branch=main")
    git(tree, "add", "--all", "--force", ".")
    git(
        tree,
        "commit",
        "--quiet",
        "-m",
        f"{upstream.project} {upstream.version}: pristine "
        f"{'wheel' if artifact.is_wheel else 'sdist'}\n\n"
        f"{'wheel' if artifact.is_wheel else 'sdist'}: {artifact.file}\nsha256: {artifact.sha256}\n",
    )
    return head(tree)
