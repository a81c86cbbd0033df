"""The classification's small parts, in process: a patch's verdict from its hunks' (the
table that decides keep, refresh, review or drop), git's per-hunk offsets across files, the
function a hunk header names, and the words of a conflict's detail."""

from __future__ import annotations

from pathlib import Path

import pytest

from sm120_build.bump.classify import (
    ACTIONS,
    HunkVerdict,
    _function_of,
    _meaningful,
    _patch_verdict,
    _per_hunk_offsets,
    _where_it_differs,
)
from sm120_build.patches import hunks_of


@pytest.mark.parametrize(
    ("hunks", "patch"),
    [
        ([], "clean"),
        (["clean", "clean"], "clean"),
        (["offset"], "offset"),
        (["clean", "offset"], "offset"),
        (["upstream", "upstream"], "partly upstream"),
        (["upstream in another form"], "upstream in another form"),
        (["upstream", "upstream in another form"], "upstream in another form"),
        (["conflict"], "conflict"),
        (["clean", "conflict"], "conflict"),
        (["clean", "upstream in another form"], "conflict"),
        (["upstream", "conflict"], "conflict"),
        (["clean", "upstream"], "partly upstream"),
        (["fuzz", "upstream"], "partly upstream"),
        (["fuzz"], "fuzz"),
        (["clean", "offset", "fuzz"], "fuzz"),
    ],
)
def test_a_patch_s_verdict_follows_from_its_hunks(hunks: list[str], patch: str) -> None:
    assert _patch_verdict([HunkVerdict("f", "@@", verdict) for verdict in hunks]) == patch


def test_each_verdict_has_its_action() -> None:
    assert ACTIONS == {
        "clean": "keep",
        "offset": "keep",
        "fuzz": "refresh",
        "partly upstream": "refresh",
        "upstream": "drop",
        "upstream in another form": "review",
        "conflict": "refresh",
    }


def test_offsets_are_read_per_hunk_and_per_file_in_order() -> None:
    diff = "".join(
        f"diff --git a/{name} b/{name}\n--- a/{name}\n+++ b/{name}\n"
        + "".join(f"@@ -{n},1 +{n},1 @@\n-x\n+y\n" for n in starts)
        for name, starts in (("a.py", (1, 10, 20)), ("b.cu", (5,)))
    )
    output = (
        "Checking patch a.py...\n"
        "Hunk #2 succeeded at 13 (offset 3 lines).\n"
        "Hunk #3 succeeded at 19 (offset -1 line).\n"
        "Checking patch b.cu...\n"
        "Hunk #1 succeeded at 4 (offset -1 line).\n"
        "Applied patch a.py cleanly.\n"
    )
    assert _per_hunk_offsets(output, hunks_of(diff)) == [0, 3, -1, -1]
    assert _per_hunk_offsets("", hunks_of(diff)) == [0, 0, 0, 0]


@pytest.mark.parametrize(
    ("header", "function"),
    [
        ("@@ -1,2 +1,2 @@ def allowed(major):", "def allowed(major)"),
        ("@@ -1,2 +1,2 @@ void launch(int n) {", "void launch(int n)"),
        ("@@ -1,2 +1,2 @@   class Gate:  ", "class Gate"),
        ("@@ -1,2 +1,2 @@", ""),
        ("@@ -1,2 +1,2", ""),
    ],
)
def test_the_function_a_hunk_header_names(header: str, function: str) -> None:
    assert _function_of(header) == function


def test_only_lines_that_say_something_are_meaningful() -> None:
    assert _meaningful(["  }", "{", "  x = 1", "    return major", "ab", "abc "]) == [
        "return major",
        "abc",
    ]


def test_a_conflict_says_where_the_context_moved_and_the_first_line_that_differs_cut_short(
    tmp_path: Path,
) -> None:
    long = "x" * 80
    expected = "value = 'what the hunk expects, at a length past sixty characters'"
    found = "value = 'something else entirely, also past sixty characters long'"
    target = tmp_path / "a.py"
    target.write_text(f"header\n{long}\n    {found}\n")
    diff = (
        "diff --git a/a.py b/a.py\n--- a/a.py\n+++ b/a.py\n"
        f"@@ -1,3 +1,3 @@\n {long}\n-    {expected}\n+    value = 1\n"
    )
    (hunk,) = hunks_of(diff)
    assert _where_it_differs(hunk, target) == (
        f"context {'x' * 50!r} is at a.py:2; at line 3 the hunk expects {expected[:60]!r}, "
        f"the candidate has {found[:60]!r}"
    )
    assert len(expected) > 60 and len(found) > 60


def test_a_conflict_whose_file_ended_says_so(tmp_path: Path) -> None:
    target = tmp_path / "a.py"
    target.write_text("def allowed(major):\n")
    diff = (
        "diff --git a/a.py b/a.py\n--- a/a.py\n+++ b/a.py\n"
        "@@ -1,2 +1,2 @@\n def allowed(major):\n-    return major in (9, 10)\n"
        "+    return True\n"
    )
    (hunk,) = hunks_of(diff)
    assert _where_it_differs(hunk, target).endswith(
        "at line 2 the hunk expects 'return major in (9, 10)', the candidate has '<end of file>'"
    )


def test_a_conflict_in_a_re_indented_file_names_the_line_and_says_so(tmp_path: Path) -> None:
    target = tmp_path / "a.py"
    target.write_text("class Gate:\n    def allowed(major):\n        return major in (9, 10)\n")
    diff = (
        "diff --git a/a.py b/a.py\n--- a/a.py\n+++ b/a.py\n"
        "@@ -1,2 +1,2 @@\n def allowed(major):\n-    return major in (9, 10)\n+    return True\n"
    )
    (hunk,) = hunks_of(diff)
    assert _where_it_differs(hunk, target) == (
        "its context line 'def allowed(major):' is at a.py:2, indented otherwise; the "
        "candidate's file was re-indented there"
    )
    target.write_text("nothing of it\n")
    assert _where_it_differs(hunk, target) == (
        "none of the hunk's context lines is in the candidate's a.py"
    )
