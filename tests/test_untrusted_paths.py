"""Untrusted input, second round: names read from config files never become paths outside
the directory they are meant for, and no command deletes what it cannot prove it made."""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sm120_build.errors import UserError
from sm120_build.pins import load as load_pins
from sm120_build.profiles import load as load_profiles

from .conftest import REPO, fixture_upstream, make_tarball

REAL_PINS = (REPO / "pins.toml").read_text()


def _project(tmp_path: Path, pins_text: str) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "pins.toml").write_text(pins_text)
    shutil.copytree(REPO / "patches", root / "patches")
    return root


def _vendor(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sm120_build", "vendor"],
        cwd=root,
        env=dict(os.environ, SM120_CACHE_DIR=str(root / ".cache")),
        capture_output=True,
        text=True,
    )


def test_an_upstream_name_that_climbs_out_of_vendor_is_refused(tmp_path: Path) -> None:
    """[upstream."../victim"] made `vendor` delete <root>/victim as a half-made tree."""
    root = _project(tmp_path, REAL_PINS.replace("[upstream.sglang]", '[upstream."../victim"]'))
    (root / "victim").mkdir()
    (root / "victim" / "data.txt").write_text("keep me")
    result = _vendor(root)
    assert result.returncode == 1
    assert "upstream '../victim' is not a plain name" in result.stderr
    assert (root / "victim" / "data.txt").read_text() == "keep me"
    assert not (root / "vendor").exists()


def test_an_sdist_name_that_climbs_out_of_the_cache_is_refused(tmp_path: Path) -> None:
    """sdist = "../../../victim.txt" made `vendor` delete that file as a cached sdist whose
    hash did not match."""
    root = _project(
        tmp_path,
        REAL_PINS.replace(
            'sdist = "flashinfer_python-0.6.3.tar.gz"', 'sdist = "../../../victim.txt"'
        ),
    )
    victim = root / "victim.txt"
    victim.write_text("keep me")
    result = _vendor(root)
    assert result.returncode == 1
    assert "sdist '../../../victim.txt' is not the file name of an sdist" in result.stderr
    assert victim.read_text() == "keep me"


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('project = "sglang"', 'project = "sglang/../x"', "project 'sglang/../x' is not a project"),
        ('version = "0.5.9"', 'version = "0.5.9/.."', "version '0.5.9/..' is not a PEP 440"),
        (
            'sdist = "sglang-0.5.9.tar.gz"',
            'sdist = "sglang-0.5.10.tar.gz"',
            "not the file name of an sdist of sglang 0.5.9",
        ),
        ("[companions.flashinfer-cubin]", '[companions."a/../b"]', "is not a project name"),
    ],
)
def test_every_pinned_name_that_becomes_a_path_is_checked(
    tmp_path: Path, old: str, new: str, message: str
) -> None:
    assert old in REAL_PINS
    path = tmp_path / "pins.toml"
    path.write_text(REAL_PINS.replace(old, new, 1))
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(".", r"\.")):
        load_pins(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[modules."../x"]\ncall = "a:b"\n', "module recipe '../x' is not a plain name"),
        (
            '[modules.x]\ncall = "a:b"\n[profiles."a/b"]\nmodules = ["x"]\n',
            "profile 'a/b' is not a plain name",
        ),
        ('include = ["../../etc/profiles.toml"]\n', "included file '../../etc/profiles.toml'"),
    ],
)
def test_names_in_profiles_are_plain(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "profiles.toml"
    path.write_text(text)
    with pytest.raises(UserError, match=message.replace(".", r"\.")):
        load_profiles(path)


LIMIT = 64 * 1024  # bytes a file of the fetch may reach: as if the disk were full there


def _limited_file_size() -> None:
    """In the child: writes past LIMIT fail with an OSError that names no file (EFBIG), as a
    full disk's ENOSPC does, instead of killing the process."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


def test_a_full_disk_while_fetching_names_the_path_and_keeps_nothing(tmp_path: Path) -> None:
    """It printed "unexpected OSError ... This is a bug", without the path."""
    links = tmp_path / "links"
    links.mkdir()
    sdist = make_tarball(
        links / "demo-1.0.tar.gz", {"big.bin": os.urandom(4 * LIMIT).hex()}, top="demo-1.0"
    )
    upstream = fixture_upstream(sdist)
    root = tmp_path / "project"
    (root / "patches" / "demo").mkdir(parents=True)
    (root / "patches" / "demo" / "series").write_text("")
    (root / "pins.toml").write_text(
        f'[upstream.demo]\nproject = "demo"\nversion = "1.0"\nsdist = "{sdist.name}"\n'
        f'sha256 = "{upstream.sha256}"\ngit_url = ""\ngit_tag = ""\ngit_commit = ""\n'
        '[toolkit]\nrequirement = "cuda-toolkit==13.0.2"\n'
    )
    env = dict(
        os.environ,
        SM120_CACHE_DIR=str(root / ".cache"),
        PIP_CONFIG_FILE=os.devnull,
        PIP_FIND_LINKS=str(links),
        PIP_NO_INDEX="1",
    )
    result = subprocess.run(
        [sys.executable, "-m", "sm120_build", "vendor"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        preexec_fn=_limited_file_size,
    )
    assert result.returncode == 1, result.stderr
    sdists = root / ".cache" / "sdists"
    assert f"error: cannot write {sdists}/" in result.stderr
    assert f"/{sdist.name} ({sdist.stat().st_size} bytes): File too large; nothing of it" in (
        result.stderr
    )
    assert "This is a bug" not in result.stderr
    assert [p for p in sdists.rglob("*") if p.is_file()] == []
