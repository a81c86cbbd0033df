"""Stacks: the default one at the top of the checkout, others in stacks/<name>/, each named
after its sglang release and chosen with --stack."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sm120_build.errors import UserError
from sm120_build.layout import Layout, stacks
from sm120_build.pins import load as load_pins
from sm120_build.pins import read_toml

from .conftest import REPO


def sm120_build(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sm120_build", *args],
        cwd=root,
        env=dict(os.environ, SM120_CACHE_DIR=str(root / ".cache")),
        capture_output=True,
        text=True,
    )


def test_the_checkouts_stacks_are_named_after_their_sglang() -> None:
    found = stacks(REPO)
    assert next(iter(found)) == "sglang-0.5.9" and found["sglang-0.5.9"] is None
    assert found["sglang-0.5.23"] == REPO / "stacks" / "sglang-0.5.23"
    current = load_pins(REPO / "stacks" / "sglang-0.5.23" / "pins.toml")
    assert current.upstream("sglang").version == "0.5.23"
    assert current.upstream("flashinfer").version == "0.7.2"


@pytest.mark.parametrize("args", [["--stack"], ["--stack", "sglang-9.9"]])
def test_a_missing_or_unknown_stack_lists_the_stacks(args: list[str]) -> None:
    result = sm120_build(REPO, "shard-matrix", "--shards", "1", *args)
    assert result.returncode == 1
    assert "the stacks of this checkout are sglang-0.5.9 (default), sglang-0.5.23" in (
        result.stderr
    )


def test_a_stack_lays_out_its_own_files(tmp_path: Path) -> None:
    layout = Layout.from_root(REPO, "sglang-0.5.23")
    stack = REPO / "stacks" / "sglang-0.5.23"
    assert (layout.pins_file, layout.patches, layout.vendor, layout.wheelhouse) == (
        stack / "pins.toml",
        stack / "patches",
        stack / "vendor",
        stack / "wheelhouse",
    )
    assert layout.kernel_project == REPO / "kernel"  # shared
    assert Layout.from_root(REPO).pins_file == REPO / "pins.toml"  # the default, as ever


def test_a_stack_directory_that_pins_another_sglang_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "checkout"
    root.mkdir()
    shutil.copy(REPO / "pins.toml", root)
    (root / "stacks" / "sglang-0.5.99").mkdir(parents=True)
    shutil.copy(REPO / "pins.toml", root / "stacks" / "sglang-0.5.99")
    with pytest.raises(UserError, match=r"pins another sglang than sglang-0\.5\.99"):
        Layout.from_root(root, "sglang-0.5.99")


def test_mutation_testing_copies_every_stacks_own_files() -> None:
    """mutmut runs the tests in a copy of the checkout made from [tool.mutmut] also_copy:
    a stack whose tracked files are not listed there fails its tests under mutmut only
    (and every mutant they reach then counts as killed)."""
    toplevel = subprocess.run(
        ["git", "rev-parse", "--show-toplevel"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    if toplevel != str(REPO.resolve()):
        # mutmut's own copy (mutants/, ignored by git): it holds only what also_copy lists.
        pytest.skip("not a git checkout's top: nothing here is tracked")
    also_copy = read_toml(REPO / "pyproject.toml")["tool"]["mutmut"]["also_copy"]
    tracked = subprocess.run(
        ["git", "ls-files", "stacks"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    assert tracked, "git ls-files found no stack files"
    uncovered = [
        path
        for path in tracked
        if not any(
            path == entry or (entry.endswith("/") and path.startswith(entry)) for entry in also_copy
        )
    ]
    assert not uncovered, f"add to [tool.mutmut] also_copy: {uncovered}"


def test_mutation_testing_type_checks_exactly_the_mutated_files() -> None:
    """mutmut counts a mutant that mypy rejects as caught: mypy must read every mutated
    file (or those mutants run the tests for nothing), and no other (an error outside a
    mutated function stops mutmut's whole run)."""
    mutmut = read_toml(REPO / "pyproject.toml")["tool"]["mutmut"]
    checked = [word for word in mutmut["type_check_command"] if word.startswith("src/")]
    assert checked == mutmut["source_paths"]
