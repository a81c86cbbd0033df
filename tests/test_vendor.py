"""vendor_upstream and export_patches on generated sdists and patches, with real git."""

from pathlib import Path

import pytest

from sm120_build.errors import UserError
from sm120_build.gitrepo import commit_message, git, head
from sm120_build.vendor import (
    PatchAlreadyApplied,
    PatchConflict,
    export_patches,
    read_state,
    unpack_sdist,
    vendor_upstream,
)

from .conftest import make_patch, make_tarball, write_series

LINES = [f"line {n}" for n in range(1, 21)]


@pytest.fixture
def two_patches(demo, tmp_path: Path):
    upstream, sdist, series = demo(LINES)
    first = make_patch(
        series / "0001-first.patch", "src/code.txt", LINES, 1, "LINE 2", "first change"
    )
    second = make_patch(
        series / "0002-second.patch", "src/code.txt", LINES, 14, "LINE 15", "second change"
    )
    write_series(series, first, second)
    return upstream, sdist, series, tmp_path / "vendor" / "demo"


def test_vendor_commits_pristine_then_one_commit_per_patch(two_patches) -> None:
    upstream, sdist, series, tree = two_patches
    assert vendor_upstream(upstream, sdist, series, tree)
    log = git(tree, "log", "--format=%H").stdout.split()
    assert len(log) == 3
    assert upstream.sha256 in commit_message(tree, log[-1])
    assert commit_message(tree, log[0]).startswith("Description: second change")
    assert "LINE 2" in (tree / "src/code.txt").read_text()
    assert "LINE 15" in (tree / "src/code.txt").read_text()


def test_same_inputs_give_the_same_commit_ids(two_patches, tmp_path: Path) -> None:
    upstream, sdist, series, tree = two_patches
    vendor_upstream(upstream, sdist, series, tree)
    other = tmp_path / "elsewhere" / "demo"
    vendor_upstream(upstream, sdist, series, other)
    assert head(tree) == head(other)


def test_rerun_is_a_fast_no_op(two_patches) -> None:
    upstream, sdist, series, tree = two_patches
    vendor_upstream(upstream, sdist, series, tree)
    before = head(tree)
    assert vendor_upstream(upstream, sdist, series, tree) is False
    assert head(tree) == before


def test_changed_patch_rebuilds_the_tree(two_patches) -> None:
    upstream, sdist, series, tree = two_patches
    vendor_upstream(upstream, sdist, series, tree)
    make_patch(
        series / "0002-second.patch", "src/code.txt", LINES, 14, "Line Fifteen", "second change"
    )
    assert vendor_upstream(upstream, sdist, series, tree)
    assert "Line Fifteen" in (tree / "src/code.txt").read_text()


def test_local_edits_are_never_destroyed(two_patches) -> None:
    upstream, sdist, series, tree = two_patches
    vendor_upstream(upstream, sdist, series, tree)
    (tree / "src/code.txt").write_text("my work\n")
    make_patch(
        series / "0002-second.patch", "src/code.txt", LINES, 14, "changed", "second change"
    )  # stale inputs would normally rebuild
    with pytest.raises(UserError, match=r"uncommitted edits.*export_patches"):
        vendor_upstream(upstream, sdist, series, tree)
    assert (tree / "src/code.txt").read_text() == "my work\n"


def test_unexported_commits_are_never_destroyed(two_patches) -> None:
    upstream, sdist, series, tree = two_patches
    vendor_upstream(upstream, sdist, series, tree)
    (tree / "new.txt").write_text("x\n")
    git(tree, "add", "new.txt")
    git(tree, "commit", "-qm", "Description: add\nAuthor: me\nForwarded: no\n")
    with pytest.raises(UserError, match=r"commits that are not in patches"):
        vendor_upstream(upstream, sdist, series, tree)
    assert (tree / "new.txt").exists()


def test_drifted_context_names_patch_file_and_hunk(two_patches) -> None:
    upstream, sdist, series, tree = two_patches
    drifted = [*LINES[:16], "a context line upstream changed", *LINES[17:]]
    make_patch(
        series / "0002-second.patch", "src/code.txt", drifted, 14, "LINE 15", "second change"
    )
    with pytest.raises(PatchConflict) as caught:
        vendor_upstream(upstream, sdist, series, tree)
    message = str(caught.value)
    assert "0002-second.patch" in message
    assert "src/code.txt" in message
    assert "@@ -12,7 +12,7 @@" in message
    # Left at the last patch that applied, with nothing half-applied.
    assert len(git(tree, "log", "--format=%H").stdout.split()) == 2
    assert git(tree, "status", "--porcelain").stdout == ""
    assert read_state(tree).inputs is None


def test_already_applied_patch_is_reported_as_such(demo) -> None:
    upstream, sdist, series = demo(["alpha", "BETA", "gamma"])
    patch = make_patch(
        series / "0001-beta.patch",
        "src/code.txt",
        ["alpha", "beta", "gamma"],
        1,
        "BETA",
        "uppercase beta",
    )
    write_series(series, patch)
    tree = series.parent.parent / "vendor" / "demo"
    with pytest.raises(PatchAlreadyApplied, match=r"already applied"):
        vendor_upstream(upstream, sdist, series, tree)


def test_series_naming_a_missing_file_touches_nothing(demo) -> None:
    upstream, sdist, series = demo()
    (series / "series").write_text("0001-missing.patch\n")
    tree = series.parent.parent / "vendor" / "demo"
    with pytest.raises(UserError, match=r"0001-missing.patch"):
        vendor_upstream(upstream, sdist, series, tree)
    assert not tree.exists()


def test_export_round_trip_is_byte_identical(two_patches) -> None:
    upstream, sdist, series, tree = two_patches
    vendor_upstream(upstream, sdist, series, tree)
    # Files as exported once are the canonical form; a second export must not move a byte.
    export_patches(upstream, tree, series)
    before = {p.name: p.read_bytes() for p in series.iterdir()}
    export_patches(upstream, tree, series)
    assert {p.name: p.read_bytes() for p in series.iterdir()} == before


def test_export_adds_a_new_commit_as_a_patch(two_patches) -> None:
    upstream, sdist, series, tree = two_patches
    vendor_upstream(upstream, sdist, series, tree)
    (tree / "src/code.txt").write_text((tree / "src/code.txt").read_text() + "tail\n")
    git(tree, "commit", "-qam", "Description: append a tail\nAuthor: me\nForwarded: no\n")
    names = export_patches(upstream, tree, series)
    assert names[-1] == "0003-append-a-tail.patch"
    assert (series / "series").read_text().splitlines()[-1] == "0003-append-a-tail.patch"
    assert vendor_upstream(upstream, sdist, series, tree) is False  # current again


def test_export_refuses_a_commit_without_a_dep3_header(two_patches) -> None:
    upstream, sdist, series, tree = two_patches
    vendor_upstream(upstream, sdist, series, tree)
    (tree / "x").write_text("x\n")
    git(tree, "add", "x")
    git(tree, "commit", "-qm", "just a message")
    with pytest.raises(UserError, match=r"Description or Subject"):
        export_patches(upstream, tree, series)


@pytest.mark.parametrize(
    ("members", "top", "complaint"),
    [
        ({"../evil.txt": "x"}, "", "unsafe path"),
        ({"/etc/evil": "x"}, "", "unsafe path"),
        ({"demo-1.0/a/../../evil": "x"}, "", "unsafe path"),
    ],
)
def test_unsafe_tarball_paths_are_refused(tmp_path: Path, members, top, complaint) -> None:
    tarball = make_tarball(tmp_path / "bad.tar.gz", members, top=top)
    with pytest.raises(UserError, match=complaint):
        unpack_sdist(tarball, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert not (tmp_path.parent / "evil.txt").exists()


def test_links_pointing_outside_are_refused(tmp_path: Path) -> None:
    import tarfile

    tarball = tmp_path / "link.tar.gz"
    with tarfile.open(tarball, "w:gz") as archive:
        link = tarfile.TarInfo("demo-1.0/escape")
        link.type = tarfile.SYMTYPE
        link.linkname = "../../outside"
        archive.addfile(link)
    with pytest.raises(UserError, match=r"points outside the tree"):
        unpack_sdist(tarball, tmp_path / "out")
    assert not (tmp_path / "out").exists()
