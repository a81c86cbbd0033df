"""Bad input anywhere gives one clear line and exit status 1, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sm120_build.audit import load_waivers
from sm120_build.errors import UserError, exit_status
from sm120_build.gitrepo import export_tree
from sm120_build.pins import load as load_pins
from sm120_build.toolkit import probe

from .conftest import REPO


def cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SM120_CACHE_DIR=str(root / ".cache"))
    return subprocess.run(
        [sys.executable, "-m", "sm120_build", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("[upstream.x\n", "is not valid TOML"),
        ("upstream = 3\n", r"\[upstream\] must be a table"),
        ("[upstream.x]\nproject = 1\n", "lacks"),
        (
            (REPO / "pins.toml")
            .read_text()
            .replace('[toolkit]\nrequirement = "', '[toolkit]\nx = "'),
            "requirement is missing",
        ),
        (
            (REPO / "pins.toml").read_text().replace('version = "0.6.3"\nsha256 = [', "sha256 = ["),
            r"companions.flashinfer-cubin\] needs version",
        ),
    ],
)
def test_malformed_pins_are_user_errors(tmp_path: Path, text: str, complaint: str) -> None:
    (tmp_path / "pins.toml").write_text(text)
    with pytest.raises(UserError, match=complaint):
        load_pins(tmp_path / "pins.toml")


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("[[waiver]\n", "is not valid TOML"),
        ('waiver = ["x"]\n', r"waiver 1 is 'x', not a table"),
        ("waiver = 3\n", "not a list"),
        ('[[waiver]]\nupstream = "sglang"\nfile = 3\n', "lacks file, condition, reason"),
    ],
)
def test_malformed_waivers_are_user_errors(tmp_path: Path, text: str, complaint: str) -> None:
    (tmp_path / "audit-waivers.toml").write_text(text)
    with pytest.raises(UserError, match=complaint):
        load_waivers(tmp_path / "audit-waivers.toml")


def test_malformed_pins_through_the_command_line_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "pins.toml").write_text("[upstream.x\n")
    result = cli(tmp_path, "vendor")
    assert result.returncode == 1
    assert result.stderr.startswith("error: ") and "is not valid TOML" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_non_executable_nvcc_is_refused(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").write_text("not a program\n")
    with pytest.raises(UserError, match="is not executable"):
        probe(tmp_path)


def test_an_nvcc_that_fails_is_refused_with_its_status(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = --version ]; then echo "Cuda compilation tools, release 13.0, V13.0.88"; '
        'else echo "broken install" >&2; exit 3; fi\n'
    )
    nvcc.chmod(0o755)
    with pytest.raises(UserError, match=r"--list-gpu-code` exited with status 3:\nbroken install"):
        probe(tmp_path)


def test_git_archive_failure_is_a_user_error(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path / "repo")], check=True)
    with pytest.raises(UserError, match=r"git archive HEAD failed"):
        export_tree(tmp_path / "repo", tmp_path / "out")


def test_outside_a_checkout_is_a_clear_error(tmp_path: Path) -> None:
    result = cli(tmp_path, "vendor")
    assert result.returncode == 1
    assert "pins.toml not found" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_cache_path_that_is_a_file_is_named(tmp_path: Path) -> None:
    """It used to end in "unexpected FileExistsError ... This is a bug"."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "pins.toml").write_text((REPO / "pins.toml").read_text())
    (root / ".cache").write_text("a file where the cache directory should be\n")
    result = cli(root, "vendor")
    assert result.returncode == 1
    assert "is not a directory; set SM120_CACHE_DIR" in result.stderr
    assert "This is a bug" not in result.stderr and "Traceback" not in result.stderr


def test_a_file_the_command_cannot_write_is_named(tmp_path: Path) -> None:
    """An OSError with a file name (here: --json into a directory that does not exist) is
    the user's to fix, not "a bug"."""
    missing = tmp_path / "no-such-dir" / "report.json"

    def write() -> int:
        missing.write_text("{}")
        return 0

    assert exit_status(write, verbose=False) == 1


def test_an_unexpected_failure_is_one_line_unless_verbose(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def broken() -> int:
        raise ValueError("nobody saw this coming")

    assert exit_status(broken, verbose=False) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "error: unexpected ValueError: nobody saw this coming",
        "This is a bug in sm120-build; run again with --verbose for the traceback.",
    ]
    with pytest.raises(ValueError):
        exit_status(broken, verbose=True)
