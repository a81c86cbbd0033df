"""The noxfile's session docstrings (what `nox -l` and `-- --help` users read first) name every
option the command behind each session takes, as its own argparse parser defines them."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from .conftest import REPO

# session -> the command line whose --help lists its options.
COMMANDS = {
    "vendor": ["-m", "sm120_build", "vendor"],
    "export_patches": ["-m", "sm120_build", "export-patches"],
    "bump": ["-m", "sm120_build", "bump"],
    "audit_gates": ["-m", "sm120_build", "audit-gates"],
    "build_wheels": ["-m", "sm120_build", "build-wheels"],
    "plan_shards": ["-m", "sm120_build", "plan-shards"],
    "build_shard": ["-m", "sm120_build", "build-shard"],
    "shard_matrix": ["-m", "sm120_build", "shard-matrix"],
    "merge_shards": ["-m", "sm120_build", "merge-shards"],
    "publish": ["-m", "sm120_build", "publish"],
    "lock_node": ["-m", "sm120_build", "lock-node"],
    "derive_profiles": ["-m", "sm120_build", "derive-profiles"],
    "bench": ["-m", "sm120_build.bench"],
    "verify_gpu": ["-m", "sm120_build.node.verify"],
    "node_check": ["-m", "sm120_build.node.check"],
    "bench_gpu": ["-m", "sm120_build.node.bench_gpu"],
}
# Passed by the session itself, not by the user.
SET_BY_THE_SESSION = {"--help", "--install"}


@cache
def docstrings() -> dict[str, str]:
    """Each session's help as nox shows it (the noxfile adds the options every command takes
    and the profile list to some)."""
    import nox.registry

    spec = importlib.util.spec_from_file_location("noxfile_under_test", REPO / "noxfile.py")
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    return {name.split("-")[0]: func.__doc__ or "" for name, func in nox.registry.get().items()}


def test_every_session_has_help_text() -> None:
    assert all(docstrings().values()), [n for n, d in docstrings().items() if not d]
    assert set(COMMANDS) <= set(docstrings())


@pytest.mark.parametrize("session", sorted(COMMANDS))
def test_the_docstring_names_every_option(session: str) -> None:
    result = subprocess.run(
        [sys.executable, *COMMANDS[session], "--help"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    listed = re.findall(r"^  (?:-\w, )?(--[a-z][a-z0-9-]*)", result.stdout, re.M)
    options = set(listed) - SET_BY_THE_SESSION
    missing = sorted(o for o in options if o not in docstrings()[session])
    assert not missing, f"{session}'s docstring does not name {missing}"


def nox_run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """nox on this checkout's noxfile, with its environments under tmp_path."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "nox",
            "-f",
            str(REPO / "noxfile.py"),
            "--envdir",
            str(tmp_path / "envs"),
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )


@pytest.mark.parametrize(
    "session", ["tests_fast-3.11", "tests_fast-3.13", "build_wheels", "bump", "tests", "lint"]
)
def test_help_creates_and_installs_nothing(tmp_path: Path, session: str) -> None:
    """`-- --help` used to create the session's venv (30-90 s), install the project (leaving
    build/ and an .egg-info in the checkout) and warn that a command ran outside it."""
    leftovers = [REPO / "build", *REPO.glob("src/*.egg-info")]
    before = {path: path.exists() for path in leftovers}
    result = nox_run(tmp_path, "-s", session, "--", "--help")
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "envs").exists()
    assert "not installed into the virtualenv" not in result.stderr
    assert "not found" not in result.stderr
    assert {path: path.exists() for path in leftovers} == before
    assert "usage:" in result.stdout or session.startswith(("tests", "lint"))


def test_nox_lists_whole_first_sentences() -> None:
    """nox -l shows a docstring's first line: each is a whole sentence, and says what is
    built (not "sm_120a", not "the three wheels")."""
    for name, doc in docstrings().items():
        first = doc.strip().split("\n")[0]
        assert first.endswith((".", ")")), f"{name}: {first!r}"
    build = docstrings()["build_wheels"]
    assert "three" not in build and "sm_120a" not in build
    assert "the default stack's" in build and "comm" in build
    assert "sm_120a" not in (REPO / "noxfile.py").read_text().split('"""')[1]


@pytest.mark.slow
def test_bump_passes_its_exit_status_through_nox(tmp_path: Path) -> None:
    """A candidate that cannot be evaluated is status 3, through nox too (nox made every
    failure 1, the status for "refresh needed")."""
    result = nox_run(tmp_path, "-s", "bump", "--", "not-a-candidate")
    assert result.returncode == 3, result.stdout + result.stderr
    assert "give a candidate as PROJECT==VERSION" in result.stderr


@pytest.mark.slow
def test_a_second_run_installs_nothing(tmp_path: Path) -> None:
    first = nox_run(tmp_path, "-s", "lint", "--install-only")
    assert first.returncode == 0, first.stderr
    assert "installing" in first.stderr
    second = nox_run(tmp_path, "-s", "lint", "--install-only")
    assert second.returncode == 0, second.stderr
    assert "holds these pins and this source already: not installing" in second.stderr
    assert "pip install" not in second.stderr
