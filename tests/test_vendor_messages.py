"""What vendor/ tells the user, whole: each refusal of a rebuild or of `--continue`, the
conflict report, the commit a patch becomes, and the state file, on generated sdists and
patches with real git."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from sm120_build.errors import UserError
from sm120_build.gitrepo import commit_message, git, head
from sm120_build.patches import Patch
from sm120_build.vendor import continue_series, read_state, vendor_upstream
from sm120_build.vendor.series import _failed_hunk
from sm120_build.vendor.state import STATE_FILE, series_label

from .conftest import make_patch, refusal, write_series
from .test_vendor import (  # noqa: F401 (fixtures)
    LINES,
    commit_refresh,
    stop_at_second,
    three_patches,
    two_patches,
)


def test_continue_refuses_what_did_not_stop(three_patches: Any) -> None:  # noqa: F811
    upstream, sdist, series, tree = three_patches
    nothing = "vendor/demo did not stop part-way through its series; nothing to continue"
    assert refusal(continue_series, upstream, series, tree) == nothing  # never vendored
    vendor_upstream(upstream, sdist, series, tree)
    assert refusal(continue_series, upstream, series, tree) == nothing  # complete


def test_continue_refuses_a_changed_series_untracked_files_and_no_refresh(
    three_patches: Any,  # noqa: F811
) -> None:
    upstream, sdist, series, tree = three_patches
    stop_at_second(upstream, sdist, series, tree)
    assert refusal(continue_series, upstream, series, tree) == (
        "vendor/demo has no commit after the stop: make the change of 0002-second.patch in "
        "the tree and commit it, with the patch's header as the message, first"
    )
    (tree / "new.txt").write_text("x")
    assert refusal(continue_series, upstream, series, tree) == (
        "vendor/demo has uncommitted or untracked files (new.txt, ...); commit the refresh "
        "of 0002-second.patch first"
    )
    (tree / "new.txt").unlink()
    (series / "0003-third.patch").write_text((series / "0003-third.patch").read_text() + "\n")
    assert refusal(continue_series, upstream, series, tree) == (
        "the pins or patches/demo changed since vendor/demo stopped at 0002-second.patch; "
        "`--continue` would mix two series. Run `nox -s vendor`: it makes the tree again from "
        "them and keeps your commits in it on a branch."
    )


def test_continue_records_a_complete_but_not_exported_series(
    three_patches: Any,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    upstream, sdist, series, tree = three_patches
    stop_at_second(upstream, sdist, series, tree)
    commit_refresh(tree, "second", "line 10", "LINE 10")
    continue_series(upstream, series, tree)
    state = read_state(tree)
    assert state is not None
    assert (state.complete, state.exact, state.stopped_at, state.remaining) == (
        True,
        False,
        None,
        (),
    )
    assert state.head == head(tree)
    err = capsys.readouterr().err
    assert "sm120-build: vendor/demo: applied 0003-third.patch\n" in err
    assert err.endswith(
        "sm120-build: vendor/demo: series complete; run `nox -s export_patches` to write it "
        "to patches/\n"
    )
    # A rebuild now would lose the refresh: it is refused until exported.
    assert refusal(vendor_upstream, upstream, sdist, series, tree) == (
        "vendor/demo holds refreshed patches that are not in patches/ yet. Run "
        "`nox -s export_patches` to keep them, or `rm -rf vendor/demo` to discard them."
    )


def test_a_stopped_tree_with_a_new_commit_is_not_rebuilt(three_patches: Any) -> None:  # noqa: F811
    upstream, sdist, series, tree = three_patches
    stop_at_second(upstream, sdist, series, tree)
    commit_refresh(tree, "second", "line 10", "LINE 10")
    assert refusal(vendor_upstream, upstream, sdist, series, tree) == (
        "vendor/demo has commits after its series stopped at 0002-second.patch. Run "
        "`nox -s vendor -- --continue demo` to apply the rest of the series on top, or "
        "`rm -rf vendor/demo` to discard them."
    )


def test_the_conflict_report_names_the_hunk_and_what_to_do(three_patches: Any) -> None:  # noqa: F811
    upstream, sdist, series, tree = three_patches
    drifted = [*LINES[:11], "context upstream changed", *LINES[12:]]
    make_patch(series / "0002-second.patch", "src/code.txt", drifted, 9, "LINE 10", "second")
    message = refusal(vendor_upstream, upstream, sdist, series, tree)
    first, rest = message.split("\n", 1)
    assert first == (
        f"{series / '0002-second.patch'} does not apply to vendor/demo: src/code.txt, hunk "
        "@@ -7,7 +7,7 @@"
    )
    assert rest.startswith("git apply said:\nerror: patch failed: src/code.txt:7\n")
    assert rest.endswith(
        "\nvendor/demo is left at the last patch that applied. To refresh this patch, make its "
        "change in vendor/demo and commit it with the patch's header as the message, then run "
        "`nox -s vendor -- --continue demo` to apply the rest of the series, and "
        "`nox -s export_patches`. `nox -s bump` reports every patch at once."
    )


def test_an_applied_patch_is_named(demo: Any) -> None:
    upstream, sdist, series = demo(["alpha", "BETA", "gamma"])
    patch = make_patch(
        series / "0001-beta.patch", "src/code.txt", ["alpha", "beta", "gamma"], 1, "BETA", "b"
    )
    write_series(series, patch)
    tree = series.parent.parent / "vendor" / "demo"
    assert refusal(vendor_upstream, upstream, sdist, series, tree) == (
        f"{patch} is already applied in vendor/demo: it applies in reverse, so the upstream "
        "source already has this change. Remove it from the series."
    )


def test_each_patch_commit_is_its_header_verbatim(demo: Any) -> None:
    upstream, sdist, series = demo(LINES)
    patch = make_patch(series / "0001-a.patch", "src/code.txt", LINES, 1, "LINE 2", "a")
    header = "Description: a\n# kept: not a comment here\nAuthor: me  \nForwarded: no  \n"
    text = patch.read_text()
    patch.write_text(header + "\n" + text[text.index("diff --git") :])
    write_series(series, patch)
    tree = series.parent.parent / "vendor" / "demo"
    vendor_upstream(upstream, sdist, series, tree)
    assert commit_message(tree, "HEAD") == header


@pytest.mark.parametrize(
    ("stderr", "named"),
    [
        ("error: src/gone.txt: No such file or directory\n", "src/gone.txt: file not found"),
        ("error: src/gone.txt: does not exist in index\n", "src/gone.txt: file not found"),
        ("fatal: corrupt patch at line 9\n", "unknown hunk"),
        ("error: patch failed: b.txt:5\n", "b.txt, hunk @@ -5,2 +5,2 @@"),
        ("error: patch failed: b.txt:9\n", "b.txt, hunk at line 9"),
    ],
)
def test_the_failed_hunk_is_found_in_its_own_file(stderr: str, named: str) -> None:
    diff = (
        "diff --git a/a.txt b/a.txt\n--- a/a.txt\n+++ b/a.txt\n@@ -5,2 +5,2 @@ a\n-x\n+y\n"
        "diff --git a/b.txt b/b.txt\n--- a/b.txt\n+++ b/b.txt\n@@ -5,2 +5,2 @@\n-x\n+y\n"
    )
    assert _failed_hunk(Patch(Path("p.patch"), "", diff), stderr) == named


def test_rebuild_refusals_of_foreign_and_edited_trees(two_patches: Any) -> None:  # noqa: F811
    upstream, sdist, series, tree = two_patches
    tree.mkdir(parents=True)
    git(tree, "init", "--quiet")
    (tree / "a").write_text("a")
    git(tree, "add", "a")
    git(tree, "commit", "--quiet", "-m", "mine")
    assert refusal(vendor_upstream, upstream, sdist, series, tree) == (
        f"vendor/demo ({tree}) exists but was not made by this tool (no "
        ".git/sm120-build.json); nothing was touched. Move it away, then run `nox -s vendor`."
    )
    shutil.rmtree(tree)  # ours this time, then littered with twelve files
    vendor_upstream(upstream, sdist, series, tree)
    for n in range(12):
        (tree / f"f{n:02d}").write_text("x")
    shown = "\n  ".join(f"f{n:02d}" for n in range(10))
    assert refusal(vendor_upstream, upstream, sdist, series, tree) == (
        f"vendor/demo has files that are edited, untracked or ignored by git:\n  {shown}\n  ...\n"
        "A rebuild would delete them. Commit edits (the message is the patch's DEP-3 header) "
        "and run `nox -s export_patches`; move other files away; or discard everything with "
        "`git -C vendor/demo reset --hard && git -C vendor/demo clean -fdx`."
    )


def test_the_state_file_and_the_series_label(two_patches: Any) -> None:  # noqa: F811
    upstream, sdist, series, tree = two_patches
    assert refusal(series_label, tree) == "vendor/demo is not complete; run `nox -s vendor`"
    vendor_upstream(upstream, sdist, series, tree)
    path = tree / ".git" / STATE_FILE
    text = path.read_text()
    state = json.loads(text)
    assert text == json.dumps(state, indent=2) + "\n"
    assert re.fullmatch(r"p[0-9a-f]{8}", series_label(tree))
    assert series_label(tree) == "p" + state["inputs"][:8]
    assert [p.name for p in path.parent.glob("*.partial")] == []
    # A state file from before `remaining` was recorded still reads.
    del state["remaining"]
    path.write_text(json.dumps(state))
    read = read_state(tree)
    assert read is not None and read.remaining == ()
    path.write_text("[]")
    message = refusal(read_state, tree)
    assert message.startswith(f"{path} is damaged (TypeError: ")
    assert message.endswith(
        "so it is unknown which commits of vendor/demo are patches. Keep what you need "
        "(`git -C vendor/demo log`), then remove vendor/demo and run `nox -s vendor`."
    )


def test_progress_says_whether_a_tree_is_current_or_stale(
    two_patches: Any,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    upstream, sdist, series, tree = two_patches
    vendor_upstream(upstream, sdist, series, tree)
    capsys.readouterr()
    assert not vendor_upstream(upstream, sdist, series, tree)
    assert capsys.readouterr().err == "sm120-build: vendor/demo is current (demo 1.0, 2 patches)\n"
    write_series(series, series / "0001-first.patch")
    assert vendor_upstream(upstream, sdist, series, tree)
    err = capsys.readouterr().err
    assert err.startswith(
        "sm120-build: vendor/demo is stale; rebuilding it from the cached sdist\n"
    )


def test_ten_littered_files_are_all_shown(two_patches: Any) -> None:  # noqa: F811
    upstream, sdist, series, tree = two_patches
    vendor_upstream(upstream, sdist, series, tree)
    for n in range(10):
        (tree / f"f{n}").write_text("x")
    message = refusal(vendor_upstream, upstream, sdist, series, tree)
    assert "  f9\nA rebuild would delete them." in message


def test_an_empty_series_and_a_deep_new_vendor_directory(demo: Any, tmp_path: Path) -> None:
    upstream, sdist, series = demo(LINES)
    tree = tmp_path / "a" / "b" / "vendor" / "demo"
    assert vendor_upstream(upstream, sdist, series, tree)
    state = read_state(tree)
    assert state is not None
    assert (state.complete, state.exact, state.head, state.stopped_at) == (
        True,
        True,
        head(tree),
        None,
    )
    assert state.base == state.head


def test_continue_after_the_last_patch_stopped(three_patches: Any) -> None:  # noqa: F811
    upstream, sdist, series, tree = three_patches
    drifted = [*LINES[:19], "context upstream changed"]
    make_patch(series / "0003-third.patch", "src/code.txt", drifted, 17, "LINE 18", "third")
    with pytest.raises(UserError, match=r"0003-third\.patch does not apply"):
        vendor_upstream(upstream, sdist, series, tree)
    commit_refresh(tree, "third", "line 18", "LINE 18")
    continue_series(upstream, series, tree)
    state = read_state(tree)
    assert state is not None and state.complete and state.head == head(tree)


def test_continue_refuses_a_run_interrupted_before_its_first_patch(
    two_patches: Any,  # noqa: F811
) -> None:
    upstream, sdist, series, tree = two_patches
    vendor_upstream(upstream, sdist, series, tree)
    path = tree / ".git" / STATE_FILE
    state = json.loads(path.read_text())
    path.write_text(json.dumps({**state, "complete": False, "stopped_at": None}))
    assert refusal(continue_series, upstream, series, tree) == (
        "vendor/demo did not stop part-way through its series; nothing to continue"
    )


def test_a_stacks_tree_is_named_with_its_stack(two_patches: Any, tmp_path: Path) -> None:  # noqa: F811
    """A tree of stacks/<stack>/ is named so, and every command it suggests names the stack:
    the default stack's commands would act on another tree."""
    upstream, sdist, series, _ = two_patches
    tree = tmp_path / "stacks" / "sglang-9.9" / "vendor" / "demo"
    drifted = [*LINES[:3], "drifted", *LINES[4:]]
    make_patch(series / "0001-first.patch", "src/code.txt", drifted, 1, "LINE 2", "first change")
    message = refusal(vendor_upstream, upstream, sdist, series, tree)
    assert message.startswith(f"{series / '0001-first.patch'} does not apply to ")
    assert "stacks/sglang-9.9/vendor/demo is left at the last patch that applied" in message
    assert "`nox -s vendor -- --continue demo --stack sglang-9.9`" in message
    assert "`nox -s export_patches -- --stack sglang-9.9`" in message
