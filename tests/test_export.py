"""export_patches' own rules, with real git on generated sdists and patches: how a patch is
named, what the series file keeps, what each refusal says, that a refused export leaves the
vendor tree's index and patches/ as they were, and that the patches stay plain a/ b/ diffs
whatever the vendor tree's git configuration says."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sm120_build.errors import UserError
from sm120_build.gitrepo import git
from sm120_build.vendor import export_patches, read_state, vendor_upstream
from sm120_build.vendor.export import _check_reproduces_head

from .conftest import make_patch, write_series
from .test_vendor import LINES, commit_refresh, stop_at_second, three_patches

__all__ = ["three_patches"]  # the fixture, used by name

HEADER = "Author: me\nForwarded: no\n"


@pytest.fixture
def vendored(three_patches: Any) -> Any:
    """test_vendor's three patches, vendored: (upstream, sdist, series, tree)."""
    vendor_upstream(*three_patches)
    return three_patches


def stopped_at_second(demo: Any, tmp_path: Path, count: int) -> tuple[Any, Path, Path]:
    """`count` patches, vendored until the second stops: (upstream, series, tree)."""
    upstream, sdist, series = demo(LINES)
    changes = [(1, "LINE 2", "first"), (9, "LINE 10", "second"), (17, "LINE 18", "third")]
    changes.append((5, "LINE 6", "fourth"))
    write_series(
        series,
        *(
            make_patch(series / f"{n:04d}-{subject}.patch", "src/code.txt", LINES, i, new, subject)
            for n, (i, new, subject) in enumerate(changes[:count], start=1)
        ),
    )
    tree = tmp_path / "vendor" / "demo"
    stop_at_second(upstream, sdist, series, tree)
    return upstream, series, tree


def contents(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir()}


def refused(upstream: Any, tree: Path, series: Path) -> str:
    """export_patches' refusal, after checking that it wrote nothing and left the vendor
    tree's index and work tree as they were."""
    before = contents(series)
    with pytest.raises(UserError) as error:
        export_patches(upstream, tree, series)
    assert contents(series) == before
    assert git(tree, "status", "--porcelain").stdout == ""
    return str(error.value)


def test_subject_names_the_patch_before_description(vendored: Any) -> None:
    upstream, _, series, tree = vendored
    commit_refresh(tree, "a long account of why", "line 5", "LINE 5")
    message = f"Subject: short name\nDescription: a long account of why\n{HEADER}"
    git(tree, "commit", "--quiet", "--amend", "-m", message)
    assert export_patches(upstream, tree, series)[-1] == "0004-short-name.patch"
    assert (series / "0004-short-name.patch").read_text().startswith(message)


def test_comment_lines_of_the_series_stay_at_the_top(demo: Any, tmp_path: Path) -> None:
    upstream, sdist, series = demo(LINES)
    first = make_patch(series / "0001-first.patch", "src/code.txt", LINES, 1, "LINE 2", "first")
    comment = "# dropped 0002-old.patch: upstream has it (bump to 1.1)"
    (series / "series").write_text(f"{comment}\n{first.name}\n")
    tree = tmp_path / "vendor" / "demo"
    vendor_upstream(upstream, sdist, series, tree)
    commit_refresh(tree, "second", "line 10", "LINE 10")
    export_patches(upstream, tree, series)
    assert (series / "series").read_text() == f"{comment}\n{first.name}\n0002-second.patch\n"


def test_an_export_after_the_empty_series_was_removed_makes_it_again(
    demo: Any, tmp_path: Path
) -> None:
    upstream, sdist, series = demo(LINES)  # an empty series: no patches yet
    tree = tmp_path / "vendor" / "demo"
    vendor_upstream(upstream, sdist, series, tree)
    (series / "series").unlink()
    series.rmdir()
    series.parent.rmdir()  # no patches/ at all
    commit_refresh(tree, "first change", "line 3", "LINE 3")
    assert export_patches(upstream, tree, series) == ["0001-first-change.patch"]
    assert (series / "series").read_text() == "0001-first-change.patch\n"


def test_a_commit_that_changes_nothing_is_refused_by_name(vendored: Any) -> None:
    upstream, _, series, tree = vendored
    git(tree, "commit", "--quiet", "--allow-empty", "-m", f"Description: nothing\n{HEADER}")
    message = refused(upstream, tree, series)
    assert message.startswith(
        "vendor/demo: the exported 0004-nothing.patch does not apply on top of the ones "
        "before it (error: No valid patches in input"
    )
    assert message.endswith("); nothing was written to patches/")


def test_a_binary_file_is_refused_by_name(vendored: Any) -> None:
    """git diff carries no binary content without --binary; the patch would lose it."""
    upstream, _, series, tree = vendored
    (tree / "src" / "blob.bin").write_bytes(bytes(range(256)) * 4)
    git(tree, "add", "src/blob.bin")
    git(tree, "commit", "-qm", f"Description: a binary file\n{HEADER}")
    message = refused(upstream, tree, series)
    assert message.startswith(
        "vendor/demo: the exported 0004-a-binary-file.patch does not apply on top of the "
        "ones before it (error: cannot apply binary patch to 'src/blob.bin' without full "
        "index line"
    )


def test_a_series_that_would_not_rebuild_head_names_what_it_loses(vendored: Any) -> None:
    """The last line of defence: patches that apply but do not give HEAD (here the last
    commit's patch is missing) are refused, with git's stat of the difference."""
    _, _, series, tree = vendored
    state = read_state(tree)
    assert state is not None
    rendered = {p: (series / p).read_text() for p in ("0001-first.patch", "0002-second.patch")}
    with pytest.raises(UserError) as error:
        _check_reproduces_head(tree, state.base, rendered, "vendor/demo")
    assert str(error.value) == (
        "vendor/demo: the exported series would not rebuild HEAD; it would lose:\n"
        "src/code.txt | 2 +-\n 1 file changed, 1 insertion(+), 1 deletion(-)\n"
        "Nothing was written to patches/."
    )
    assert git(tree, "status", "--porcelain").stdout == ""


def test_a_tree_not_made_by_vendor_is_refused(demo: Any, tmp_path: Path) -> None:
    upstream, _, series = demo(LINES)
    tree = tmp_path / "vendor" / "demo"
    tree.mkdir(parents=True)
    with pytest.raises(UserError) as error:
        export_patches(upstream, tree, series)
    assert str(error.value) == "vendor/demo was not made by this tool; run `nox -s vendor` first"


def test_a_series_stopped_at_its_last_patch_would_drop_only_that(demo: Any, tmp_path: Path) -> None:
    upstream, series, tree = stopped_at_second(demo, tmp_path, 2)
    message = refused(upstream, tree, series)
    assert "exporting now would drop nothing and 0002-second.patch. Commit the refresh" in message


def test_a_series_stopped_early_names_every_patch_it_would_drop(demo: Any, tmp_path: Path) -> None:
    upstream, series, tree = stopped_at_second(demo, tmp_path, 4)
    message = refused(upstream, tree, series)
    assert (
        "exporting now would drop 0003-third.patch, 0004-fourth.patch and 0002-second.patch."
        in message
    )


def test_uncommitted_work_is_refused(vendored: Any) -> None:
    upstream, _, series, tree = vendored
    (tree / "new.txt").write_text("mine\n")
    with pytest.raises(UserError) as error:
        export_patches(upstream, tree, series)
    assert str(error.value) == (
        "vendor/demo has uncommitted or untracked files; commit them first, then export"
    )


def test_a_commit_without_a_patch_header_is_named_with_every_missing_field(
    vendored: Any,
) -> None:
    upstream, _, series, tree = vendored
    commit_refresh(tree, "x", "line 5", "LINE 5")
    git(tree, "commit", "--quiet", "--amend", "-m", "just a message")
    commit = git(tree, "rev-parse", "HEAD").stdout.strip()
    assert refused(upstream, tree, series) == (
        f"vendor/demo commit {commit[:12]}: its message is the patch header and lacks "
        "Description or Subject; Origin or Author; Forwarded. Reword it (git commit --amend) and "
        "export again."
    )


def test_two_commits_with_one_subject_are_refused(vendored: Any) -> None:
    upstream, _, series, tree = vendored
    commit_refresh(tree, "first", "line 5", "LINE 5")
    assert refused(upstream, tree, series) == (
        "vendor/demo has several commits with the subject 'first'; each patch needs its own "
        "subject (it names the patch file). Reword or squash them, then export."
    )


def test_a_dropped_patch_is_left_in_place_and_said(
    vendored: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    upstream, _, series, tree = vendored
    git(tree, "reset", "--quiet", "--hard", "HEAD~1")
    export_patches(upstream, tree, series)
    assert capsys.readouterr().err == (
        "sm120-build: patches/demo/0003-third.patch is no longer in the series; it is left in "
        "place. Delete it if that is what you meant.\n"
    )


def test_patches_are_plain_diffs_whatever_the_trees_git_config_says(vendored: Any) -> None:
    """Colour, no or mnemonic prefixes, an external diff program and rename detection in
    vendor/<name>/.git/config would each make a patch that quilt (patch -p1) cannot apply."""
    upstream, sdist, series, tree = vendored
    for key, value in {
        "color.ui": "always",
        "diff.noprefix": "true",
        "diff.mnemonicPrefix": "true",
        "diff.external": "false",
        "diff.renames": "true",
    }.items():
        git(tree, "config", key, value)
    git(tree, "mv", "src/code.txt", "src/moved.txt")
    git(tree, "commit", "-qm", f"Description: move the code\n{HEADER}")
    assert export_patches(upstream, tree, series)[-1] == "0004-move-the-code.patch"
    patch = (series / "0004-move-the-code.patch").read_text()
    assert "\x1b[" not in patch
    assert "rename from" not in patch
    assert "--- a/src/code.txt\n+++ /dev/null\n" in patch
    assert "--- /dev/null\n+++ b/src/moved.txt\n" in patch
    assert vendor_upstream(upstream, sdist, series, tree) is False  # the export is current


@pytest.mark.parametrize(
    "line",
    ["--- a note that looks like a diff", "Index: see the table below", "diff --git a/x b/x"],
)
def test_a_header_line_read_as_a_diff_start_is_refused_before_writing(
    vendored: Any, line: str
) -> None:
    """A message line at column 0 that starts as a diff does passed the header check; the
    patch was written, then export's own re-read (and every later vendor) refused it."""
    upstream, _, series, tree = vendored
    (tree / "src" / "code.txt").write_text("changed\n")
    git(tree, "commit", "-qam", f"Description: a change\n{HEADER}{line}\n")
    message = refused(upstream, tree, series)
    assert message.startswith("vendor/demo commit ")
    assert f"its message has the line {line!r}, which starts at the line's first character" in (
        message
    )
    assert message.endswith("Nothing was written to patches/.")


def test_an_indented_look_alike_line_is_exported(vendored: Any) -> None:
    upstream, _, series, tree = vendored
    (tree / "src" / "code.txt").write_text("changed\n")
    git(tree, "commit", "-qam", f"Description: a change\n {'---'} a note\n{HEADER}")
    written = export_patches(upstream, tree, series)
    assert written[-1] == "0004-a-change.patch"


def test_a_change_to_a_file_that_is_not_utf8_is_refused_by_name(vendored: Any) -> None:
    """It crashed the export with an unexpected UnicodeDecodeError ("a bug")."""
    upstream, _, series, tree = vendored
    (tree / "src" / "latin1.txt").write_bytes("caf\u00e9 cr\u00e8me\n".encode("latin-1"))
    git(tree, "add", "src/latin1.txt")
    git(tree, "commit", "-qm", f"Description: a latin-1 file\n{HEADER}")
    message = refused(upstream, tree, series)
    assert message.startswith("vendor/demo commit ")
    assert " changes src/latin1.txt, which is not UTF-8 text; patches are UTF-8 text" in message


def test_a_message_that_is_not_utf8_is_refused_by_name(vendored: Any) -> None:
    """git itself re-encodes a message it is given, so the commit is written as an object."""
    upstream, _, series, tree = vendored
    (tree / "src" / "code.txt").write_text("changed\n")
    git(tree, "add", "src/code.txt")
    written_tree = git(tree, "write-tree").stdout.strip()
    parent = git(tree, "rev-parse", "HEAD").stdout.strip()
    who = "me <me@localhost> 946684800 +0000"
    raw = (
        f"tree {written_tree}\nparent {parent}\nauthor {who}\ncommitter {who}\n\n".encode()
        + b"Description: caf\xe9\nAuthor: me\nForwarded: no\n"
    )
    (tree.parent / "commit").write_bytes(raw)
    made = git(tree, "hash-object", "-t", "commit", "-w", str(tree.parent / "commit"))
    git(tree, "reset", "--quiet", "--soft", made.stdout.strip())
    message = refused(upstream, tree, series)
    assert message.endswith(
        "its message is not UTF-8 text; a patch header is. Reword it (git commit --amend) "
        "and export again."
    )


def test_a_series_file_that_is_a_link_is_never_written_through(
    vendored: Any, tmp_path: Path
) -> None:
    upstream, _, series, tree = vendored
    outside = tmp_path / "outside.txt"
    outside.write_text((series / "series").read_text())
    before = outside.read_text()
    (series / "series").unlink()
    (series / "series").symlink_to(outside)
    (tree / "src" / "code.txt").write_text("changed\n")
    git(tree, "commit", "-qam", f"Description: a change\n{HEADER}")
    with pytest.raises(UserError) as error:
        export_patches(upstream, tree, series)
    assert str(error.value).startswith(f"{series / 'series'}: a symbolic link where export")
    assert outside.read_text() == before
    assert not (series / "0004-a-change.patch").exists()
