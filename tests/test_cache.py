"""The cache's lock, scratch directories, verified entries and the private source path."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sm120_build.cache import (
    MANIFEST,
    MARKER,
    adopt_cache,
    cache_lock,
    exclusive_lock,
    scratch_directory,
    store_entry,
    verified_entry,
)
from sm120_build.errors import UserError
from sm120_build.jit_cache.sources import _private_directory


def test_a_planted_symlink_is_never_used_as_a_lock(tmp_path: Path) -> None:
    (tmp_path / "lock").symlink_to(tmp_path / "victim")
    with pytest.raises(UserError, match="symbolic link"), exclusive_lock(tmp_path / "lock", "x"):
        pass
    assert not (tmp_path / "victim").exists()


def test_a_waiting_run_names_the_holders_pid_and_checkout(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from sm120_build.cache import cache_lock\n"
            f"with cache_lock(Path({str(tmp_path)!r})):\n"
            "    print('held', flush=True); time.sleep(2)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    started = time.monotonic()
    with cache_lock(tmp_path):
        waited = time.monotonic() - started
    holder.wait()
    holder.stdout.close()
    assert waited > 0.5
    assert f"(pid {holder.pid}, in {Path.cwd()})" in capfd.readouterr().err


def test_the_next_run_removes_what_an_interrupted_one_left(tmp_path: Path) -> None:
    adopt_cache(tmp_path, force=False)
    with scratch_directory(tmp_path / "artifacts" / "sglang", "entry") as scratch:
        left = scratch
        os.rename(scratch, scratch.with_name(scratch.name + "-killed"))  # as if never cleaned
    assert not left.exists()
    leftovers = list((tmp_path / "artifacts" / "sglang").glob(".sm120-tmp-*"))
    assert leftovers
    with cache_lock(tmp_path):
        pass
    assert not list((tmp_path / "artifacts" / "sglang").glob(".sm120-tmp-*"))


def test_a_shared_cache_directory_keeps_other_programs_files(tmp_path: Path) -> None:
    """A cache pointed at a directory others use: their .tmp-* files are not ours to delete
    (every run used to delete them), and an unmarked, non-empty directory is not adopted
    without --force."""
    shared = tmp_path / "shared"
    (shared / "sub").mkdir(parents=True)
    (shared / ".tmp-x").write_text("another program's\n")
    (shared / "sub" / ".tmp-y").mkdir()
    with (
        pytest.raises(UserError, match=r"not marked as an sm120-build cache.*--force"),
        cache_lock(shared),
    ):
        pass
    assert not (shared / ".lock").exists()
    with cache_lock(shared, force=True):
        pass
    assert (shared / ".tmp-x").read_text() == "another program's\n"
    assert (shared / "sub" / ".tmp-y").is_dir()
    with cache_lock(shared):  # marked now: no --force needed again
        pass
    assert (shared / ".tmp-x").is_file()


def test_a_cache_holding_only_the_nox_sessions_pip_cache_is_adopted(tmp_path: Path) -> None:
    """The noxfile points pip's download cache into the cache before the tool first runs."""
    (tmp_path / "pip" / "http").mkdir(parents=True)
    with cache_lock(tmp_path):
        pass
    assert (tmp_path / MARKER).is_file() and (tmp_path / "pip" / "http").is_dir()


def test_a_linked_cache_entry_is_never_followed(tmp_path: Path) -> None:
    """A module-cache entry that is a link (or holds a link leading out of it) was followed
    out of the cache and used."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "module.zip").write_bytes(b"planted")
    store_entry(outside, tmp_path / "real")  # a manifest that matches what it holds
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "linked").symlink_to(tmp_path / "real")
    assert verified_entry(cache / "linked", "module norm") is None
    assert not (cache / "linked").is_symlink() and (tmp_path / "real").is_dir()
    entry = cache / "entry"
    entry.mkdir()
    (entry / "module.zip").symlink_to(tmp_path / "real" / "module.zip")
    (entry / MANIFEST).write_text(f"link {tmp_path / 'real' / 'module.zip'}  module.zip\n")
    assert verified_entry(entry, "module norm") is None
    assert not entry.exists() and (tmp_path / "real" / "module.zip").is_file()


def test_a_damaged_cache_entry_is_discarded_with_a_message(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    staging = tmp_path / "staging"
    staging.mkdir()
    (staging / "demo-1.0-py3-none-any.whl").write_bytes(b"a whole wheel")
    store_entry(staging, tmp_path / "entry")
    assert verified_entry(tmp_path / "entry", "demo wheel") == tmp_path / "entry"
    (tmp_path / "entry" / "demo-1.0-py3-none-any.whl").write_bytes(b"a who")  # truncated
    assert verified_entry(tmp_path / "entry", "demo wheel") is None
    assert not (tmp_path / "entry").exists()
    assert "does not match its manifest; discarding it" in capfd.readouterr().err


def test_storing_keeps_an_entry_that_appeared_meanwhile(tmp_path: Path) -> None:
    for content in (b"first", b"second"):
        staging = tmp_path / "staging"
        staging.mkdir()
        (staging / "file").write_bytes(content)
        store_entry(staging, tmp_path / "entry")
    assert (tmp_path / "entry" / "file").read_bytes() == b"first"
    assert not (tmp_path / "staging").exists()


@pytest.mark.parametrize("make", ["open mode", "symlink"])
def test_the_source_directory_must_be_private_and_real(tmp_path: Path, make: str) -> None:
    path = tmp_path / "sm120-build-0123"
    if make == "open mode":
        path.mkdir(mode=0o755)
        path.chmod(0o755)
    else:
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UserError, match="not a private directory"):
        _private_directory(path)
    fresh = tmp_path / "sm120-build-4567"
    _private_directory(fresh)
    assert fresh.stat().st_mode & 0o777 == 0o700
