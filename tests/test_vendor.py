"""vendor_upstream and export_patches on generated sdists and patches, with real git."""

import shutil
from pathlib import Path
from typing import Any

import pytest

from sm120_build.cache import SCRATCH_MARKER
from sm120_build.errors import UserError
from sm120_build.gitrepo import commit_message, git, head
from sm120_build.vendor import (
    PatchAlreadyApplied,
    PatchConflict,
    continue_series,
    export_patches,
    read_state,
    unpack_sdist,
    unsaved_work,
    vendor_upstream,
)

from .conftest import make_patch, make_tarball, write_series

LINES = [f"line {n}" for n in range(1, 21)]


@pytest.fixture
def two_patches(demo: Any, tmp_path: Path) -> Any:
    upstream, sdist, series = demo(LINES)
    first = make_patch(
        series / "0001-first.patch", "src/code.txt", LINES, 1, "LINE 2", "first change"
    )
    second = make_patch(
        series / "0002-second.patch", "src/code.txt", LINES, 14, "LINE 15", "second change"
    )
    write_series(series, first, second)
    return upstream, sdist, series, tmp_path / "vendor" / "demo"


def test_vendor_commits_pristine_then_one_commit_per_patch(two_patches: Any) -> None:
    upstream, sdist, series, tree = two_patches
    assert vendor_upstream(upstream, sdist, series, tree)
    log = git(tree, "log", "--format=%H").stdout.split()
    assert len(log) == 3
    assert upstream.sha256 in commit_message(tree, log[-1])
    assert commit_message(tree, log[0]).startswith("Description: second change")
    assert "LINE 2" in (tree / "src/code.txt").read_text()
    assert "LINE 15" in (tree / "src/code.txt").read_text()


def test_same_inputs_give_the_same_commit_ids(two_patches: Any, tmp_path: Path) -> None:
    upstream, sdist, series, tree = two_patches
    vendor_upstream(upstream, sdist, series, tree)
    other = tmp_path / "elsewhere" / "demo"
    vendor_upstream(upstream, sdist, series, other)
    assert head(tree) == head(other)


def test_rerun_is_a_fast_no_op(two_patches: Any) -> None:
    upstream, sdist, series, tree = two_patches
    vendor_upstream(upstream, sdist, series, tree)
    before = head(tree)
    assert vendor_upstream(upstream, sdist, series, tree) is False
    assert head(tree) == before


def test_changed_patch_rebuilds_the_tree(two_patches: Any) -> None:
    upstream, sdist, series, tree = two_patches
    vendor_upstream(upstream, sdist, series, tree)
    make_patch(
        series / "0002-second.patch", "src/code.txt", LINES, 14, "Line Fifteen", "second change"
    )
    assert vendor_upstream(upstream, sdist, series, tree)
    assert "Line Fifteen" in (tree / "src/code.txt").read_text()


def test_local_edits_are_never_destroyed(two_patches: Any) -> None:
    upstream, sdist, series, tree = two_patches
    vendor_upstream(upstream, sdist, series, tree)
    (tree / "src/code.txt").write_text("my work\n")
    make_patch(
        series / "0002-second.patch", "src/code.txt", LINES, 14, "changed", "second change"
    )  # stale inputs would normally rebuild
    with pytest.raises(UserError, match=r"edited, untracked or ignored(?s:.*)export_patches"):
        vendor_upstream(upstream, sdist, series, tree)
    assert (tree / "src/code.txt").read_text() == "my work\n"


def test_unexported_commits_are_never_destroyed(two_patches: Any) -> None:
    upstream, sdist, series, tree = two_patches
    vendor_upstream(upstream, sdist, series, tree)
    (tree / "new.txt").write_text("x\n")
    git(tree, "add", "new.txt")
    git(tree, "commit", "-qm", "Description: add\nAuthor: me\nForwarded: no\n")
    with pytest.raises(UserError, match=r"commits that are not in patches"):
        vendor_upstream(upstream, sdist, series, tree)
    assert (tree / "new.txt").exists()


def test_drifted_context_names_patch_file_and_hunk(two_patches: Any) -> None:
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
    state = read_state(tree)
    assert state is not None and not state.complete and state.stopped_at == "0002-second.patch"


def test_already_applied_patch_is_reported_as_such(demo: Any) -> None:
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


def test_series_naming_a_missing_file_touches_nothing(demo: Any) -> None:
    upstream, sdist, series = demo()
    (series / "series").write_text("0001-missing.patch\n")
    tree = series.parent.parent / "vendor" / "demo"
    with pytest.raises(UserError, match=r"0001-missing.patch"):
        vendor_upstream(upstream, sdist, series, tree)
    assert not tree.exists()


def test_export_round_trip_is_byte_identical(two_patches: Any) -> None:
    upstream, sdist, series, tree = two_patches
    vendor_upstream(upstream, sdist, series, tree)
    # Files as exported once are the canonical form; a second export must not move a byte.
    export_patches(upstream, tree, series)
    before = {p.name: p.read_bytes() for p in series.iterdir()}
    export_patches(upstream, tree, series)
    assert {p.name: p.read_bytes() for p in series.iterdir()} == before


def test_export_adds_a_new_commit_as_a_patch(two_patches: Any) -> None:
    upstream, sdist, series, tree = two_patches
    vendor_upstream(upstream, sdist, series, tree)
    (tree / "src/code.txt").write_text((tree / "src/code.txt").read_text() + "tail\n")
    git(tree, "commit", "-qam", "Description: append a tail\nAuthor: me\nForwarded: no\n")
    names = export_patches(upstream, tree, series)
    assert names[-1] == "0003-append-a-tail.patch"
    assert (series / "series").read_text().splitlines()[-1] == "0003-append-a-tail.patch"
    assert vendor_upstream(upstream, sdist, series, tree) is False  # current again


def test_export_refuses_a_commit_without_a_dep3_header(two_patches: Any) -> None:
    upstream, sdist, series, tree = two_patches
    vendor_upstream(upstream, sdist, series, tree)
    (tree / "x").write_text("x\n")
    git(tree, "add", "x")
    git(tree, "commit", "-qm", "just a message")
    with pytest.raises(UserError, match=r"Description or Subject"):
        export_patches(upstream, tree, series)


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize(
    ("members", "top", "complaint"),
    [
        ({"../evil.txt": "x"}, "", "unsafe path"),
        ({"/tmp/evil.txt": "x"}, "", "unsafe path"),
        ({"demo-1.0/a/../../evil.txt": "x"}, "", "unsafe path"),
        ({"demo-1.0/.git/hooks/post-commit": "#!/bin/sh\n"}, "", "may not ship .git"),
        ({"./": "", "demo-1.0/a": "x"}, "", "names no path"),
    ],
)
def test_unsafe_tarball_members_are_refused(
    tmp_path: Path, members: Any, top: Any, complaint: Any
) -> None:
    # Unpacking happens in a scratch directory beside the destination: `..` from there is
    # tmp_path/work itself, so that whole tree must stay as it was.
    work = tmp_path / "work"
    work.mkdir()
    tarball = make_tarball(tmp_path / "bad.tar.gz", members, top=top)
    with pytest.raises(UserError, match=complaint):
        unpack_sdist(tarball, work / "out")
    assert files_under(work) == []
    assert not Path("/tmp/evil.txt").exists()


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


# --- the patch round trip never loses work ------------------------------------------------


@pytest.fixture
def three_patches(demo: Any, tmp_path: Path) -> Any:
    upstream, sdist, series = demo(LINES)
    patches = [
        make_patch(series / "0001-first.patch", "src/code.txt", LINES, 1, "LINE 2", "first"),
        make_patch(series / "0002-second.patch", "src/code.txt", LINES, 9, "LINE 10", "second"),
        make_patch(series / "0003-third.patch", "src/code.txt", LINES, 17, "LINE 18", "third"),
    ]
    write_series(series, *patches)
    return upstream, sdist, series, tmp_path / "vendor" / "demo"


def stop_at_second(upstream: Any, sdist: Any, series: Path, tree: Path) -> None:
    """Make 0002 drift so the series stops there, as after an upstream bump."""
    drifted = [*LINES[:11], "context upstream changed", *LINES[12:]]
    make_patch(series / "0002-second.patch", "src/code.txt", drifted, 9, "LINE 10", "second")
    with pytest.raises(PatchConflict, match=r"--continue demo"):
        vendor_upstream(upstream, sdist, series, tree)


def commit_refresh(tree: Path, subject: str, old: str, new: str) -> None:
    code = tree / "src/code.txt"
    code.write_text(code.read_text().replace(old, new))
    git(tree, "commit", "-qam", f"Description: {subject}\nAuthor: me\nForwarded: no\n")


def test_export_refuses_a_series_that_stopped_part_way(three_patches: Any) -> None:
    upstream, sdist, series, tree = three_patches
    stop_at_second(upstream, sdist, series, tree)
    before = {p.name: p.read_bytes() for p in series.iterdir()}
    with pytest.raises(UserError, match=r"stopped part-way.*0002-second.*0003-third"):
        export_patches(upstream, tree, series)
    # Refreshing the stopped patch in the middle does not make export safe either.
    commit_refresh(tree, "second", "line 10", "LINE 10")
    with pytest.raises(UserError, match=r"stopped part-way"):
        export_patches(upstream, tree, series)
    assert {p.name: p.read_bytes() for p in series.iterdir()} == before


def test_continue_after_a_refresh_then_export_keeps_every_patch(three_patches: Any) -> None:
    upstream, sdist, series, tree = three_patches
    stop_at_second(upstream, sdist, series, tree)
    commit_refresh(tree, "second", "line 10", "LINE 10")
    continue_series(upstream, series, tree)
    assert "LINE 18" in (tree / "src/code.txt").read_text()
    # Refreshed but not exported: a plain vendor must not throw it away.
    with pytest.raises(UserError, match=r"refreshed patches that are not in patches/"):
        vendor_upstream(upstream, sdist, series, tree)
    assert export_patches(upstream, tree, series) == [
        "0001-first.patch",
        "0002-second.patch",
        "0003-third.patch",
    ]
    third = (series / "0003-third.patch").read_text()
    assert third.startswith("Description: third\n") and "\n+LINE 18\n" in third
    assert vendor_upstream(upstream, sdist, series, tree) is False


def test_export_refuses_when_patches_changed_since_vendoring(three_patches: Any) -> None:
    upstream, sdist, series, tree = three_patches
    vendor_upstream(upstream, sdist, series, tree)
    edited = (series / "0003-third.patch").read_text().replace("Why this", "My edit: why this")
    (series / "0003-third.patch").write_text(edited)
    with pytest.raises(UserError, match=r"patches/demo changed since vendor/demo was made"):
        export_patches(upstream, tree, series)
    assert (series / "0003-third.patch").read_text() == edited


def test_export_never_deletes_a_patch_file_it_does_not_replace(three_patches: Any) -> None:
    upstream, sdist, series, tree = three_patches
    vendor_upstream(upstream, sdist, series, tree)
    git(tree, "reset", "--quiet", "--hard", "HEAD~1")  # drop the third patch's commit
    assert export_patches(upstream, tree, series) == ["0001-first.patch", "0002-second.patch"]
    assert (series / "series").read_text() == "0001-first.patch\n0002-second.patch\n"
    assert (series / "0003-third.patch").is_file()


def test_export_refuses_duplicate_subjects(three_patches: Any) -> None:
    upstream, sdist, series, tree = three_patches
    vendor_upstream(upstream, sdist, series, tree)
    before = {p.name: p.read_bytes() for p in series.iterdir()}
    commit_refresh(tree, "first", "line 5", "LINE 5")
    with pytest.raises(UserError, match=r"several commits with the subject 'first'"):
        export_patches(upstream, tree, series)
    assert {p.name: p.read_bytes() for p in series.iterdir()} == before


def test_a_new_commit_whose_subject_makes_a_kept_patchs_name_is_refused(three_patches: Any) -> None:
    """`First!` inserted at the base, the three re-applied on top: four commits came out as
    three patches (First! took 0001-first.patch, then first overwrote it), and a fresh
    vendor then failed on 0001-first.patch."""
    upstream, sdist, series, tree = three_patches
    vendor_upstream(upstream, sdist, series, tree)
    before = {p.name: p.read_bytes() for p in series.iterdir()}
    state = read_state(tree)
    assert state is not None
    patches = git(tree, "rev-list", "--reverse", f"{state.base}..HEAD").stdout.split()
    git(tree, "reset", "--quiet", "--hard", state.base)
    commit_refresh(tree, "First!", "line 5", "LINE 5")
    for commit in patches:
        git(tree, "cherry-pick", "--quiet", "--allow-empty-message", commit)
    with pytest.raises(UserError, match=r"same patch file name: 'First!', 'first'"):
        export_patches(upstream, tree, series)
    assert {p.name: p.read_bytes() for p in series.iterdir()} == before


def test_an_export_that_would_not_rebuild_head_writes_nothing(three_patches: Any) -> None:
    """A change git diff cannot carry as text (a binary file) would be lost in the patch:
    the exported series is applied to the pristine tree first, and must give HEAD."""
    upstream, sdist, series, tree = three_patches
    vendor_upstream(upstream, sdist, series, tree)
    before = {p.name: p.read_bytes() for p in series.iterdir()}
    (tree / "src" / "blob.bin").write_bytes(bytes(range(256)) * 4)
    git(tree, "add", "src/blob.bin")
    git(tree, "commit", "-qm", "Description: a binary file\nAuthor: me\nForwarded: no\n")
    with pytest.raises(UserError, match=r"(?s)would not rebuild HEAD.*blob\.bin|does not apply"):
        export_patches(upstream, tree, series)
    assert {p.name: p.read_bytes() for p in series.iterdir()} == before


def test_export_uses_each_old_name_once_and_never_overwrites_a_left_file(
    three_patches: Any,
) -> None:
    upstream, sdist, series, tree = three_patches
    vendor_upstream(upstream, sdist, series, tree)
    third = (series / "0003-third.patch").read_bytes()
    git(tree, "reset", "--quiet", "--hard", "HEAD~1")
    # A new patch whose subject makes the same file name as the dropped 0003-third.patch.
    commit_refresh(tree, "Third!", "line 20", "LINE 20")
    names = export_patches(upstream, tree, series)
    assert names == ["0001-first.patch", "0002-second.patch", "0003-third-2.patch"]
    assert (series / "0003-third.patch").read_bytes() == third
    assert len(set(names)) == len(names)


def test_a_reworded_long_subject_gets_a_new_name_and_leaves_the_old_file(
    three_patches: Any,
) -> None:
    """Subjects longer than the 50-character slug: a suffix on the subject was cut off with
    it, and export looped for ever looking for a free name."""
    upstream, sdist, series, tree = three_patches
    vendor_upstream(upstream, sdist, series, tree)
    long = "Compare public versions in the cubin and jit-cache version checks"
    message = f"Description: {long}\nAuthor: me\nForwarded: no\n"
    git(tree, "commit", "--quiet", "--amend", "-m", message)
    export_patches(upstream, tree, series)
    first = "0003-compare-public-versions-in-the-cubin-and-jit-cache.patch"
    assert (series / "series").read_text().splitlines()[-1] == first
    git(tree, "commit", "--quiet", "--amend", "-m", message.replace(long, long + ", and more"))
    names = export_patches(upstream, tree, series)
    assert names[-1] == first.replace(".patch", "-2.patch")
    assert (series / first).is_file()  # the old file stays, for the user to remove


def test_rebuild_refuses_to_delete_files_hidden_by_global_excludes(
    two_patches: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream, sdist, series, tree = two_patches
    config = tmp_path / "xdg"
    (config / "git").mkdir(parents=True)
    (config / "git" / "ignore").write_text(".idea/\n*.local\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    vendor_upstream(upstream, sdist, series, tree)
    (tree / ".idea").mkdir()
    (tree / ".idea" / "workspace.xml").write_text("<mine/>\n")
    (tree / "notes.local").write_text("mine\n")
    make_patch(series / "0002-second.patch", "src/code.txt", LINES, 14, "other", "second change")
    with pytest.raises(UserError, match=r"(?s)\.idea/workspace\.xml.*notes\.local"):
        vendor_upstream(upstream, sdist, series, tree)
    assert (tree / ".idea" / "workspace.xml").read_text() == "<mine/>\n"
    assert (tree / "notes.local").is_file()


def test_a_tree_it_did_not_make_is_refused_and_kept(two_patches: Any) -> None:
    """A plain directory of the user's files, an unpacked tree with an empty repository and
    a git worktree at vendor/demo are refused by name and left as they are (vendor used to
    take the first two as "left half-made by an interrupted run" and delete them)."""
    upstream, sdist, series, tree = two_patches
    tree.mkdir(parents=True)
    (tree / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match=r"vendor/demo \(.*\) exists but was not made by this tool"):
        vendor_upstream(upstream, sdist, series, tree)
    assert (tree / "notes.txt").read_text() == "mine"
    git(tree, "init", "--quiet")
    with pytest.raises(UserError, match=r"no \.git/sm120-build\.json\); nothing was touched"):
        vendor_upstream(upstream, sdist, series, tree)
    assert (tree / "notes.txt").read_text() == "mine"
    shutil.rmtree(tree / ".git")
    (tree / ".git").write_text("gitdir: /somewhere/else/.git/worktrees/demo\n")
    with pytest.raises(UserError, match=r"a plain directory or a git worktree"):
        vendor_upstream(upstream, sdist, series, tree)
    assert sorted(p.name for p in tree.iterdir()) == [".git", "notes.txt"]


def test_only_an_abandoned_scratch_tree_of_its_own_is_removed(two_patches: Any) -> None:
    """Beside vendor/demo, a scratch directory is removed only when its marker says this
    tool made it and its process has ended; one without the marker is someone else's."""
    upstream, sdist, series, tree = two_patches
    tree.parent.mkdir(parents=True)
    foreign = tree.parent / ".sm120-tmp-123-demo-abc123"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("not ours")
    ours = tree.parent / ".sm120-tmp-2147480000-demo-def456"
    ours.mkdir()
    (ours / SCRATCH_MARKER).write_text("2147480000\n")
    assert vendor_upstream(upstream, sdist, series, tree)
    state = read_state(tree)
    assert state is not None and state.complete
    assert sorted(p.name for p in tree.parent.iterdir()) == [foreign.name, "demo"]
    assert (foreign / "keep.txt").read_text() == "not ours"


def test_damaged_state_file_is_a_clear_error(two_patches: Any) -> None:
    upstream, sdist, series, tree = two_patches
    vendor_upstream(upstream, sdist, series, tree)
    (tree / ".git" / "sm120-build.json").write_text('{"inputs": ')
    with pytest.raises(UserError, match=r"sm120-build.json is damaged"):
        vendor_upstream(upstream, sdist, series, tree)


def test_git_hooks_in_a_vendor_tree_never_run(three_patches: Any, tmp_path: Path) -> None:
    upstream, sdist, series, tree = three_patches
    stop_at_second(upstream, sdist, series, tree)
    marker = tmp_path / "hook-ran"
    hook = tree / ".git" / "hooks" / "post-commit"
    hook.write_text(f"#!/bin/sh\ntouch {marker}\n")
    hook.chmod(0o755)
    git(tree, "config", "core.fsmonitor", f"touch {marker} #")
    commit_refresh(tree, "second", "line 10", "LINE 10")
    continue_series(upstream, series, tree)  # commits 0003 in this tree
    assert not marker.exists()


def test_a_stopped_tree_with_a_refresh_goes_forward_when_the_inputs_change(
    three_patches: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Stopped at 0002, its refresh committed, then new pins (or patches): `vendor` said to
    run --continue and --continue said to run vendor; the only way out was rm -rf, which
    lost the refresh. vendor now makes the tree again and keeps the commit on a branch."""
    upstream, sdist, series, tree = three_patches
    stop_at_second(upstream, sdist, series, tree)
    commit_refresh(tree, "second", "line 10", "LINE 10")
    refresh = head(tree)
    # New inputs: the series as it was before the drift (a new pin would do the same).
    make_patch(series / "0002-second.patch", "src/code.txt", LINES, 9, "LINE 10", "second")
    capsys.readouterr()
    assert vendor_upstream(upstream, sdist, series, tree)
    state = read_state(tree)
    assert state is not None and state.complete
    assert git(tree, "rev-parse", "kept/0002-second").stdout.strip() == refresh
    assert commit_message(tree, refresh).startswith("Description: second\n")
    said = capsys.readouterr().err
    assert "your commits are kept in it as branch kept/0002-second" in said
    # The kept branch is not in the series: export writes what HEAD holds.
    assert export_patches(upstream, tree, series) == [
        "0001-first.patch",
        "0002-second.patch",
        "0003-third.patch",
    ]


def test_unsaved_work_names_every_file_and_commit(three_patches: Any) -> None:
    upstream, sdist, series, tree = three_patches
    assert unsaved_work(tree, "vendor/demo") == []  # absent
    stop_at_second(upstream, sdist, series, tree)
    (tree / "scratch.txt").write_text("x")
    commit_refresh(tree, "second", "line 10", "LINE 10")
    problems = unsaved_work(tree, "vendor/demo")
    assert problems[0] == "vendor/demo/scratch.txt: edited, untracked or ignored"
    assert problems[1] == "vendor/demo: its series stopped part-way, at 0002-second.patch"
    assert problems[2].startswith("vendor/demo: commits not in patches/ yet (git -C vendor/")
