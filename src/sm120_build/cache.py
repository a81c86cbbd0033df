"""The relocatable cache: one lock per cache, scratch directories that a later run can clean
up, and entries that are stored once and checked against their own manifest on every reuse.

Everything that writes into the cache (fetch, vendor, audit, build) runs under the cache's
lock, so two runs sharing SM120_CACHE_DIR take turns instead of breaking each other.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .console import say
from .errors import UserError
from .layout import CACHE_ENV

# Scratch directories are named .sm120-tmp-<pid>-<what>-<random>: a name no other program
# uses, so that cleaning up after a killed run never touches another program's files.
SCRATCH_PREFIX = ".sm120-tmp-"
_SCRATCH_NAME = re.compile(rf"^{re.escape(SCRATCH_PREFIX)}\d+-")
# The file that marks a directory as this tool's cache; only a marked cache is cleaned.
MARKER = ".sm120-build-cache"
# The file inside each scratch directory that says this tool made it (and which process):
# outside the cache (vendor/), only a directory holding it is ever removed as a leftover.
SCRATCH_MARKER = ".sm120-scratch"
MANIFEST = "MANIFEST.sha256"
_SCRATCH_DEPTH = 3  # cache/, cache/<kind>/, cache/<kind>/<sub>/ hold scratch directories


def digest(*parts: object) -> str:
    """A cache key: sha256 of the parts as JSON."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def files_digest(paths: list[Path]) -> str:
    """A cache key of files' names and bytes (code that shapes what a cache entry holds)."""
    result = hashlib.sha256()
    for path in sorted(paths):
        result.update(path.name.encode() + b"\0" + path.read_bytes())
    return result.hexdigest()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@contextmanager
def exclusive_lock(path: Path, waiting_for: str) -> Iterator[None]:
    """flock `path` (never following a symlink there), saying whom we wait for.

    The holder's pid and working directory (its checkout) are written into the lock file,
    so that the waiting message can name them.
    """
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UserError(f"{path} is a symbolic link; refusing to use it as a lock") from None
        raise UserError(f"cannot open the lock {path}: {exc.strerror}") from None
    with os.fdopen(descriptor, "r+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid, _, where = lock.read().strip().partition(" ")
            holder = f"pid {pid or 'unknown'}" + (f", in {where}" if where else "")
            say(f"waiting for {waiting_for} ({holder})")
            fcntl.flock(lock, fcntl.LOCK_EX)
        lock.seek(0)
        lock.truncate()
        lock.write(f"{os.getpid()} {Path.cwd()}\n")
        lock.flush()
        yield


def adopt_cache(cache: Path, force: bool) -> None:
    """Make `cache` this tool's cache: create it, or take an existing directory that is
    already marked, or holds nothing but the pip/ download cache this project's nox
    sessions keep there, or any with `force`. A directory other programs use (a shared
    SM120_CACHE_DIR pointed at /tmp, say) is not cleaned or written by mistake."""
    if cache.is_symlink() or (cache.exists() and not cache.is_dir()):
        raise UserError(f"{cache} is not a directory; set {CACHE_ENV} to a directory of its own")
    cache.mkdir(parents=True, exist_ok=True)
    marker = cache / MARKER
    if marker.is_file():
        return
    if any(entry.name != "pip" for entry in cache.iterdir()) and not force:
        raise UserError(
            f"{cache} is not empty and is not marked as an sm120-build cache ({MARKER}): "
            f"this tool would write into it and clean its scratch there. Point {CACHE_ENV} "
            "at a directory of its own, or pass --force to adopt this one."
        )
    marker.write_text(
        "This directory is the cache of sm120-build (sdists, the CUDA toolkit, built wheels "
        f"and modules).\nScratch directories here are named {SCRATCH_PREFIX}<pid>-...; the "
        "next run removes those an interrupted run left.\n"
    )


@contextmanager
def cache_lock(cache: Path, force: bool = False) -> Iterator[None]:
    """Hold the cache's lock; on taking it, remove what interrupted runs left behind."""
    adopt_cache(cache, force)
    with exclusive_lock(cache / ".lock", f"another sm120-build run using {cache}"):
        removed = clean_scratch(cache)
        if removed:
            say(
                f"removed {removed} scratch director{'y' if removed == 1 else 'ies'} "
                "left in the cache by an interrupted run"
            )
        yield


def clean_scratch(cache: Path) -> int:
    """Delete the scratch this tool made under `cache`, a cache it marked (adopt_cache).
    Only safe while holding the cache lock. Links are removed, never followed."""
    if not (cache / MARKER).is_file():
        return 0
    removed = 0
    level = [cache]
    for _ in range(_SCRATCH_DEPTH):
        below = []
        for directory in level:
            for entry in sorted(directory.iterdir()):
                if _SCRATCH_NAME.match(entry.name):
                    if entry.is_dir() and not entry.is_symlink():
                        shutil.rmtree(entry)
                    else:
                        entry.unlink()
                    removed += 1
                elif entry.is_dir() and not entry.is_symlink() and entry.name != "pip":
                    below.append(entry)
        level = below
    return removed


@contextmanager
def scratch_directory(parent: Path, what: str) -> Iterator[Path]:
    """A temporary directory that the next run removes if this one is killed."""
    parent.mkdir(parents=True, exist_ok=True)
    prefix = f"{SCRATCH_PREFIX}{os.getpid()}-{what}-"
    with tempfile.TemporaryDirectory(prefix=prefix, dir=parent) as path:
        (Path(path) / SCRATCH_MARKER).write_text(f"{os.getpid()}\n")
        yield Path(path)


def abandoned_scratch(entry: Path) -> bool:
    """Whether `entry` is a scratch directory this tool made (named so, a real directory
    holding SCRATCH_MARKER) whose process has ended: only then may it be removed."""
    match = re.match(rf"^{re.escape(SCRATCH_PREFIX)}(\d+)-", entry.name)
    if match is None or entry.is_symlink() or not (entry / SCRATCH_MARKER).is_file():
        return False
    pid = int(match.group(1))
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, another user's
    return False


# --- entries ---------------------------------------------------------------------------


def _manifest_lines(directory: Path) -> list[str]:
    lines = []
    for path in sorted(directory.rglob("*")):
        relative = path.relative_to(directory).as_posix()
        if relative == MANIFEST:
            continue
        if path.is_symlink():
            lines.append(f"link {os.readlink(path)}  {relative}\n")
        elif path.is_file():
            lines.append(f"{sha256_of(path)}  {relative}\n")
    return lines


def store_entry(staging: Path, entry: Path) -> None:
    """Move a finished staging directory to `entry`, with a manifest of what it holds.

    Rename-if-absent: when the entry appeared meanwhile, the existing one is kept.
    """
    (staging / MANIFEST).write_text("".join(_manifest_lines(staging)))
    entry.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(staging, entry)
    except OSError as exc:
        if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise
        shutil.rmtree(staging)


def _link_leaves(entry: Path) -> str | None:
    """The first link inside `entry` that resolves outside it, if any."""
    root = entry.resolve()
    for path in entry.rglob("*"):
        if path.is_symlink() and not path.resolve().is_relative_to(root):
            return path.relative_to(entry).as_posix()
    return None


def verified_entry(entry: Path, what: str) -> Path | None:
    """`entry` when its files match its manifest; otherwise discard it (saying so) -> None.

    An entry that is itself a link, or holds a link leading out of it, is discarded too:
    the cache is a directory others may write, and nothing outside the entry is vouched
    for by its manifest."""
    if entry.is_symlink():
        say(f"cached {what} at {entry} is a symbolic link; removing the link, not following it")
        entry.unlink()
        return None
    if not entry.is_dir():
        return None
    manifest = entry / MANIFEST
    try:
        recorded = manifest.read_text().splitlines(keepends=True) if manifest.is_file() else None
    except UnicodeDecodeError:
        recorded = []
    leaving = _link_leaves(entry)
    if recorded == _manifest_lines(entry) and leaving is None:
        return entry
    reason = (
        f"holds a link leading out of it ({leaving})"
        if leaving is not None
        else "has no manifest"
        if recorded is None
        else "does not match its manifest"
    )
    say(f"cached {what} at {entry} {reason}; discarding it and building it again")
    shutil.rmtree(entry)
    return None


def cached_wheel(entry: Path, what: str) -> Path | None:
    """The wheel of a cache entry that still matches its manifest."""
    if verified_entry(entry, what) is None:
        return None
    found = sorted(entry.glob("*.whl"))
    return found[0] if len(found) == 1 else None


def store_wheel(built: Path, entry: Path, extra: dict[str, str] | None = None) -> Path:
    """Move a fresh wheel (and side files) into its cache entry, with a manifest."""
    with scratch_directory(entry.parent, "entry") as scratch:
        staging = scratch / "entry"
        staging.mkdir()
        shutil.move(built, staging / built.name)
        for name, text in (extra or {}).items():
            (staging / name).write_text(text)
        store_entry(staging, entry)
    return entry / built.name
