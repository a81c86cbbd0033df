"""Unpack a verified sdist into vendor/<name> as a git repo and apply its patch series.

vendor/<name> holds one commit for the pristine sdist, then one commit per patch whose
message is the patch's DEP-3 header. A small state file inside .git records which inputs
built the tree, so a re-run can tell "current" from "stale" from "edited by the user".
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tarfile
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path, PurePosixPath

from .cache import SCRATCH_PREFIX, scratch_directory
from .console import say
from .errors import UserError
from .gitrepo import commit_message, git, head
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
    """What built a vendor tree, kept in .git/sm120-build.json.

    inputs: digest of the sdist and the patches/ series the tree was made from.
    base, head: the pristine commit, and where this tool last left HEAD.
    complete: every patch of that series is in the tree.
    exact: the tree is that series as it stands in patches/ (false after a refresh was
        committed and `--continue`d, until export_patches writes it to patches/).
    stopped_at, remaining: when not complete, the patch that did not apply and the names
        after it, which `vendor --continue` applies once the refresh is committed.
    """

    inputs: str
    base: str
    head: str
    complete: bool
    exact: bool
    stopped_at: str | None = None
    remaining: tuple[str, ...] = ()


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
    try:
        data = json.loads(path.read_text())
        return VendorState(
            inputs=str(data["inputs"]),
            base=str(data["base"]),
            head=str(data["head"]),
            complete=bool(data["complete"]),
            exact=bool(data["exact"]),
            stopped_at=data.get("stopped_at"),
            remaining=tuple(data.get("remaining", ())),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(
            f"{path} is damaged ({type(exc).__name__}: {exc}), so it is unknown which commits "
            f"of vendor/{tree.name} are patches. Keep what you need (`git -C vendor/{tree.name} "
            f"log`), then remove vendor/{tree.name} and run `nox -s vendor`."
        ) from None


def current_inputs(tree: Path) -> str:
    """The digest of the sdist and patches a complete vendor tree was made from."""
    state = read_state(tree)
    if state is None or not state.complete:
        raise UserError(f"vendor/{tree.name} is not complete; run `nox -s vendor`")
    return state.inputs


def series_label(tree: Path) -> str:
    """p<8 hex>: the patch-series label of the versions built from a vendor tree ("p" keeps
    the segment from being all digits, which PEP 440 would renormalise)."""
    return f"p{current_inputs(tree)[:8]}"


def write_state(tree: Path, state: VendorState) -> None:
    """Write the state file atomically: an interrupted write never leaves half a file."""
    path = tree / ".git" / STATE_FILE
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(asdict(state), indent=2) + "\n")
    os.replace(partial, path)


# --- unpacking ---------------------------------------------------------------------------


def _check_member(member: tarfile.TarInfo, tarball: Path) -> None:
    name = PurePosixPath(member.name)
    if not name.parts or name.parts == (".",):
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
    depth = 0
    for part in path.parts:
        depth += -1 if part == ".." else (0 if part == "." else 1)
        if depth < 0:
            return True
    return False


def unpack_sdist(tarball: Path, destination: Path) -> None:
    """Unpack the sdist's single top-level directory as `destination`."""
    try:
        archive = tarfile.open(tarball)  # noqa: SIM115 (closed by the with below)
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
            f"{label} is left at the last patch that applied. To refresh this patch, make its "
            f"change in {label} and commit it with the patch's header as the message, then "
            f"run `nox -s vendor -- --continue {label.rsplit('/', 1)[-1]}` to apply the rest "
            "of the series, and `nox -s export_patches`. `nox -s bump` reports every patch "
            "at once."
        )
    git(tree, "apply", "--index", str(patch.path))
    message = patch.header.rstrip("\n") + "\n"
    git(tree, "commit", "--quiet", "--cleanup=verbatim", "--allow-empty-message", "-m", message)


def untracked_or_modified(tree: Path) -> list[str]:
    """Everything `git status --ignored` lists: edits, untracked and ignored files alike
    (files hidden by the user's global excludes included)."""
    status = git(tree, "status", "--porcelain", "--ignored", "--untracked-files=all").stdout
    return [line[3:] for line in status.splitlines() if line.strip()]


def _half_made(tree: Path) -> bool:
    """A tree an interrupted first vendor left: no state file and no commit yet."""
    if read_state(tree) is not None:
        return False
    return (
        not (tree / ".git").is_dir()
        or git(tree, "rev-parse", "--verify", "-q", "HEAD", check=False).returncode != 0
    )


def _check_untouched(tree: Path, label: str) -> VendorState:
    """The tree's state, after refusing anything a rebuild would destroy."""
    state = read_state(tree)
    if state is None:
        raise UserError(
            f"{label} exists but was not made by this tool; move it away and run `nox -s vendor`"
        )
    files = untracked_or_modified(tree)
    if files:
        shown = "\n  ".join(files[:10]) + ("\n  ..." if len(files) > 10 else "")
        raise UserError(
            f"{label} has files that are edited, untracked or ignored by git:\n  {shown}\n"
            "A rebuild would delete them. Commit edits (the message is the patch's DEP-3 "
            "header) and run `nox -s export_patches`; move other files away; or discard "
            f"everything with `git -C {label} reset --hard && git -C {label} clean -fdx`."
        )
    if head(tree) != state.head and not state.complete:
        raise UserError(
            f"{label} has commits after its series stopped at {state.stopped_at}. Run "
            f"`nox -s vendor -- --continue {tree.name}` to apply the rest of the series on "
            f"top, or `rm -rf {label}` to discard them."
        )
    if head(tree) != state.head:
        raise UserError(
            f"{label} has commits that are not in patches/ yet. Run `nox -s export_patches` to "
            f"keep them, or `rm -rf {label}` to discard them."
        )
    if state.complete and not state.exact:
        raise UserError(
            f"{label} holds refreshed patches that are not in patches/ yet. Run "
            f"`nox -s export_patches` to keep them, or `rm -rf {label}` to discard them."
        )
    return state


def _apply_series(tree: Path, patches: list[Patch], state: VendorState, label: str) -> VendorState:
    """Apply `patches` in order on top of state.head, recording progress after each."""
    for index, patch in enumerate(patches):
        stopped = replace(
            state,
            complete=False,
            exact=False,
            stopped_at=patch.path.name,
            remaining=tuple(p.path.name for p in patches[index + 1 :]),
        )
        write_state(tree, stopped)
        apply_patch(tree, patch, label)
        state = replace(stopped, head=head(tree))
        say(f"{label}: applied {patch.path.name}")
    return replace(state, complete=True, stopped_at=None, remaining=())


def vendor_upstream(upstream: Upstream, sdist: Path, series_dir: Path, tree: Path) -> bool:
    """Make `tree` the sdist plus its patch series. Returns False when it was already current.

    The new tree is made beside the old one and swapped in, so an interruption leaves the
    old tree (or none) in place, never a half-made one. A series that stops at a conflict
    is swapped in too, at the last patch that applied, for the user to refresh.
    """
    label = f"vendor/{tree.name}"
    patches = load_series(series_dir)  # reject a bad series before touching anything
    key = inputs_key(upstream, patches)
    for leftover in tree.parent.glob(f"{SCRATCH_PREFIX}*-{tree.name}-*"):
        shutil.rmtree(leftover)  # an interrupted run's new tree; we hold the cache lock
    if tree.exists() and _half_made(tree):
        say(f"{label} was left half-made by an interrupted run; making it again")
        shutil.rmtree(tree)
    if tree.exists():
        state = _check_untouched(tree, label)
        if state.complete and state.exact and state.inputs == key:
            say(
                f"{label} is current ({upstream.project} {upstream.version}, "
                f"{len(patches)} patches)"
            )
            return False
        say(f"{label} is stale; rebuilding it from the cached sdist")

    tree.parent.mkdir(parents=True, exist_ok=True)
    with scratch_directory(tree.parent, tree.name) as scratch:
        new = scratch / tree.name
        base = make_pristine_tree(upstream, sdist, new)
        state = VendorState(inputs=key, base=base, head=base, complete=False, exact=True)
        write_state(new, state)
        try:
            write_state(new, replace(_apply_series(new, patches, state, label), exact=True))
        finally:
            # Swap in whatever was made: complete, or stopped at a conflict.
            if tree.exists():
                tree.rename(scratch / "old")
            new.rename(tree)
    return True


def continue_series(upstream: Upstream, series_dir: Path, tree: Path) -> None:
    """After a stop at a conflict and a committed refresh, apply the rest of the series."""
    label = f"vendor/{tree.name}"
    state = read_state(tree)
    if state is None or state.complete or state.stopped_at is None:
        raise UserError(f"{label} did not stop part-way through its series; nothing to continue")
    patches = load_series(series_dir)
    if inputs_key(upstream, patches) != state.inputs:
        raise UserError(
            f"patches/{tree.name} changed since {label} stopped at {state.stopped_at}; "
            "`--continue` would mix two series. Run `nox -s vendor` to start again."
        )
    files = untracked_or_modified(tree)
    if files:
        raise UserError(
            f"{label} has uncommitted or untracked files ({files[0]}, ...); commit "
            f"the refresh of {state.stopped_at} first"
        )
    refreshed = git(tree, "rev-list", f"{state.head}..HEAD").stdout.split()
    if not refreshed:
        raise UserError(
            f"{label} has no commit after the stop: make the change of {state.stopped_at} "
            "in the tree and commit it, with the patch's header as the message, first"
        )
    rest = [patch for patch in patches if patch.path.name in state.remaining]
    done = _apply_series(tree, rest, replace(state, head=head(tree)), label)
    write_state(tree, replace(done, exact=False))
    say(f"{label}: series complete; run `nox -s export_patches` to write it to patches/")


# --- exporting -------------------------------------------------------------------------


def _subject(message: str) -> str:
    fields = parse_dep3(message)
    return (fields.get("Subject") or fields.get("Description", "")).splitlines()[0]


def _series_text(series_dir: Path) -> str:
    series = series_dir / "series"
    return series.read_text() if series.is_file() else ""


def _check_reproduces_head(tree: Path, base: str, rendered: dict[str, str], label: str) -> None:
    """Refuse an export whose patches, applied in order to the pristine tree, do not give the
    vendor tree's HEAD exactly: whatever it would lose (a commit, a file git apply cannot
    take) is named before anything is written."""
    with tempfile.TemporaryDirectory(prefix="export-check-") as scratch:
        index = Path(scratch) / "index"
        git(tree, "read-tree", base, index=index)
        for name, text in rendered.items():
            patch = Path(scratch) / name
            patch.write_text(text)
            applied = git(tree, "apply", "--cached", str(patch), check=False, index=index)
            if applied.returncode != 0:
                raise UserError(
                    f"{label}: the exported {name} does not apply on top of the ones before "
                    f"it ({applied.stderr.strip()}); nothing was written to patches/"
                )
        written = git(tree, "write-tree", index=index).stdout.strip()
    head = git(tree, "rev-parse", "HEAD^{tree}").stdout.strip()
    if written != head:
        lost = git(tree, "diff", "--stat", written, head).stdout.strip()
        raise UserError(
            f"{label}: the exported series would not rebuild HEAD; it would lose:\n{lost}\n"
            "Nothing was written to patches/."
        )


def export_patches(upstream: Upstream, tree: Path, series_dir: Path) -> list[str]:
    """Regenerate series_dir from the commits above the pristine base in `tree`.

    An existing patch keeps its file name when a commit carries its subject, so an
    unchanged series exports byte-identically. Nothing is lost: the export refuses a tree
    whose series stopped part-way or whose patches/ changed since it was made, refuses
    two commits with one subject, and never deletes a patch file.
    """
    label = f"vendor/{tree.name}"
    state = read_state(tree)
    if state is None:
        raise UserError(f"{label} was not made by this tool; run `nox -s vendor` first")
    if not state.complete:
        raise UserError(
            f"{label} stopped part-way through its series, at {state.stopped_at}: exporting "
            f"now would drop {', '.join(state.remaining) or 'nothing'} and "
            f"{state.stopped_at}. Commit the refresh of {state.stopped_at}, run "
            f"`nox -s vendor -- --continue {tree.name}`, then export."
        )
    if untracked_or_modified(tree):
        raise UserError(
            f"{label} has uncommitted or untracked files; commit them first, then export"
        )
    old_names = series_names(series_dir) if (series_dir / "series").is_file() else []
    current = [read_patch(series_dir / name) for name in old_names if (series_dir / name).is_file()]
    if len(current) != len(old_names) or inputs_key(upstream, current) != state.inputs:
        raise UserError(
            f"patches/{tree.name} changed since {label} was made; exporting would overwrite "
            f"those changes. Keep them (commit them), then run `nox -s vendor` to rebuild "
            f"{label} from them, and make your tree changes there."
        )

    commits = git(tree, "rev-list", "--reverse", f"{state.base}..HEAD").stdout.split()
    messages = [commit_message(tree, commit) for commit in commits]
    for commit, message in zip(commits, messages, strict=True):
        missing = dep3_problems(message)
        if missing:
            raise UserError(
                f"{label} commit {commit[:12]}: its message is the patch header and lacks "
                f"{'; '.join(missing)}. Reword it (git commit --amend) and export again."
            )
    subjects = [_subject(message) for message in messages]
    repeated = sorted({subject for subject in subjects if subjects.count(subject) > 1})
    if repeated:
        raise UserError(
            f"{label} has several commits with the subject {repeated[0]!r}; each patch needs "
            "its own subject (it names the patch file). Reword or squash them, then export."
        )
    # Subjects that differ only in case, punctuation or past the 50th character make the
    # same file name: one patch would take the other's file.
    slugs = [patch_file_name(0, subject) for subject in subjects]
    clashing = [s for s, slug in zip(subjects, slugs, strict=True) if slugs.count(slug) > 1]
    if clashing:
        raise UserError(
            f"{label} has commits whose subjects make the same patch file name: "
            f"{', '.join(repr(s) for s in clashing)}. Reword one of them, then export."
        )

    by_subject = {patch.subject: patch.path.name for patch in current}
    reused = {by_subject[subject] for subject in subjects if subject in by_subject}
    # A new file name must not take a name a kept patch keeps, nor overwrite a patch file
    # that stays behind for another patch.
    taken = {path.name for path in series_dir.glob("*.patch")} | reused
    rendered: dict[str, str] = {}
    for index, (commit, message, subject) in enumerate(
        zip(commits, messages, subjects, strict=True), start=1
    ):
        own = by_subject.get(subject)
        name = own or patch_file_name(index, subject)
        suffix = 1
        while own is None and name in taken | set(rendered):
            suffix += 1
            name = patch_file_name(index, subject, suffix)
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
    if len(rendered) != len(commits):
        raise UserError(f"{label}: {len(commits)} commits gave {len(rendered)} patch files")

    # Comment lines (such as bump's records of dropped patches) are kept, at the top.
    comments = [line for line in _series_text(series_dir).splitlines() if line.startswith("#")]
    series_text = "".join(f"{line}\n" for line in [*comments, *rendered])
    _check_reproduces_head(tree, state.base, rendered, label)
    series_dir.mkdir(parents=True, exist_ok=True)
    for name, text in rendered.items():
        (series_dir / name).write_text(text)
    (series_dir / "series").write_text(series_text)
    for name in sorted(set(old_names) - set(rendered)):
        say(
            f"patches/{tree.name}/{name} is no longer in the series; it is left in place. "
            "Delete it if that is what you meant."
        )

    patches = load_series(series_dir)
    write_state(
        tree,
        replace(state, inputs=inputs_key(upstream, patches), head=head(tree), exact=True),
    )
    return list(rendered)
