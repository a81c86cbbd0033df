"""The bump classifier on fixture trees: every class, with real `git apply`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from sm120_build.bump import (
    Candidate,
    GateSummary,
    PatchVerdict,
    _git_commit,
    classify_series,
    companion_hashes,
    pin_set_problems,
    verdict,
)
from sm120_build.errors import UserError
from sm120_build.gitrepo import git
from sm120_build.patches import read_patch
from sm120_build.pins import load as load_pins

from .conftest import HEADER, REPO

LINES = [f"line {n}" for n in range(1, 41)]


def hunk(file: str, lines: list[str], index: int, new: str) -> str:
    """A one-line change of lines[index] with three lines of context, as a file section."""
    start, end = max(0, index - 3), min(len(lines), index + 4)
    body = [(" " if n != index else "-") + lines[n] for n in range(start, end)]
    body.insert(index - start + 1, "+" + new)
    count = end - start
    return f"@@ -{start + 1},{count} +{start + 1},{count} @@\n" + "\n".join(body) + "\n"


def patch_file(directory: Path, name: str, sections: dict[str, list[str]]) -> Path:
    """A patch with, per file, the given hunks (texts from hunk())."""
    text = HEADER.format(subject=name) + "\n"
    for file, hunks in sections.items():
        text += f"diff --git a/{file} b/{file}\n--- a/{file}\n+++ b/{file}\n" + "".join(hunks)
    path = directory / f"{name}.patch"
    path.write_text(text)
    return path


@pytest.fixture
def tree(tmp_path: Path) -> Any:
    """A git tree holding files a.txt and b.txt, each with `lines`."""

    def create(a: list[str], b: list[str] | None = None) -> Path:
        root = tmp_path / "tree"
        root.mkdir()
        (root / "a.txt").write_text("\n".join(a) + "\n")
        (root / "b.txt").write_text("\n".join(b or LINES) + "\n")
        git(root, "init", "-q")
        git(root, "add", ".")
        git(root, "commit", "-qm", "base")
        return root

    return create


def verdict_of(tree_path: Path, *paths: Path) -> list[PatchVerdict]:
    return classify_series(tree_path, [read_patch(p) for p in paths])


def test_clean(tree: Any, tmp_path: Path) -> None:
    root = tree(LINES)
    patch = patch_file(tmp_path, "p", {"a.txt": [hunk("a.txt", LINES, 10, "LINE 11")]})
    (result,) = verdict_of(root, patch)
    assert (result.verdict, result.action) == ("clean", "keep")
    assert "LINE 11" in (root / "a.txt").read_text()  # applied, for the patches after it


def test_offset_is_reported_per_hunk(tree: Any, tmp_path: Path) -> None:
    root = tree(["new 1", "new 2", "new 3", *LINES])
    patch = patch_file(
        tmp_path,
        "p",
        {"a.txt": [hunk("a.txt", LINES, 10, "LINE 11"), hunk("a.txt", LINES, 30, "LINE 31")]},
    )
    (result,) = verdict_of(root, patch)
    assert (result.verdict, result.action) == ("offset", "keep")
    assert [(h.verdict, h.offset) for h in result.hunks] == [("offset", 3), ("offset", 3)]


def test_fuzz_is_named_and_refused(tree: Any, tmp_path: Path) -> None:
    changed = list(LINES)
    changed[7] = "line 8 (edited upstream)"  # the outermost context line of the hunk
    root = tree(changed)
    patch = patch_file(tmp_path, "p", {"a.txt": [hunk("a.txt", LINES, 10, "LINE 11")]})
    (result,) = verdict_of(root, patch)
    assert (result.verdict, result.action) == ("fuzz", "refresh")
    assert result.hunks[0].verdict == "fuzz"


def test_already_upstream_whole(tree: Any, tmp_path: Path) -> None:
    done = list(LINES)
    done[10] = "LINE 11"
    root = tree(done)
    patch = patch_file(tmp_path, "p", {"a.txt": [hunk("a.txt", LINES, 10, "LINE 11")]})
    (result,) = verdict_of(root, patch)
    assert (result.verdict, result.action) == ("upstream", "drop")


def test_partly_upstream(tree: Any, tmp_path: Path) -> None:
    done = list(LINES)
    done[10] = "LINE 11"
    root = tree(done)
    patch = patch_file(
        tmp_path,
        "p",
        {"a.txt": [hunk("a.txt", LINES, 10, "LINE 11"), hunk("a.txt", LINES, 30, "LINE 31")]},
    )
    (result,) = verdict_of(root, patch)
    assert (result.verdict, result.action) == ("partly upstream", "refresh")
    assert [h.verdict for h in result.hunks] == ["upstream", "clean"]
    assert "LINE 31" in (root / "a.txt").read_text()


def test_upstream_in_another_form(tree: Any, tmp_path: Path) -> None:
    """The line the patch removes is gone and the line it adds is there, moved and
    re-indented: evidence to review, with a detail that says exactly that."""
    moved = [*LINES[:10], *LINES[11:20], "    LINE 11", *LINES[20:]]
    root = tree(moved)
    patch = patch_file(tmp_path, "p", {"a.txt": [hunk("a.txt", LINES, 10, "LINE 11")]})
    (result,) = verdict_of(root, patch)
    assert (result.verdict, result.action) == ("upstream in another form", "review")
    assert result.hunks[0].detail == (
        "the lines it removes are gone from the file and the lines it adds are there"
    )


def test_removed_lines_gone_alone_are_a_conflict_not_upstream(tree: Any, tmp_path: Path) -> None:
    """Upstream rewrote the line its own way: the patch's line is not there, so nothing says
    the change is upstream (it used to be reported "upstream in another form")."""
    rewritten = list(LINES)
    rewritten[10] = "line eleven, fixed upstream their own way"
    root = tree(rewritten)
    patch = patch_file(tmp_path, "p", {"a.txt": [hunk("a.txt", LINES, 10, "LINE 11")]})
    (result,) = verdict_of(root, patch)
    assert (result.verdict, result.action) == ("conflict", "refresh")
    assert result.hunks[0].detail == (
        "the lines it removes are gone from the file and the lines it adds are not there: "
        "the code was rewritten; refresh the patch by hand"
    )


def test_conflict_lists_every_failing_hunk_and_file(tree: Any, tmp_path: Path) -> None:
    drifted = list(LINES)
    drifted[9] = "line 10 (changed upstream)"  # inner context: beyond any fuzz
    drifted[29] = "line 30 (changed upstream)"
    root = tree(drifted, drifted)
    patch = patch_file(
        tmp_path,
        "p",
        {
            "a.txt": [hunk("a.txt", LINES, 10, "LINE 11"), hunk("a.txt", LINES, 30, "LINE 31")],
            "b.txt": [hunk("b.txt", LINES, 20, "LINE 21"), hunk("b.txt", LINES, 30, "LINE 31")],
        },
    )
    (result,) = verdict_of(root, patch)
    assert (result.verdict, result.action) == ("conflict", "refresh")
    assert [(h.file, h.hunk, h.verdict) for h in result.failing] == [
        ("a.txt", "@@ -8,7 +8,7 @@", "conflict"),
        ("a.txt", "@@ -28,7 +28,7 @@", "conflict"),
        ("b.txt", "@@ -28,7 +28,7 @@", "conflict"),
    ]
    assert [h.verdict for h in result.hunks if h.file == "b.txt"] == ["clean", "conflict"]


def test_the_series_goes_on_past_a_failure(tree: Any, tmp_path: Path) -> None:
    drifted = list(LINES)
    drifted[9] = "line 10 (changed upstream)"
    root = tree(drifted)
    first = patch_file(tmp_path, "0001", {"a.txt": [hunk("a.txt", LINES, 10, "LINE 11")]})
    second = patch_file(tmp_path, "0002", {"a.txt": [hunk("a.txt", LINES, 30, "LINE 31")]})
    results = verdict_of(root, first, second)
    assert [r.verdict for r in results] == ["conflict", "clean"]


def test_a_vanished_hunk_beside_applying_ones_is_a_conflict_to_refresh(
    tree: Any, tmp_path: Path
) -> None:
    """Not dropped: only part of the patch's change is gone from upstream."""
    rewritten = list(LINES)
    rewritten[10] = "line eleven, rewritten upstream"
    root = tree(rewritten)
    patch = patch_file(
        tmp_path,
        "p",
        {"a.txt": [hunk("a.txt", LINES, 10, "LINE 11"), hunk("a.txt", LINES, 30, "LINE 31")]},
    )
    (result,) = verdict_of(root, patch)
    assert (result.verdict, result.action) == ("conflict", "refresh")
    assert [h.verdict for h in result.failing] == ["conflict"]


def test_an_add_only_hunk_already_upstream_is_upstream_not_offset(
    tree: Any, tmp_path: Path
) -> None:
    """A hunk that only adds lines still applies forward when upstream has them already
    (and would add them twice): it reverse-applies, so it is upstream."""
    added = [*LINES[:10], "ADDED", *LINES[10:]]
    root = tree(added)
    body = "".join(f" {line}\n" for line in LINES[7:10]) + "+ADDED\n"
    body += "".join(f" {line}\n" for line in LINES[10:13])
    patch = patch_file(tmp_path, "p", {"a.txt": ["@@ -8,6 +8,7 @@\n" + body]})
    (result,) = verdict_of(root, patch)
    assert [h.verdict for h in result.hunks] == ["upstream"]
    assert (result.verdict, result.action) == ("upstream", "drop")
    assert (root / "a.txt").read_text().count("ADDED") == 1  # not applied a second time


def test_a_conflict_says_where_the_context_went(tree: Any, tmp_path: Path) -> None:
    drifted = [f"new {n}" for n in range(5)] + list(LINES)
    drifted[5 + 9] = "line 10 (changed upstream)"
    root = tree(drifted)
    patch = patch_file(tmp_path, "p", {"a.txt": [hunk("a.txt", LINES, 10, "LINE 11")]})
    (result,) = verdict_of(root, patch)
    (failing,) = result.failing
    assert "'line 8' is at a.txt:13" in failing.detail
    assert "expects 'line 10', the candidate has 'line 10 (changed upstream)'" in failing.detail


def test_the_exit_status_carries_the_verdict() -> None:
    demo = load_pins(REPO / "pins.toml").upstream("flashinfer")
    clean = Candidate(
        demo, [PatchVerdict("a", "clean", "keep", []), PatchVerdict("b", "upstream", "drop", [])]
    )
    assert verdict([clean], [])[0] == 0
    refresh = Candidate(demo, [PatchVerdict("a", "conflict", "refresh", [])])
    assert verdict([refresh], [])[0] == 1
    gated = Candidate(demo, [], audit=GateSummary([], {}, [], gates=2))
    assert verdict([gated], [])[0] == 1
    assert verdict([clean], ["sglang 0.5.10 requires flashinfer-python==0.6.7.post2"])[0] == 2


def test_an_incoherent_pin_set_names_the_pair_to_ask_for() -> None:
    """sglang 0.5.10 pins flashinfer_python==0.6.7.post2: asking for sglang alone used to
    write sglang 0.5.10 beside FlashInfer 0.6.3 and exit 0."""
    pins = load_pins(REPO / "pins.toml")
    sglang = replace(pins.upstream("sglang"), version="0.5.10")
    candidate = Candidate(
        sglang, requires={"flashinfer-python": Requirement("flashinfer_python==0.6.7.post2")}
    )
    (problem,) = pin_set_problems([candidate], pins, {})
    assert problem.endswith("ask for: sglang==0.5.10 flashinfer-python==0.6.7.post2")
    # The other way round, from the pinned sglang's own metadata (no vendor tree needed).
    flashinfer = Candidate(replace(pins.upstream("flashinfer"), version="0.6.4"))
    pinned = {"flashinfer-python": Requirement("flashinfer_python==0.6.3")}
    assert pin_set_problems([flashinfer], pins, pinned)
    assert not pin_set_problems([Candidate(pins.upstream("flashinfer"))], pins, pinned)


def test_the_recorded_git_commit_is_read_in_either_spelling(tmp_path: Path) -> None:
    """0.6.17's _build_meta.py records __git_commit__; only __git_version__ was read."""
    meta = tmp_path / "flashinfer" / "_build_meta.py"
    meta.parent.mkdir()
    meta.write_text('__version__ = "0.6.17"\n__git_commit__ = "0123abcd"\n')
    assert _git_commit(tmp_path) == "0123abcd"
    meta.write_text('__version__ = "0.6.3"\n__git_version__ = "d0886ce2"\n')
    assert _git_commit(tmp_path) == "d0886ce2"


def test_a_missing_cubin_says_what_the_index_has_and_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--write used to stop with pip's bare error when the index lacked the cubin."""
    links = tmp_path / "links"
    links.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    with pytest.raises(UserError, match=r"the index has no flashinfer-cubin==0\.6\.17 \(it has"):
        companion_hashes("flashinfer-cubin", "0.6.17", tmp_path / "out")
    with pytest.raises(UserError, match=r"Publish a flashinfer-cubin 0\.6\.17 wheel.*Nothing was"):
        companion_hashes("flashinfer-cubin", "0.6.17", tmp_path / "out")


def test_identical_hunks_that_each_reverse_apply_alone_are_not_upstream(
    tree: Any, tmp_path: Path
) -> None:
    """Two textually identical hunks (the same gate in two functions): upstream lifted one,
    so each hunk alone reverse-applies at that one place; the whole patch does not, and one
    gate is still there. It used to be reported upstream and dropped."""
    block = ["void f() {", "#if ARCH < 1200", "  wait();", "#endif", "}"]
    lines = [*block, *[f"filler {n}" for n in range(10)], *block]
    lifted = [*block[:1], "#if ARCH >= 900", *block[2:], *lines[5:]]
    root = tree(lifted)
    one = "@@ -1,5 +1,5 @@\n void f() {\n-#if ARCH < 1200\n+#if ARCH >= 900\n"
    one += "   wait();\n #endif\n }\n"
    two = one.replace("@@ -1,5 +1,5 @@", "@@ -16,5 +16,5 @@")
    patch = patch_file(tmp_path, "p", {"a.txt": [one, two]})
    (result,) = verdict_of(root, patch)
    assert [h.verdict for h in result.hunks] == ["upstream", "upstream"]
    assert (result.verdict, result.action) == ("partly upstream", "refresh")
    assert (root / "a.txt").read_text().count("ARCH < 1200") == 1


def test_a_fuzzed_hunk_says_where_it_lands_by_function(tree: Any, tmp_path: Path) -> None:
    """Upstream changed the hunk's inner context in its own function; with fuzz it lands in
    another function of the same shape (FlashInfer's sm89 generator, seen on 0.7.4). The
    report names where it lands, and that this is not where the patch made it."""

    def generator(name: str, cflags: str) -> list[str]:
        body = ["    nvcc_flags = []", f"    cflags = {cflags}", "    archs = [9, 10]"]
        return [f"def {name}():", *body, "    return archs", "    # end", ""]

    original = generator("gen_comm", "[]") + generator("gen_sm89", "[]")
    candidate = generator("gen_comm", "['-O3']") + generator("gen_sm89", "[]")
    root = tree(original)
    (root / "gen.py").write_text("\n".join(candidate) + "\n")
    body = "".join(f" {line}\n" for line in original[:3])
    body += "-    archs = [9, 10]\n+    archs = [9, 10, 12]\n"
    body += "".join(f" {line}\n" for line in original[4:7])
    patch = patch_file(tmp_path, "p", {"gen.py": ["@@ -1,7 +1,7 @@ def gen_comm():\n" + body]})
    (result,) = verdict_of(root, patch)
    (fuzzed,) = result.hunks
    assert fuzzed.verdict == "fuzz", fuzzed
    assert fuzzed.detail == (
        "applies only with 1 line of context, at line 11 of gen.py, in def gen_sm89(): NOT "
        "in def gen_comm(), where the patch made it"
    )


def test_a_conflict_in_a_reindented_file_says_so(tree: Any, tmp_path: Path) -> None:
    """The context lines are there, indented otherwise: the detail used to say none of them
    was in the file."""
    drifted = [f"    {line}" for line in LINES]
    root = tree(drifted)
    patch = patch_file(tmp_path, "p", {"a.txt": [hunk("a.txt", LINES, 10, "LINE 11")]})
    (result,) = verdict_of(root, patch)
    (failing,) = result.failing
    assert failing.detail == (
        "its context line 'line 8' is at a.txt:8, indented otherwise; the candidate's file "
        "was re-indented there"
    )
