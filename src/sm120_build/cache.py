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
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .console import say
from .errors import UserError

SCRATCH_PREFIX = ".tmp-"
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

    The holder's pid is written into the lock file so the waiting message can name it.
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
            holder = lock.read().strip() or "unknown"
            say(f"waiting for {waiting_for} (pid {holder})")
            fcntl.flock(lock, fcntl.LOCK_EX)
        lock.seek(0)
        lock.truncate()
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        yield


@contextmanager
def cache_lock(cache: Path) -> Iterator[None]:
    """Hold the cache's lock; on taking it, remove what interrupted runs left behind."""
    cache.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(cache / ".lock", f"another sm120-build run using {cache}"):
        removed = clean_scratch(cache)
        if removed:
            say(
                f"removed {removed} scratch director{'y' if removed == 1 else 'ies'} "
                "left in the cache by an interrupted run"
            )
        yield


def clean_scratch(cache: Path) -> int:
    """Delete scratch directories under `cache`. Only safe while holding the cache lock."""
    removed = 0
    level = [cache]
    for _ in range(_SCRATCH_DEPTH):
        below = []
        for directory in level:
            for entry in sorted(directory.iterdir()) if directory.is_dir() else []:
                if entry.name.startswith(SCRATCH_PREFIX):
                    shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
                    removed += 1
                elif entry.is_dir() and not entry.is_symlink() and entry.name != "pip":
                    below.append(entry)
        level = below
    return removed


@contextmanager
def scratch_directory(parent: Path, what: str) -> Iterator[Path]:
    """A temporary directory that the next run removes if this one is killed."""
    parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"{SCRATCH_PREFIX}{what}-", dir=parent) as path:
        yield Path(path)


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


def verified_entry(entry: Path, what: str) -> Path | None:
    """`entry` when its files match its manifest; otherwise discard it (saying so) -> None."""
    if not entry.is_dir():
        return None
    manifest = entry / MANIFEST
    recorded = manifest.read_text().splitlines(keepends=True) if manifest.is_file() else None
    if recorded == _manifest_lines(entry):
        return entry
    reason = "has no manifest" if recorded is None else "does not match its manifest"
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
