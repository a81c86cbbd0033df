"""The classification's small parts, in process: a patch's verdict from its hunks' (the
table that decides keep, refresh, review or drop), git's per-hunk offsets across files, the
function a hunk header names, and the words of a conflict's detail."""

from __future__ import annotations

from pathlib import Path

import pytest

from sm120_build.bump.classify import (
    ACTIONS,
    HunkVerdict,
    PatchVerdict,
    _function_of,
    _meaningful,
    _patch_verdict,
    _per_hunk_offsets,
    _where_it_differs,
    classify_hunk,
    classify_patch,
)
from sm120_build.gitrepo import git
from sm120_build.patches import Hunk, Patch, hunks_of


def file_header(name: str) -> str:
    return f"diff --git a/{name} b/{name}\n--- a/{name}\n+++ b/{name}\n"


def one_hunk(name: str, text: str) -> Hunk:
    """The hunk `text` (from its @@ line on) of a diff of the file `name`."""
    (hunk,) = hunks_of(file_header(name) + text)
    return hunk


# A gate lifted in a.py: the hunk of the conflict tests.
ALLOWED = one_hunk(
    "a.py",
    "@@ -1,2 +1,2 @@\n def allowed(major):\n-    return major in (9, 10)\n+    return True\n",
)


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
        file_header(name) + "".join(f"@@ -{n},1 +{n},1 @@\n-x\n+y\n" for n in starts)
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
        # The context itself may hold '@@' (a string, a comment): it is kept whole.
        (
            '@@ -1,2 +1,2 @@ void f(const char *s = "@@ x @@") {',
            'void f(const char *s = "@@ x @@")',
        ),
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
    hunk = one_hunk("a.py", f"@@ -1,3 +1,3 @@\n {long}\n-    {expected}\n+    value = 1\n")
    assert _where_it_differs(hunk, target) == (
        f"context {'x' * 50!r} is at a.py:2; at line 3 the hunk expects {expected[:60]!r}, "
        f"the candidate has {found[:60]!r}"
    )
    assert len(expected) > 60 and len(found) > 60


def test_a_conflict_whose_file_ended_says_so(tmp_path: Path) -> None:
    target = tmp_path / "a.py"
    target.write_text("def allowed(major):\n")
    assert _where_it_differs(ALLOWED, target).endswith(
        "at line 2 the hunk expects 'return major in (9, 10)', the candidate has '<end of file>'"
    )


def test_a_conflict_whose_first_context_line_is_gone_is_placed_by_the_next(
    tmp_path: Path,
) -> None:
    """The first context line is nowhere in the candidate: the second one places the hunk,
    and the comparison starts one line above it."""
    hunk = one_hunk(
        "a.py",
        "@@ -1,3 +1,3 @@\n # a comment upstream removed\n def allowed(major):\n"
        "-    return major in (9, 10)\n+    return True\n",
    )
    target = tmp_path / "a.py"
    target.write_bytes(b"# caf\xe9, not UTF-8\nimport os\ndef allowed(major):\n    return False\n")
    assert _where_it_differs(hunk, target) == (
        "context 'def allowed(major):' is at a.py:3; at line 2 the hunk expects "
        "'# a comment upstream removed', the candidate has 'import os'"
    )


def test_a_conflict_in_a_re_indented_file_names_the_line_and_says_so(tmp_path: Path) -> None:
    target = tmp_path / "a.py"
    target.write_text("class Gate:\n    def allowed(major):\n        return major in (9, 10)\n")
    assert _where_it_differs(ALLOWED, target) == (
        "its context line 'def allowed(major):' is at a.py:2, indented otherwise; the "
        "candidate's file was re-indented there"
    )
    long = "value = 'a context line longer than fifty characters, cut short'"
    hunk = one_hunk("a.py", f"@@ -1,2 +1,2 @@\n {long}\n-x = 1\n+x = 2\n")
    target.write_text(f"if True:\n    {long}\n")
    assert _where_it_differs(hunk, target) == (
        f"its context line {long[:50]!r} is at a.py:2, indented otherwise; the "
        "candidate's file was re-indented there"
    )
    target.write_text("nothing of it\n")
    assert _where_it_differs(ALLOWED, target) == (
        "none of the hunk's context lines is in the candidate's a.py"
    )


LINES = [f"line {n} of the file" for n in range(1, 13)]


def hunk_on(old: list[str], new: list[str], start: int = 1) -> Hunk:
    """One hunk of a.txt that turns `old` into `new`, the two sharing their first and
    last line as context."""
    body = [f" {old[0]}", *(f"-{line}" for line in old[1:-1]), *(f"+{line}" for line in new[1:-1])]
    body.append(f" {old[-1]}")
    header = f"@@ -{start},{len(old)} +{start},{len(new)} @@"
    return one_hunk("a.txt", "\n".join([header, *body]) + "\n")


def tree_with(tmp_path: Path, lines: list[str] | None) -> Path:
    tree = tmp_path / "tree"
    tree.mkdir()
    git(tree, "init", "--quiet")
    if lines is not None:
        (tree / "a.txt").write_text("".join(f"{line}\n" for line in lines))
    return tree


CHANGE = hunk_on(LINES[0:3], [LINES[0], "line 2, changed", LINES[2]])
HEADER = "@@ -1,3 +1,3 @@"


@pytest.mark.parametrize(
    ("lines", "verdict"),
    [
        (LINES, HunkVerdict("a.txt", HEADER, "clean")),
        (
            [LINES[0], "line 2, changed", *LINES[2:]],
            HunkVerdict("a.txt", HEADER, "upstream"),
        ),
        (None, HunkVerdict("a.txt", HEADER, "conflict", detail="file not found")),
        (
            ["other", "line 2, changed", "more", "and more", *LINES[5:]],
            HunkVerdict(
                "a.txt",
                HEADER,
                "upstream in another form",
                detail="the lines it removes are gone from the file and the lines it adds are "
                "there",
            ),
        ),
        (
            ["other", "rewritten", "more", "and more", *LINES[5:]],
            HunkVerdict(
                "a.txt",
                HEADER,
                "conflict",
                detail="the lines it removes are gone from the file and the lines it adds are "
                "not there: the code was rewritten; refresh the patch by hand",
            ),
        ),
    ],
)
def test_each_hunk_verdict_whole(
    tmp_path: Path, lines: list[str] | None, verdict: HunkVerdict
) -> None:
    assert classify_hunk(tree_with(tmp_path, lines), CHANGE) == verdict


def test_a_hunk_that_only_adds_lines_already_elsewhere_is_upstream_in_another_form(
    tmp_path: Path,
) -> None:
    adds = hunk_on([LINES[0], LINES[1]], [LINES[0], "    the added line", LINES[1]])
    lines = [*LINES[:5], "the added line", "x", *LINES[5:]]
    lines[1] = "line 2 of the file, edited so the hunk cannot apply"
    assert classify_hunk(tree_with(tmp_path, lines), adds) == HunkVerdict(
        "a.txt",
        "@@ -1,2 +1,3 @@",
        "upstream in another form",
        detail="the lines it adds are there, in another place or indentation",
    )


def test_a_fuzzed_hunk_says_where_it_lands(tmp_path: Path) -> None:
    wide = one_hunk(
        "a.txt",
        "@@ -5,5 +5,5 @@\n"
        f" {LINES[4]}\n {LINES[5]}\n-{LINES[6]}\n+line 7, changed\n {LINES[7]}\n {LINES[8]}\n",
    )
    lines = list(LINES)
    lines[4] = "line 5, its outer context, changed upstream"
    verdict = classify_hunk(tree_with(tmp_path, lines), wide)
    assert verdict == HunkVerdict(
        "a.txt",
        "@@ -5,5 +5,5 @@",
        "fuzz",
        # git's default function context for a file of no known language: the nearest line
        # above that starts with a letter
        detail="applies only with 1 line of context, at line 7 of a.txt, in line 6 of the file",
    )


def test_a_moved_hunk_is_an_offset_by_so_many_lines(tmp_path: Path) -> None:
    # Not at line 1: git anchors a hunk that starts there to the file's beginning.
    moved = hunk_on(LINES[4:7], [LINES[4], "line 6, changed", LINES[6]], start=5)
    tree = tree_with(tmp_path, ["new first", "new second", *LINES])
    assert classify_hunk(tree, moved) == HunkVerdict("a.txt", "@@ -5,3 +5,3 @@", "offset", 2)


def test_a_fuzzed_hunk_outside_any_function_in_a_subdirectory_says_only_the_line(
    tmp_path: Path,
) -> None:
    """No line above the change starts a function (each is indented): the detail names the
    line and the file, and no function."""
    indented = [f"  {line}" for line in LINES]
    wide = one_hunk(
        "sub/dir/a.txt",
        "@@ -5,5 +5,5 @@\n"
        + "".join(f" {line}\n" for line in indented[4:6])
        + f"-{indented[6]}\n+  line 7, changed\n"
        + "".join(f" {line}\n" for line in indented[7:9]),
    )
    tree = tmp_path / "tree"
    (tree / "sub" / "dir").mkdir(parents=True)
    git(tree, "init", "--quiet")
    indented[4] = "  line 5, its outer context, changed upstream"
    (tree / "sub" / "dir" / "a.txt").write_text("".join(f"{line}\n" for line in indented))
    assert classify_hunk(tree, wide).detail == (
        "applies only with 1 line of context, at line 7 of sub/dir/a.txt"
    )


def test_a_fuzzed_hunk_that_lands_in_another_function_says_so(tmp_path: Path) -> None:
    """The patch's gate is in gen_sm90; upstream rewrote that function, and only the one
    line of context around the change still matches, in gen_sm89: git would apply it there."""
    gate = one_hunk(
        "gen.py",
        "@@ -2,5 +2,5 @@ def gen_sm90():\n"
        "     flags = common()\n     nvcc = find()\n-    return arch(9)\n+    return arch(12)\n"
        "     done = 1\n     end = 2\n",
    )
    tree = tmp_path / "tree"
    tree.mkdir()
    git(tree, "init", "--quiet")
    (tree / "gen.py").write_text(
        "def gen_sm90():\n    flags = other()\n    nvcc = elsewhere()\n    return arch(9)\n"
        "    done = 0\n    end = 2\n"
        "def gen_sm89():\n    flags = changed()\n    nvcc = find()\n    return arch(9)\n"
        "    done = 1\n    end = 3\n"
    )
    assert classify_hunk(tree, gate) == HunkVerdict(
        "gen.py",
        "@@ -2,5 +2,5 @@",
        "fuzz",
        detail="applies only with 1 line of context, at line 10 of gen.py, in def gen_sm89(): "
        "NOT in def gen_sm90(), where the patch made it",
    )


def patch_of(tmp_path: Path, diff: str) -> Patch:
    path = tmp_path / "0001-lift.patch"
    path.write_text(diff)
    return Patch(path, "", diff)


def text_of(tree: Path) -> list[str]:
    return (tree / "a.txt").read_text().splitlines()


GATE = "    if (major < 12) return false;"
LIFTED = "    if (major < 13) return false;"


def gate_hunk(start: int, name: str) -> str:
    """A hunk lifting the gate of function `name`, whose body starts at line `start`."""
    return f"@@ -{start},3 +{start},3 @@\n void {name}() {{\n-{GATE}\n+{LIFTED}\n }}\n"


def gates(*lifted: bool) -> list[str]:
    lines = []
    for n, done in enumerate(lifted):
        lines += [f"void f{n}() {{", LIFTED if done else GATE, "}", f"// between {n}"]
    return lines


def both_gates(verdict: str, action: str) -> PatchVerdict:
    """The verdict on the two-gate patch whose hunks both got `verdict`."""
    hunks = [HunkVerdict("a.txt", f"@@ -{n},3 +{n},3 @@", verdict) for n in (1, 5)]
    return PatchVerdict("0001-lift.patch", verdict, action, hunks)


def test_a_whole_patch_that_applies_is_applied_hunk_by_hunk_clean_or_offset(
    tmp_path: Path,
) -> None:
    diff = file_header("a.txt") + gate_hunk(1, "f0") + gate_hunk(5, "f1")
    tree = tree_with(tmp_path, gates(False, False))
    verdict = classify_patch(tree, patch_of(tmp_path, diff))
    assert verdict == both_gates("clean", "keep")
    assert text_of(tree) == gates(True, True)
    # Two lines more above the second function: that hunk moved, the first did not.
    (tmp_path / "moved").mkdir()
    lines = gates(False, False)
    tree = tree_with(tmp_path / "moved", [*lines[:4], "// new", "// new", *lines[4:]])
    verdict = classify_patch(tree, patch_of(tmp_path, diff))
    assert (verdict.verdict, verdict.action) == ("offset", "keep")
    assert [(h.verdict, h.offset) for h in verdict.hunks] == [("clean", 0), ("offset", 2)]
    assert LIFTED in text_of(tree)[1] and text_of(tree)[7] == LIFTED


def test_only_a_whole_patch_that_reverse_applies_is_upstream(tmp_path: Path) -> None:
    diff = file_header("a.txt") + gate_hunk(1, "f0") + gate_hunk(5, "f1")
    tree = tree_with(tmp_path, gates(True, True))
    verdict = classify_patch(tree, patch_of(tmp_path, diff))
    assert verdict == both_gates("upstream", "drop")
    assert text_of(tree) == gates(True, True)  # nothing applied


def test_identical_hunks_that_each_reverse_apply_alone_are_not_upstream_while_a_gate_stands(
    tmp_path: Path,
) -> None:
    """0001 was dropped when each of its textually identical hunks reverse-applied alone
    (each found the one gate upstream had lifted) while another gate was still there."""
    same = "@@ -1,3 +1,3 @@\n {\n-" + GATE + "\n+" + LIFTED + "\n }\n"
    diff = file_header("a.txt") + same + same.replace("-1,3 +1,3", "-5,3 +5,3")
    tree = tree_with(tmp_path, ["{", LIFTED, "}", "//", "{", GATE, "}"])
    verdict = classify_patch(tree, patch_of(tmp_path, diff))
    # Each hunk alone finds the lifted gate; the patch is refreshed by hand, not dropped.
    assert (verdict.verdict, verdict.action) == ("partly upstream", "refresh")
    assert [h.verdict for h in verdict.hunks] == ["upstream", "upstream"]
    assert text_of(tree) == ["{", LIFTED, "}", "//", "{", GATE, "}"]


def test_a_fuzzed_hunk_is_applied_with_one_line_of_context(tmp_path: Path) -> None:
    wide = (
        file_header("a.txt")
        + "@@ -5,5 +5,5 @@\n"
        + f" {LINES[4]}\n {LINES[5]}\n-{LINES[6]}\n+line 7, changed\n {LINES[7]}\n {LINES[8]}\n"
    )
    lines = list(LINES)
    lines[4] = "line 5, its outer context, changed upstream"
    tree = tree_with(tmp_path, lines)
    verdict = classify_patch(tree, patch_of(tmp_path, wide))
    assert (verdict.verdict, verdict.action) == ("fuzz", "refresh")
    assert text_of(tree)[6] == "line 7, changed"


def test_a_partly_upstream_patch_still_applies_the_hunks_that_apply(tmp_path: Path) -> None:
    """Clean or moved: the hunks that apply are applied, for the refresh to start from."""
    diff = file_header("a.txt") + gate_hunk(1, "f0") + gate_hunk(5, "f1")
    tree = tree_with(tmp_path, gates(True, False))
    verdict = classify_patch(tree, patch_of(tmp_path, diff))
    assert (verdict.verdict, verdict.action) == ("partly upstream", "refresh")
    assert [h.verdict for h in verdict.hunks] == ["upstream", "clean"]
    assert text_of(tree) == gates(True, True)
    lines = gates(True, False)
    (tmp_path / "moved").mkdir()
    moved = tree_with(tmp_path / "moved", [*lines[:4], "// new", *lines[4:]])
    verdict = classify_patch(moved, patch_of(tmp_path, diff))
    assert [(h.verdict, h.offset) for h in verdict.hunks] == [("upstream", 0), ("offset", 1)]
    assert text_of(moved)[6] == LIFTED
