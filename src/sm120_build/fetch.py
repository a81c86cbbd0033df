"""Fetch pinned sdists through pip's own configuration into a content-addressed cache.

pip already knows the user's index or mirror (pip.conf, PIP_* variables), so we never name
an index here. A cached file is used only after its sha256 matches the pin; a download
that does not match is discarded before anything else sees it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from .cache import scratch_directory, sha256_of
from .console import say
from .errors import UserError
from .pins import Upstream


def pip_download(dest: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    """`pip download --no-deps ARGUMENTS` into dest, through pip's own configuration."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            *arguments,
            "--dest",
            str(dest),
        ],
        capture_output=True,
        text=True,
    )


_PINNED_WHEEL = re.compile(
    r"(?P<requirement>[A-Za-z0-9_.-]+==\S+)\s+--hash=sha256:(?P<sha>[0-9a-f]{64})"
)


def fetch_pinned_wheel(spec: str, cache: Path) -> Path:
    """A wheel given as a path, or as "NAME==VERSION --hash=sha256:HEX", downloaded through
    pip with --require-hashes into cache/wheels/<sha256>/ once."""
    if spec.endswith(".whl"):
        path = Path(spec).resolve()
        if not path.is_file():
            raise UserError(f"{spec} does not exist")
        return path
    match = _PINNED_WHEEL.fullmatch(spec.strip())
    if match is None:
        raise UserError(
            f"{spec!r}: expected a .whl path, or a pinned requirement such as "
            "'flashinfer-jit-cache==0.6.3+cu130 --hash=sha256:<64 hex>'"
        )
    entry = cache / "wheels" / match["sha"]
    found = sorted(entry.glob("*.whl")) if entry.is_dir() else []
    if len(found) == 1 and sha256_of(found[0]) == match["sha"]:
        return found[0]
    cache.joinpath("wheels").mkdir(parents=True, exist_ok=True)
    with scratch_directory(cache / "wheels", "download") as scratch:
        say(f"fetching {match['requirement']} through pip")
        (scratch / "requirements.txt").write_text(f"{spec.strip()}\n")
        result = pip_download(
            scratch / "out",
            "--only-binary",
            ":all:",
            "--require-hashes",
            "--requirement",
            str(scratch / "requirements.txt"),
        )
        wheels = sorted((scratch / "out").glob("*.whl"))
        if result.returncode != 0 or len(wheels) != 1:
            raise UserError(
                f"pip could not download {match['requirement']}:\n{result.stderr.strip()[-2000:]}"
            )
        if entry.exists():
            shutil.rmtree(entry)
        entry.mkdir()
        return Path(shutil.move(str(wheels[0]), entry / wheels[0].name))


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
    with scratch_directory(sdists, "download") as scratch:
        say(f"fetching {upstream.project}=={upstream.version} (sdist) through pip")
        # pip checks the hash right after downloading, before it unpacks the sdist or runs
        # its build backend, so an sdist that does not match the pin never runs.
        requirements = scratch / "requirements.txt"
        requirements.write_text(
            f"{upstream.project}=={upstream.version} --hash=sha256:{upstream.sha256}\n"
        )
        result = pip_download(
            scratch / "out",
            "--no-binary",
            upstream.project,
            "--require-hashes",
            "--requirement",
            str(requirements),
        )
        if result.returncode != 0:
            if "THESE PACKAGES DO NOT MATCH THE HASHES" in result.stderr:
                raise UserError(
                    f"sha256 mismatch for {upstream.sdist} ({upstream.project}=="
                    f"{upstream.version}): the index serves a file whose hash is not the "
                    f"pinned {upstream.sha256}.\n"
                    f"{_hash_lines(result.stderr)}\n"
                    "pip refused it before unpacking or running anything. Fix the index, or "
                    "the pin in pins.toml."
                )
            raise UserError(
                f"pip could not download {upstream.project}=={upstream.version}:\n"
                f"{result.stderr.strip()}\n"
                "Check that pip reaches your package index (pip config list)."
            )
        downloaded = scratch / "out" / upstream.sdist
        if not downloaded.is_file():
            got = ", ".join(sorted(os.listdir(scratch / "out"))) or "nothing"
            raise UserError(
                f"pip downloaded {got}, not the pinned {upstream.sdist}; "
                "check the sdist file name in pins.toml"
            )
        if sha256_of(downloaded) != upstream.sha256:  # pip checked it; so do we
            raise UserError(f"{downloaded.name} does not match its pin after download")
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(downloaded, target)
    return target


def _hash_lines(stderr: str) -> str:
    """pip's 'Expected sha256 ... Got ...' lines, which name both hashes."""
    return "\n".join(
        line.rstrip() for line in stderr.splitlines() if re.match(r"\s+(Expected|Got) ", line)
    )
