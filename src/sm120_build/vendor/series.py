"""Apply a patch series to a vendor tree, strictly, one commit per patch; resume after a stop."""

from __future__ import annotations

import re
import shutil
from dataclasses import replace
from pathlib import Path

from ..cache import SCRATCH_PREFIX, abandoned_scratch, scratch_directory
from ..console import say
from ..errors import UserError
from ..gitrepo import git, head
from ..patches import Patch, load_series
from ..pins import Upstream
from .state import (
    STATE_FILE,
    VendorState,
    inputs_key,
    nox_command,
    read_state,
    tree_label,
    write_state,
)
from .unpack import make_pristine_tree


class PatchConflict(UserError):
    """A patch does not apply to the tree below it."""


class PatchAlreadyApplied(UserError):
    """A patch reverse-applies: the tree already contains the change."""


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


def apply_patch(tree: Path, patch: Patch, label: str, home: Path | None = None) -> None:
    """Apply one patch strictly (no fuzz, all files or none) and commit it. `home`: where
    the tree lives once made (it may be made elsewhere), for the commands a refusal names."""
    home = home or tree
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
            f"run `{nox_command(home, 'vendor', '--continue ' + home.name)}` to apply the rest "
            f"of the series, and `{nox_command(home, 'export_patches')}`. `nox -s bump` "
            "reports every patch at once."
        )
    git(tree, "apply", "--index", str(patch.path))
    message = patch.header.rstrip("\n") + "\n"
    git(tree, "commit", "--quiet", "--cleanup=verbatim", "--allow-empty-message", "-m", message)


def untracked_or_modified(tree: Path) -> list[str]:
    """Everything `git status --ignored` lists: edits, untracked and ignored files alike
    (files hidden by the user's global excludes included)."""
    status = git(tree, "status", "--porcelain", "--ignored", "--untracked-files=all").stdout
    return [line[3:] for line in status.splitlines() if line.strip()]


def unsaved_work(tree: Path, label: str) -> list[str]:
    """Everything in `tree` that is not in patches/ yet, or that a rebuild would destroy,
    each naming the file or commits (empty when the tree is absent or clean)."""
    if not tree.exists() and not tree.is_symlink():
        return []
    if tree.is_symlink() or not tree.is_dir() or not (tree / ".git").is_dir():
        return [f"{label}: not a vendor tree made by this tool (a file, a link, a plain "
                "directory or a git worktree)"]
    state = read_state(tree)
    if state is None:
        return [f"{label}: not made by this tool (no .git/{STATE_FILE})"]
    problems = [f"{label}/{name}: edited, untracked or ignored" for name in untracked_or_modified(tree)]
    if not state.complete:
        problems.append(f"{label}: its series stopped part-way, at {state.stopped_at}")
    if head(tree) != state.head:
        problems.append(
            f"{label}: commits not in patches/ yet (git -C {label} log {state.head[:12]}..HEAD)"
        )
    elif state.complete and not state.exact:
        problems.append(f"{label}: refreshed patches not written to patches/ yet")
    return problems


def _check_untouched(tree: Path, label: str, key: str) -> tuple[VendorState, bool]:
    """The tree's state, after refusing anything a rebuild would destroy; and whether it
    stopped part-way with refresh commits that were made for other inputs than `key` (they
    are kept on a branch of the tree made anew, not refused: --continue cannot take them)."""
    if tree.is_symlink() or not tree.is_dir() or not (tree / ".git").is_dir():
        raise UserError(
            f"{label} ({tree}) exists but was not made by this tool (no vendor tree of its "
            "own: a file, a link, a plain directory or a git worktree); nothing was touched. "
            f"Move it away, then run `{nox_command(tree, 'vendor')}`."
        )
    state = read_state(tree)
    if state is None:
        raise UserError(
            f"{label} ({tree}) exists but was not made by this tool (no "
            f".git/{STATE_FILE}); nothing was touched. Move it away, then run "
            f"`{nox_command(tree, 'vendor')}`."
        )
    files = untracked_or_modified(tree)
    if files:
        shown = "\n  ".join(files[:10]) + ("\n  ..." if len(files) > 10 else "")
        raise UserError(
            f"{label} has files that are edited, untracked or ignored by git:\n  {shown}\n"
            "A rebuild would delete them. Commit edits (the message is the patch's DEP-3 "
            f"header) and run `{nox_command(tree, 'export_patches')}`; move other files away; "
            "or discard "
            f"everything with `git -C {label} reset --hard && git -C {label} clean -fdx`."
        )
    if head(tree) != state.head and not state.complete:
        if state.inputs != key:
            return state, True
        raise UserError(
            f"{label} has commits after its series stopped at {state.stopped_at}. Run "
            f"`{nox_command(tree, 'vendor', '--continue ' + tree.name)}` to apply the rest of "
            "the series on "
            f"top, or `rm -rf {label}` to discard them."
        )
    if head(tree) != state.head:
        raise UserError(
            f"{label} has commits that are not in patches/ yet. Run "
            f"`{nox_command(tree, 'export_patches')}` to "
            f"keep them, or `rm -rf {label}` to discard them."
        )
    if state.complete and not state.exact:
        raise UserError(
            f"{label} holds refreshed patches that are not in patches/ yet. Run "
            f"`{nox_command(tree, 'export_patches')}` to keep them, or `rm -rf {label}` to "
            "discard them."
        )
    return state, False


def _keep_refresh(old: Path, new: Path, state: VendorState, label: str) -> str:
    """Fetch the old tree's commits into the new tree as branch kept/<stopped patch>, so that
    the refresh made before the inputs changed is not lost with the old tree."""
    branch = f"kept/{(state.stopped_at or 'refresh').removesuffix('.patch')}"
    git(new, "fetch", "--quiet", "--no-tags", str(old.resolve()), f"HEAD:refs/heads/{branch}")
    return branch


def _apply_series(
    tree: Path, patches: list[Patch], state: VendorState, label: str, home: Path
) -> VendorState:
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
        apply_patch(tree, patch, label, home)
        state = replace(stopped, head=head(tree))
        say(f"{label}: applied {patch.path.name}")
    return replace(state, complete=True, stopped_at=None, remaining=())


def vendor_upstream(upstream: Upstream, sdist: Path, series_dir: Path, tree: Path) -> bool:
    """Make `tree` the sdist plus its patch series. Returns False when it was already current.

    The new tree is made beside the old one and swapped in, so an interruption leaves the
    old tree (or none) in place, never a half-made one. A series that stops at a conflict
    is swapped in too, at the last patch that applied, for the user to refresh.
    """
    label = tree_label(tree)
    patches = load_series(series_dir)  # reject a bad series before touching anything
    key = inputs_key(upstream, patches)
    for leftover in tree.parent.glob(f"{SCRATCH_PREFIX}*-{tree.name}-*"):
        if abandoned_scratch(leftover):  # an interrupted run's new tree, by its marker
            shutil.rmtree(leftover)
    keep_refresh = False
    if tree.exists() or tree.is_symlink():
        state, keep_refresh = _check_untouched(tree, label, key)
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
        old_state = read_state(tree) if keep_refresh else None
        branch = _keep_refresh(tree, new, old_state, label) if old_state else None
        state = VendorState(inputs=key, base=base, head=base, complete=False, exact=True)
        write_state(new, state)
        try:
            write_state(new, replace(_apply_series(new, patches, state, label, tree), exact=True))
        finally:
            # Swap in whatever was made: complete, or stopped at a conflict.
            if tree.exists():
                tree.rename(scratch / "old")
            new.rename(tree)
            if branch is not None and old_state is not None:
                say(
                    f"{label} had stopped at {old_state.stopped_at} with commits of yours on "
                    "top, for other pins or patches than these: it was made again from "
                    f"these, and your commits are kept in it as branch {branch} (`git -C "
                    f"{label} log {branch}` shows them; `git -C {label} cherry-pick COMMIT` "
                    "takes one)"
                )
    return True


def continue_series(upstream: Upstream, series_dir: Path, tree: Path) -> None:
    """After a stop at a conflict and a committed refresh, apply the rest of the series."""
    label = tree_label(tree)
    state = read_state(tree)
    if state is None or state.complete or state.stopped_at is None:
        raise UserError(f"{label} did not stop part-way through its series; nothing to continue")
    patches = load_series(series_dir)
    if inputs_key(upstream, patches) != state.inputs:
        raise UserError(
            f"the pins or patches/{tree.name} changed since {label} stopped at "
            f"{state.stopped_at}; `--continue` would mix two series. Run "
            f"`{nox_command(tree, 'vendor')}`: it "
            "makes the tree again from them and keeps your commits in it on a branch."
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
    done = _apply_series(tree, rest, replace(state, head=head(tree)), label, tree)
    write_state(tree, replace(done, exact=False))
    say(
        f"{label}: series complete; run `{nox_command(tree, 'export_patches')}` to write it "
        "to patches/"
    )
