"""bump --write: every verdict through what it writes, nothing lost (unsaved work refused and
named, dropped only on whole-patch proof), the companions from sglang's metadata, the
journal that makes an in-place write all or nothing, a new sglang as a new stack, and
wheel-only candidates."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from sm120_build.bump import (
    Candidate,
    PatchVerdict,
    companion_pins,
    finish_interrupted,
    new_files,
    unsaved,
    write_in_place,
    write_new_stack,
)
from sm120_build.bump.candidate import fetch_candidate, wheel_requires
from sm120_build.bump.write import JOURNAL, STAGING, stage
from sm120_build.errors import UserError
from sm120_build.gitrepo import git
from sm120_build.layout import Layout
from sm120_build.pins import Artifact
from sm120_build.pins import load as load_pins

from .conftest import HEADER, refusal, sglang_wheel

SHA = "0" * 64
CUBIN = "1" * 64
PINS = f"""# The pinned upstream inputs.

[upstream.sglang]
project = "sglang"
version = "1.0"
sdist = "sglang-1.0.tar.gz"
sha256 = "{SHA}"
git_url = ""
git_tag = "v1.0"
git_commit = "abc"

[toolkit]
requirement = "cuda-toolkit==13.0.2"

# Installed beside our wheels.
[companions.flashinfer-cubin]
version = "0.6.3"
sha256 = ["{CUBIN}"]
"""
# Every verdict bump gives, and what --write does with it.
VERDICTS = {
    "0001-clean.patch": ("clean", "keep"),
    "0002-offset.patch": ("offset", "keep"),
    "0003-fuzz.patch": ("fuzz", "refresh"),
    "0004-partly.patch": ("partly upstream", "refresh"),
    "0005-conflict.patch": ("conflict", "refresh"),
    "0006-another-form.patch": ("upstream in another form", "review"),
    "0007-upstream.patch": ("upstream", "drop"),
}


def git_checkout(root: Path) -> Path:
    """`root` as a git checkout with everything committed, as a clone is."""
    git(root, "init", "--quiet")
    git(root, "add", "--all")
    git(root, "commit", "--quiet", "-m", "project")
    return root


@pytest.fixture
def project(tmp_path: Path) -> Layout:
    """A checkout whose one stack pins sglang 1.0 with a patch of every verdict; the
    patches' headers include an Applied-Upstream that names the candidate."""
    root = tmp_path / "project"
    series = root / "patches" / "sglang"
    series.mkdir(parents=True)
    (root / "pins.toml").write_text(PINS)
    (root / "profiles.toml").write_text("# profiles\n")
    for name in VERDICTS:
        header = HEADER.format(subject=name) + "Applied-Upstream: 1.1, PR 99\n"
        (series / name).write_text(header + "\ndiff --git a/x b/x\n--- a/x\n+++ b/x\n")
    (series / "series").write_text("".join(f"{name}\n" for name in VERDICTS))
    return Layout(git_checkout(root), tmp_path / "cache")


def candidate(layout: Layout, version: str) -> Candidate:
    pins = load_pins(layout.pins_file)
    moved = replace(
        pins.upstream("sglang"),
        version=version,
        sdist=f"sglang-{version}.tar.gz",
        sha256="2" * 64,
        git_tag=f"v{version}",
        git_commit="def",
    )
    patches = [PatchVerdict(name, kind, action, []) for name, (kind, action) in VERDICTS.items()]
    return Candidate(moved, patches)


def test_every_verdict_through_write(project: Layout) -> None:
    """Only the whole-patch "upstream" is dropped; "upstream in another form" is kept with a
    REVIEW line; refresh verdicts stay in the series as they are. The Applied-Upstream
    header every patch carries is no reason to drop any."""
    files = new_files([candidate(project, "1.1")], project.pins_file, project.patches, {})
    write_in_place(project, files)
    series = project.patches / "sglang"
    assert (series / "series").read_text().splitlines() == [
        "0001-clean.patch",
        "0002-offset.patch",
        "0003-fuzz.patch",
        "0004-partly.patch",
        "0005-conflict.patch",
        "# REVIEW 0006-another-form.patch: upstream in another form in sglang 1.1 (nox -s "
        "bump); kept until it is proven equivalent",
        "0006-another-form.patch",
        "# 0007-upstream.patch: dropped, upstream in sglang 1.1 (nox -s bump: the whole "
        "patch reverse-applies)",
    ]
    assert sorted(p.name for p in series.glob("*.patch")) == sorted(VERDICTS)[:-1]
    sglang = load_pins(project.pins_file).upstream("sglang")
    assert (sglang.version, sglang.sdist, sglang.git_commit) == ("1.1", "sglang-1.1.tar.gz", "def")
    text = project.pins_file.read_text()
    assert text.startswith("# The pinned upstream inputs.\n")  # comments kept
    assert "# Installed beside our wheels.\n" in text
    assert not list(project.stack.glob(".sm120-bump*"))


def test_a_rerun_adds_no_second_review_line(project: Layout) -> None:
    for _ in range(2):
        files = new_files([candidate(project, "1.1")], project.pins_file, project.patches, {})
        write_in_place(project, files)
    text = (project.patches / "sglang" / "series").read_text()
    assert text.count("# REVIEW 0006-another-form.patch") == 1
    assert text.count("# 0007-upstream.patch: dropped") == 1


def test_unsaved_work_is_named_file_by_file(project: Layout) -> None:
    """bump --write deleted a patch whose header held an uncommitted edit, and said
    nothing."""
    assert unsaved(project, load_pins(project.pins_file)) == []
    patch = project.patches / "sglang" / "0007-upstream.patch"
    patch.write_text("Description: my uncommitted edit\n" + patch.read_text())
    project.pins_file.write_text(project.pins_file.read_text() + "# mine\n")
    (project.patches / "sglang" / "notes.txt").write_text("new")
    tree = project.vendor / "sglang"
    tree.mkdir(parents=True)
    (tree / "file.txt").write_text("not a vendor tree")
    assert unsaved(project, load_pins(project.pins_file)) == [
        "patches/sglang/0007-upstream.patch: uncommitted (M)",
        "pins.toml: uncommitted (M)",
        "patches/sglang/notes.txt: uncommitted (??)",
        "vendor/sglang: not a vendor tree made by this tool (a file, a link, a plain "
        "directory or a git worktree)",
    ]


def test_outside_a_git_checkout_nothing_can_be_told(tmp_path: Path) -> None:
    root = tmp_path / "plain"
    root.mkdir()
    (root / "pins.toml").write_text(PINS)
    layout = Layout(root, tmp_path / "cache")
    (problem,) = unsaved(layout, load_pins(layout.pins_file))
    assert problem.endswith("--write runs in a git checkout (git init and commit)")


def test_an_interrupted_write_is_finished_by_the_next_command(project: Layout) -> None:
    """Before the journal, the old set stands; after it, the next command (any, here the
    tool's shard-matrix) completes the new set before it reads the pins."""
    before = project.pins_file.read_text()
    files = new_files([candidate(project, "1.1")], project.pins_file, project.patches, {})
    stage(project, files)  # interrupted right after the journal: nothing renamed yet
    assert project.pins_file.read_text() == before
    assert (project.stack / JOURNAL).is_file()
    result = subprocess.run(
        [sys.executable, "-m", "sm120_build", "shard-matrix", "--shards", "1"],
        cwd=project.root,
        env=dict(os.environ, SM120_CACHE_DIR=str(project.cache)),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "finishing the bump --write that was interrupted (3 files)" in result.stderr
    assert load_pins(project.pins_file).upstream("sglang").version == "1.1"
    assert not (project.patches / "sglang" / "0007-upstream.patch").exists()
    assert not (project.stack / JOURNAL).exists()
    finish_interrupted(project)  # nothing left to do


def test_a_journal_naming_paths_outside_the_stack_is_refused(project: Layout) -> None:
    (project.stack / JOURNAL).write_text('{"replace": [], "delete": ["../../victim"]}')
    with pytest.raises(UserError, match="names paths outside the stack"):
        finish_interrupted(project)


def test_a_new_sglang_is_a_new_stack_and_the_old_one_is_untouched(project: Layout) -> None:
    def contents() -> dict[Path, bytes]:
        return {
            p: p.read_bytes()
            for p in project.stack.rglob("*")
            if p.is_file() and "stacks" not in p.relative_to(project.root).parts
        }

    before = contents()
    files = new_files([candidate(project, "2.0")], project.pins_file, project.patches, {})
    made = write_new_stack(project, "sglang-2.0", files)
    assert made == project.root / "stacks" / "sglang-2.0"
    assert contents() == before
    assert load_pins(made / "pins.toml").upstream("sglang").version == "2.0"
    assert (made / "profiles.toml").read_text() == "# profiles\n"
    assert not (made / "patches" / "sglang" / "0007-upstream.patch").exists()
    assert (made / "patches" / "sglang" / "0006-another-form.patch").is_file()
    assert [p.name for p in (project.root / "stacks").iterdir()] == ["sglang-2.0"]
    with pytest.raises(UserError, match=r"stacks/sglang-2\.0 exists already"):
        write_new_stack(project, "sglang-2.0", files)


def test_companions_follow_the_chosen_sglangs_metadata(project: Layout) -> None:
    """A candidate sglang that required flashinfer_cubin==0.6.4 was written with cubin
    0.6.3, exit 0."""
    pins = load_pins(project.pins_file)
    requires = {"flashinfer-cubin": Requirement("flashinfer_cubin==0.6.4")}
    assert companion_pins(pins, requires, "1.1") == {"flashinfer-cubin": ("0.6.3", "0.6.4")}
    assert companion_pins(pins, {}, "1.1") == {"flashinfer-cubin": ("0.6.3", None)}
    loose = {"flashinfer-cubin": Requirement("flashinfer_cubin>=0.6")}
    with pytest.raises(UserError, match="pins no one version of flashinfer-cubin"):
        companion_pins(pins, loose, "1.1")
    moved = {"flashinfer-cubin": ("0.6.4", ("3" * 64,))}
    files = new_files([candidate(project, "1.1")], project.pins_file, project.patches, moved)
    write_in_place(project, files)
    cubin = load_pins(project.pins_file).companions["flashinfer-cubin"]
    assert (cubin.version, cubin.sha256) == ("0.6.4", ("3" * 64,))
    dropped = {"flashinfer-cubin": None}
    files = new_files([candidate(project, "1.2")], project.pins_file, project.patches, dropped)
    write_in_place(project, files)
    assert load_pins(project.pins_file).companions == {}
    text = project.pins_file.read_text()
    assert "# Installed beside our wheels.\n" not in text  # its table's own comment
    assert text.endswith('requirement = "cuda-toolkit==13.0.2"\n\n')


def test_a_wheel_only_candidate_is_fetched_for_the_default_target(
    project: Layout, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sglang publishes only wheels since 0.5.11: bump stopped at "no sdist"."""
    links = tmp_path / "links"
    links.mkdir()
    for tag in ("cp311-cp311-manylinux_2_34_x86_64", "cp312-cp312-manylinux_2_34_aarch64"):
        sglang_wheel(links, "2.0", tag)
    wanted = sglang_wheel(
        links,
        "2.0",
        "cp312-cp312-manylinux_2_34_x86_64",
        b"Requires-Dist: flashinfer_python==0.7.2\n",
    )
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    pins = load_pins(project.pins_file)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (fetched,) = fetch_candidate(pins.upstream("sglang"), "2.0", scratch)
    assert fetched.name == wanted.name
    assert str(wheel_requires(fetched)["flashinfer-python"]) == "flashinfer_python==0.7.2"
    # A stack that pins wheels keeps its targets; one the release lacks is named.
    aarch = replace(
        pins.upstream("sglang"),
        wheels=(Artifact("sglang-1.0-cp313-cp313-manylinux_2_34_x86_64.whl", SHA),),
    )
    with pytest.raises(UserError) as error:
        fetch_candidate(aarch, "2.0", scratch)
    assert str(error.value) == (
        "sglang 2.0 publishes no sdist and no wheel for cp313-cp313-x86_64 (it has "
        "sglang-2.0-cp311-cp311-manylinux_2_34_x86_64.whl, "
        "sglang-2.0-cp312-cp312-manylinux_2_34_aarch64.whl, "
        "sglang-2.0-cp312-cp312-manylinux_2_34_x86_64.whl); name a release that has one"
    )
    with pytest.raises(UserError) as error:
        fetch_candidate(pins.upstream("sglang"), "3.0", scratch)
    assert str(error.value) == (
        f"no sdist or wheel of sglang==3.0 in {links} (pip's configuration: `pip config list`); "
        "check the version, and that the index has its files"
    )


def test_a_wheels_own_requirements_are_read_without_installing(tmp_path: Path) -> None:
    wheel = sglang_wheel(tmp_path, "2.0", "py3-none-any", b"Requires-Dist: torch==2.14.1\n")
    assert str(wheel_requires(wheel)["torch"]) == "torch==2.14.1"
    with zipfile.ZipFile(wheel) as archive:
        assert "sglang/__init__.py" in archive.namelist()


def test_a_wheel_only_candidate_is_pinned_by_its_wheels(project: Layout) -> None:
    """Written inside the upstream's table, after its last key: not as [[wheels]] tables
    after the comments that introduce the next table (which broke pins.toml)."""
    moved = replace(
        candidate(project, "2.0").upstream,
        sdist="",
        sha256="",
        wheels=(Artifact("sglang-2.0-cp312-cp312-manylinux_2_34_x86_64.whl", "4" * 64),),
    )
    files = new_files([Candidate(moved, [])], project.pins_file, project.patches, {})
    (project.stack / "new.toml").write_text(files.texts["pins.toml"])
    sglang = load_pins(project.stack / "new.toml").upstream("sglang")
    assert sglang.wheels == moved.wheels and sglang.sdist == ""
    text = files.texts["pins.toml"]
    assert 'git_commit = "def"\nwheels = [\n  { file = "sglang-2.0-cp312' in text
    assert "\n\n[toolkit]" in text


def test_what_write_did_is_said_for_every_pin_and_patch(project: Layout) -> None:
    series = project.patches / "sglang" / "series"
    # quilt lets a series line carry options and a comment after the patch's name
    series.write_text(
        series.read_text()
        .replace("0007-upstream.patch\n", "0007-upstream.patch -p1 # lifted upstream\n")
        .replace("0001-clean.patch\n", "0001-clean.patch\n0008-also-upstream.patch\n")
    )
    result = candidate(project, "1.1")
    result.patches.append(PatchVerdict("0008-also-upstream.patch", "upstream", "drop", []))
    companions = {"flashinfer-cubin": ("0.6.4", ("3" * 64,)), "other-cubin": None}
    files = new_files([result], project.pins_file, project.patches, companions)
    assert files.dropped == [
        "patches/sglang/0007-upstream.patch",
        "patches/sglang/0008-also-upstream.patch",
    ]
    assert files.done == [
        "pins.toml: flashinfer-cubin -> 0.6.4",
        "pins.toml: other-cubin dropped (the chosen sglang no longer requires it)",
        "pins.toml: sglang -> sglang 1.1",
        "patches/sglang: dropped 0007-upstream.patch (upstream)",
        "patches/sglang: dropped 0008-also-upstream.patch (upstream)",
        "patches/sglang: kept 0006-another-form.patch for review",
    ]
    assert files.texts["patches/sglang/series"].splitlines()[1] == (
        "# 0008-also-upstream.patch: dropped, upstream in sglang 1.1 (nox -s bump: the whole "
        "patch reverse-applies)"
    )


def test_an_untracked_file_in_a_new_directory_is_named_itself(project: Layout) -> None:
    new = project.patches / "sglang" / "drafts"
    new.mkdir()
    (new / "0009-mine.patch").write_text("my unsaved work")
    assert unsaved(project, load_pins(project.pins_file)) == [
        "patches/sglang/drafts/0009-mine.patch: uncommitted (??)"
    ]


def test_each_companion_is_matched_to_the_sglang_requirement_of_its_own_name(
    tmp_path: Path,
) -> None:
    """The first companion no longer required does not end the look at the others."""
    pins_file = tmp_path / "pins.toml"
    first = f'[companions.aaa-first]\nversion = "1.0"\nsha256 = ["{CUBIN}"]\n\n'
    pins_file.write_text(PINS.replace("# Installed beside our wheels.\n", first))
    pins = load_pins(pins_file)
    requires = {"flashinfer-cubin": Requirement("flashinfer_cubin==0.6.4")}
    assert companion_pins(pins, requires, "1.1") == {
        "aaa-first": ("1.0", None),
        "flashinfer-cubin": ("0.6.3", "0.6.4"),
    }
    loose = {"flashinfer-cubin": Requirement("flashinfer_cubin>=0.6")}
    assert refusal(companion_pins, pins, loose, "1.1") == (
        "sglang 1.1 requires flashinfer_cubin>=0.6, which pins no one version of "
        "flashinfer-cubin: pin it in pins.toml by hand. Nothing was written."
    )


def test_a_stack_that_exists_is_refused_in_full(project: Layout) -> None:
    files = new_files([candidate(project, "2.0")], project.pins_file, project.patches, {})
    (project.root / "stacks" / "sglang-2.0").mkdir(parents=True)
    assert refusal(write_new_stack, project, "sglang-2.0", files) == (
        "stacks/sglang-2.0 exists already: bump from it (--stack sglang-2.0), or move it away. "
        "Nothing was written."
    )


def test_staging_left_by_a_run_stopped_before_its_journal_is_made_again(project: Layout) -> None:
    leftover = project.stack / STAGING
    leftover.mkdir()
    (leftover / "pins.toml").write_text("half of an old run's pins\n")
    (leftover / "stray.txt").write_text("from the stopped run")
    files = new_files([candidate(project, "1.1")], project.pins_file, project.patches, {})
    journal = stage(project, files)
    assert not (leftover / "stray.txt").exists()
    assert (leftover / "pins.toml").read_text() == files.texts["pins.toml"]
    assert journal == {
        "replace": ["patches/sglang/series", "pins.toml"],
        "delete": ["patches/sglang/0007-upstream.patch"],
    }


def test_a_finish_interrupted_after_some_deletes_completes_the_rest(project: Layout) -> None:
    files = new_files([candidate(project, "1.1")], project.pins_file, project.patches, {})
    stage(project, files)
    (project.patches / "sglang" / "0007-upstream.patch").unlink()  # done before the stop
    finish_interrupted(project)
    assert load_pins(project.pins_file).upstream("sglang").version == "1.1"
    assert not (project.stack / JOURNAL).exists() and not (project.stack / STAGING).exists()
