"""Unpack a verified sdist into vendor/<name> as a git repo and apply its patch series.

vendor/<name> holds one commit for the pristine sdist, then one commit per patch whose
message is the patch's DEP-3 header. A small state file inside .git records which inputs
built the tree, so a re-run can tell "current" from "stale" from "edited by the user".
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .console import say
from .errors import UserError
from .gitrepo import commit_message, git, head, is_dirty
from .patches import (
    Patch,
    dep3_problems,
    load_series,
    parse_dep3,
    patch_file_name,
    read_patch,
    render_patch,
    series_names,
)
from .pins import Upstream

STATE_FILE = "sm120-build.json"


class PatchConflict(UserError):
    """A patch does not apply to the tree below it."""


class PatchAlreadyApplied(UserError):
    """A patch reverse-applies: the tree already contains the change."""


@dataclass(frozen=True)
class VendorState:
    inputs: str | None  # None while a series is being applied or after it failed
    base: str
    head: str


def inputs_key(upstream: Upstream, patches: list[Patch]) -> str:
    """Digest of everything a vendor tree is built from: the sdist and the ordered patches."""
    digest = hashlib.sha256(f"{upstream.sdist}\0{upstream.sha256}\0".encode())
    for patch in patches:
        digest.update(f"{patch.path.name}\0".encode())
        digest.update(hashlib.sha256(patch.path.read_bytes()).digest())
    return digest.hexdigest()


def read_state(tree: Path) -> VendorState | None:
    path = tree / ".git" / STATE_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return VendorState(inputs=data["inputs"], base=data["base"], head=data["head"])


def write_state(tree: Path, state: VendorState) -> None:
    path = tree / ".git" / STATE_FILE
    path.write_text(json.dumps(state.__dict__, indent=2) + "\n")


# --- unpacking ---------------------------------------------------------------------------


def _check_member(member: tarfile.TarInfo, tarball: Path) -> None:
    name = PurePosixPath(member.name)
    if name.is_absolute() or ".." in name.parts:
        raise UserError(f"{tarball.name}: refusing unsafe path {member.name!r}")
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
    depth = 0
    for part in path.parts:
        depth += -1 if part == ".." else (0 if part == "." else 1)
        if depth < 0:
            return True
    return False


def unpack_sdist(tarball: Path, destination: Path) -> None:
    """Unpack the sdist's single top-level directory as `destination`."""
    with tarfile.open(tarball) as archive:
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


# --- applying --------------------------------------------------------------------------


def _failed_hunk(patch: Patch, stderr: str) -> str:
    """Name the file and hunk that `git apply` reported as failing."""
    match = re.search(r"patch failed: (.+):(\d+)", stderr)
    if match is None:
        missing = re.search(
            r"error: (.+): (No such file or directory|does not exist in index)", stderr
        )
        return f"{missing.group(1)}: file not found" if missing else "unknown hunk"
    path, line = match.group(1), int(match.group(2))
    in_file = False
    for diff_line in patch.diff.splitlines():
        if diff_line.startswith("+++ "):
            in_file = diff_line[4:].split("/", 1)[-1] == path
        elif in_file and re.match(rf"@@ -{line}(,\d+)? ", diff_line):
            return f"{path}, hunk {diff_line}"
    return f"{path}, hunk at line {line}"


def apply_patch(tree: Path, patch: Patch, label: str) -> None:
    """Apply one patch strictly (no fuzz, all files or none) and commit it."""
    check = git(tree, "apply", "--check", str(patch.path), check=False)
    if check.returncode != 0:
        reverse = git(tree, "apply", "--check", "--reverse", str(patch.path), check=False)
        if reverse.returncode == 0:
            raise PatchAlreadyApplied(
                f"{patch.path} is already applied in {label}: it applies in reverse, so the "
                "upstream source already has this change. Remove it from the series."
            )
        raise PatchConflict(
            f"{patch.path} does not apply to {label}: {_failed_hunk(patch, check.stderr)}\n"
            f"git apply said:\n{check.stderr.strip()}\n"
            f"{label} is left at the last patch that applied. Refresh this patch against it, "
            "or fix the series."
        )
    git(tree, "apply", "--index", str(patch.path))
    message = patch.header.rstrip("\n") + "\n"
    git(tree, "commit", "--quiet", "--cleanup=verbatim", "--allow-empty-message", "-m", message)


def _check_untouched(tree: Path, label: str) -> VendorState:
    state = read_state(tree)
    if state is None:
        raise UserError(
            f"{label} exists but was not made by this tool; move it away and run `nox -s vendor`"
        )
    if is_dirty(tree):
        raise UserError(
            f"{label} has uncommitted edits. Commit them (the message is the patch's DEP-3 "
            f"header) and run `nox -s export_patches`, or discard them with "
            f"`git -C {label} reset --hard && git -C {label} clean -fdx`."
        )
    if head(tree) != state.head:
        raise UserError(
            f"{label} has commits that are not in patches/ yet. Run `nox -s export_patches` to "
            f"keep them, or `rm -rf {label}` to discard them."
        )
    return state


def vendor_upstream(upstream: Upstream, sdist: Path, series_dir: Path, tree: Path) -> bool:
    """Make `tree` the sdist plus its patch series. Returns False when it was already current."""
    label = f"vendor/{tree.name}"
    patches = load_series(series_dir)  # reject a bad series before touching anything
    key = inputs_key(upstream, patches)
    if tree.exists():
        if _check_untouched(tree, label).inputs == key:
            say(
                f"{label} is current ({upstream.project} {upstream.version}, "
                f"{len(patches)} patches)"
            )
            return False
        say(f"{label} is stale; rebuilding it from the cached sdist")
        shutil.rmtree(tree)

    tree.parent.mkdir(parents=True, exist_ok=True)
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
    base = head(tree)
    write_state(tree, VendorState(inputs=None, base=base, head=base))
    for patch in patches:
        apply_patch(tree, patch, label)
        write_state(tree, VendorState(inputs=None, base=base, head=head(tree)))
        say(f"{label}: applied {patch.path.name}")
    write_state(tree, VendorState(inputs=key, base=base, head=head(tree)))
    return True


# --- exporting -------------------------------------------------------------------------


def export_patches(upstream: Upstream, tree: Path, series_dir: Path) -> list[str]:
    """Regenerate series_dir from the commits above the pristine base in `tree`.

    An existing patch keeps its file name when a commit carries its subject, so an
    unchanged series exports byte-identically.
    """
    label = f"vendor/{tree.name}"
    state = read_state(tree)
    if state is None:
        raise UserError(f"{label} was not made by this tool; run `nox -s vendor` first")
    if is_dirty(tree):
        raise UserError(f"{label} has uncommitted edits; commit them first, then export")

    old_names = series_names(series_dir) if (series_dir / "series").is_file() else []
    by_subject = {
        read_patch(series_dir / name).subject: name
        for name in old_names
        if (series_dir / name).is_file()
    }
    commits = git(tree, "rev-list", "--reverse", f"{state.base}..HEAD").stdout.split()
    rendered: dict[str, str] = {}
    for index, commit in enumerate(commits, start=1):
        message = commit_message(tree, commit)
        missing = dep3_problems(message)
        if missing:
            raise UserError(
                f"{label} commit {commit[:12]}: its message is the patch header and lacks "
                f"{'; '.join(missing)}. Reword it (git commit --amend) and export again."
            )
        fields = parse_dep3(message)
        subject = (fields.get("Subject") or fields.get("Description", "")).splitlines()[0]
        name = by_subject.get(subject) or patch_file_name(index, subject)
        diff = git(
            tree,
            "diff",
            "--no-color",
            "--no-ext-diff",
            "--no-renames",
            "--src-prefix=a/",
            "--dst-prefix=b/",
            f"{commit}^",
            commit,
        ).stdout
        rendered[name] = render_patch(message, diff)

    series_dir.mkdir(parents=True, exist_ok=True)
    for name, text in rendered.items():
        (series_dir / name).write_text(text)
    (series_dir / "series").write_text("".join(f"{name}\n" for name in rendered))
    for name in set(old_names) - set(rendered):
        (series_dir / name).unlink(missing_ok=True)

    patches = load_series(series_dir)
    write_state(
        tree, VendorState(inputs=inputs_key(upstream, patches), base=state.base, head=head(tree))
    )
    return list(rendered)
