"""The text of the patch series (patches.py): DEP-3 headers, where a diff starts, series
files, patch file names and the hunks `bump` compares, each by its exact result."""

from __future__ import annotations

from pathlib import Path

import pytest

from sm120_build.errors import UserError
from sm120_build.patches import (
    hunks_of,
    load_series,
    parse_dep3,
    patch_file_name,
    read_patch,
    render_patch,
    series_names,
    split_patch,
)

HEADER = "Description: lift the gate\nAuthor: test\nForwarded: no\n"
DIFF = "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n"


def test_dep3_fields_fold_continuations_and_stop_at_a_blank_line() -> None:
    header = (
        "Description: first line\n"
        " second line\n"
        "\tthird line\n"
        "Author: someone\n"
        "\n"
        " not a continuation\n"
        "Forwarded: no\n"
        "---\n"
        " not one either\n"
        "  Origin: indented, not a field\n"
    )
    assert parse_dep3(header) == {
        "Description": "first line\nsecond line\nthird line",
        "Author": "someone",
        "Forwarded": "no",
    }
    assert parse_dep3(" continuation before any field\nA: b\n") == {"A": "b"}
    # A line of spaces only is a continuation, an empty one in the field's text.
    assert parse_dep3("A: b\n   \n c\n") == {"A": "b\n\nc"}


def test_where_the_diff_starts() -> None:
    assert split_patch(HEADER + "\n" + DIFF) == (HEADER + "\n", DIFF)
    assert split_patch("Index: x\n===\n") == ("", "Index: x\n===\n")
    assert split_patch("only words\n") == ("only words\n", "")


def test_read_patch_names_what_is_wrong(tmp_path: Path) -> None:
    missing = tmp_path / "missing.patch"
    with pytest.raises(UserError) as caught:
        read_patch(missing)
    assert str(caught.value) == f"cannot read patch {missing}: No such file or directory"
    words = tmp_path / "words.patch"
    words.write_text(HEADER)
    with pytest.raises(UserError) as caught:
        read_patch(words)
    assert str(caught.value) == (
        f"{words}: no diff found (expected 'diff --git', '---' or 'Index:')"
    )
    bare = tmp_path / "bare.patch"
    bare.write_text("Description: x\n\n" + DIFF)
    with pytest.raises(UserError) as caught:
        read_patch(bare)
    assert str(caught.value) == (
        f"{bare}: DEP-3 header lacks Origin or Author; Forwarded. "
        "Add the fields at the top of the patch (docs/patches.md, 'Adding or refreshing a patch')."
    )


def test_series_files(tmp_path: Path) -> None:
    with pytest.raises(UserError) as caught:
        series_names(tmp_path)
    assert str(caught.value) == (
        f"{tmp_path / 'series'} does not exist; create it, one patch file name per line"
    )
    (tmp_path / "series").write_text(
        "# comment\n0001-a.patch -p1 # why # and more\n\n0002-b.patch\n0003-c.patch -p0\n"
    )
    with pytest.raises(UserError) as caught:
        series_names(tmp_path)
    assert str(caught.value) == (
        f"{tmp_path / 'series'}:5: only '-p1' patches are supported, got ['-p0']"
    )
    (tmp_path / "series").write_text("0001-a.patch -p1 # why # and more\n0002-b.patch\n")
    assert series_names(tmp_path) == ["0001-a.patch", "0002-b.patch"]
    with pytest.raises(UserError) as caught:
        load_series(tmp_path)
    assert str(caught.value) == (f"{tmp_path / 'series'} names 0001-a.patch, which does not exist")


def test_render_keeps_the_header_and_one_blank_line() -> None:
    assert render_patch("\nA: b  \n\n\n", DIFF) == "\nA: b  \n\n" + DIFF
    assert render_patch("A: X\n", DIFF) == "A: X\n\n" + DIFF


@pytest.mark.parametrize(
    ("index", "subject", "suffix", "name"),
    [
        (1, "Lift the SM120 gate!", 1, "0001-lift-the-sm120-gate.patch"),
        (12, "--- leading and trailing ---", 1, "0012-leading-and-trailing.patch"),
        (3, "!!!", 1, "0003-change.patch"),
        (4, "same subject", 2, "0004-same-subject-2.patch"),
        # cut at 50 characters, then a dash the cut left at the end is dropped
        (5, "a" * 49 + " bcd", 1, "0005-" + "a" * 49 + ".patch"),
        (6, "b" * 50 + "c", 1, "0006-" + "b" * 50 + ".patch"),
    ],
)
def test_patch_file_names(index: int, subject: str, suffix: int, name: str) -> None:
    assert patch_file_name(index, subject, suffix) == name


def test_hunks_carry_their_files_name_and_header() -> None:
    diff = (
        "diff --git a/a.txt b/a.txt\n--- a/a.txt\n+++ b/a.txt\n"
        "@@ -1 +1 @@\n-a\n+b\n@@ -9 +9 @@\n-c\n+d\n"
        "diff --git a/bin b/bin\nBinary files a/bin and b/bin differ\n"
        "diff --git a/gone.txt b/gone.txt\n--- a/gone.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n"
        "diff --git a/old.txt b/new.txt\n--- a/old.txt\n+++ b/new.txt\n@@ -1 +1 @@\n-o\n+n\n"
    )
    hunks = hunks_of(diff)
    assert [(h.file, h.text) for h in hunks] == [
        ("a.txt", "@@ -1 +1 @@\n-a\n+b\n"),
        ("a.txt", "@@ -9 +9 @@\n-c\n+d\n"),
        ("gone.txt", "@@ -1 +0,0 @@\n-x\n"),
        ("new.txt", "@@ -1 +1 @@\n-o\n+n\n"),
    ]
    assert hunks[0].file_header == "diff --git a/a.txt b/a.txt\n--- a/a.txt\n+++ b/a.txt\n"
    assert hunks[2].file_header.endswith("+++ /dev/null\n")


def test_hunks_of_a_diff_without_git_headers() -> None:
    (hunk,) = hunks_of("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n")
    assert (hunk.file, hunk.file_header) == ("x", "--- a/x\n+++ b/x\n")
    (bare,) = hunks_of("\n@@ -1 +1 @@\n-a\n+b\n")  # no file header at all
    assert (bare.file, bare.file_header, bare.text) == ("?", "\n", "@@ -1 +1 @@\n-a\n+b\n")
    (nameless,) = hunks_of("diff --git a/x b/x\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n")
    assert nameless.file == "?"
