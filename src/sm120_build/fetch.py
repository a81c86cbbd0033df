"""Fetch pinned sdists through pip's own configuration into a content-addressed cache.

pip already knows the user's index or mirror (pip.conf, PIP_* variables), so we never name
an index here. A cached file is used only after its sha256 matches the pin; a download
that does not match is discarded before anything else sees it.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from .console import say
from .errors import UserError
from .pins import Upstream


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cached_sdist_path(upstream: Upstream, sdists: Path) -> Path:
    return sdists / upstream.sha256 / upstream.sdist


def fetch_sdist(upstream: Upstream, sdists: Path) -> Path:
    """Return the verified sdist for `upstream`, downloading it only when the cache lacks it."""
    target = cached_sdist_path(upstream, sdists)
    if target.is_file():
        if sha256_of(target) == upstream.sha256:
            return target
        say(f"cached {target} does not match its pin; fetching it again")
        target.unlink()

    sdists.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="download-", dir=sdists) as scratch:
        say(f"fetching {upstream.project}=={upstream.version} (sdist) through pip")
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            upstream.project,
            f"{upstream.project}=={upstream.version}",
            "--dest",
            scratch,
        ]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise UserError(
                f"pip could not download {upstream.project}=={upstream.version}:\n"
                f"{result.stderr.strip()}\n"
                "Check that pip reaches your package index (pip config list)."
            )
        downloaded = Path(scratch) / upstream.sdist
        if not downloaded.is_file():
            got = ", ".join(sorted(os.listdir(scratch))) or "nothing"
            raise UserError(
                f"pip downloaded {got}, not the pinned {upstream.sdist}; "
                "check the sdist file name in pins.toml"
            )
        actual = sha256_of(downloaded)
        if actual != upstream.sha256:
            raise UserError(
                f"sha256 mismatch for {upstream.sdist}:\n"
                f"  expected {upstream.sha256}\n"
                f"  actual   {actual}\n"
                "The download was discarded. Your index serves a different file under this "
                "name; fix the index or the pin in pins.toml."
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(downloaded, target)
    return target
