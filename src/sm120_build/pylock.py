"""wheelhouse/pylock.toml (PEP 751): node-lock.txt's closure as a lock file that pip
(`pip install -r pylock.toml`, 26.1 and later) and uv (`uv pip sync pylock.toml`) install.

A pylock.toml names the URL of every file it pins, so it is resolved from the index the
nodes install from, once the closure is published there (`publish --with-dependencies`):
uv's own export (`uv pip compile --format pylock.toml`), for node-lock.txt's target, from
that index alone. It must pin exactly node-lock.txt's packages and files: a resolution that
differs in one version or hash is refused, and nothing is written.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from .console import say, step
from .errors import UserError
from .node_lock import LOCK_FILE, read_lock, uv_compile
from .publish import check_url

PYLOCK_FILE = "pylock.toml"


def pinned_files(data: dict[str, Any]) -> dict[str, tuple[str, set[str]]]:
    """project -> (version, the sha256 of each file) of a parsed pylock.toml."""
    found = {}
    for package in data.get("packages", []):
        files = [*package.get("wheels", []), *([package["sdist"]] if "sdist" in package else [])]
        hashes = {str(entry.get("hashes", {}).get("sha256")) for entry in files}
        found[str(canonicalize_name(package["name"]))] = (str(package.get("version")), hashes)
    return found


def write_pylock(wheelhouse: Path, index_url: str) -> Path:
    """pylock.toml beside node-lock.txt, resolved from `index_url` alone."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib

    check_url(index_url, "--pylock-index")
    target, pins = read_lock(wheelhouse)
    locked = {pin.name: (pin.version, set(pin.hashes)) for pin in pins}
    with tempfile.TemporaryDirectory(prefix="sm120-pylock-") as scratch:
        resolved = Path(scratch) / PYLOCK_FILE
        with step(f"resolving {LOCK_FILE}'s closure from {index_url} with uv"):
            result = uv_compile(
                Path(scratch),
                target,
                pins,
                "--no-deps",  # the lock names every package already
                "--format",
                "pylock.toml",
                "--index-url",
                index_url,
                "--output-file",
                str(resolved),
            )
        if result.returncode != 0:
            raise UserError(
                f"uv could not resolve {LOCK_FILE}'s packages from {index_url} (publish the "
                "closure there first: publish --with-dependencies):\n"
                + result.stderr.strip()[-3000:]
            )
        found = pinned_files(tomllib.loads(resolved.read_text()))
        problems = [
            f"{name}: {LOCK_FILE} pins {version}, {PYLOCK_FILE} "
            + (f"{found[name][0]}" if name in found else "nothing")
            for name, (version, _) in sorted(locked.items())
            if name not in found or found[name][0] != version
        ]
        problems += [
            f"{name}: a file {LOCK_FILE} does not pin "
            f"({', '.join(sorted(hashes - locked[name][1]))})"
            for name, (_, hashes) in sorted(found.items())
            if name in locked and not hashes <= locked[name][1]
        ]
        problems += [f"{name}: not in {LOCK_FILE}" for name in sorted(set(found) - set(locked))]
        if problems:
            raise UserError(
                f"{index_url} does not serve {LOCK_FILE}'s files as locked; nothing was "
                "written:\n  " + "\n  ".join(problems)
            )
        partial = wheelhouse / f".{PYLOCK_FILE}.partial"
        partial.write_text(resolved.read_text())
        os.replace(partial, wheelhouse / PYLOCK_FILE)
    say(f"wrote {wheelhouse / PYLOCK_FILE}: {len(found)} packages from {index_url}")
    return wheelhouse / PYLOCK_FILE
