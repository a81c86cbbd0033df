"""Fetch pinned sdists through pip's own configuration into a content-addressed cache.

pip already knows the user's index or mirror (pip.conf, PIP_* variables), so we never name
an index here. A cached file is used only after its sha256 matches the pin; a download
that does not match is discarded before anything else sees it. Wheels are fetched by pip
itself (`--only-binary`, `--require-hashes`: nothing of a wheel runs at download); sdists
through index.py, since pip would run an sdist's build backend to read its metadata.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from . import index
from .cache import scratch_directory, sha256_of
from .console import say
from .errors import UserError
from .pins import PINNED_WHEEL, Artifact, Upstream

FETCH_TIMEOUT = 120.0  # seconds for one request to an index


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


def fetch_pinned_wheel(spec: str, cache: Path, platforms: Sequence[str] = ()) -> Path:
    """A wheel given as a path, or as "NAME==VERSION --hash=sha256:HEX", downloaded through
    pip with --require-hashes into cache/wheels/<sha256>/ once. `platforms`: pip's --platform
    tags, for a wheel of another host than this one (pip takes each tag literally)."""
    if spec.endswith(".whl"):
        path = Path(spec).resolve()
        if not path.is_file():
            raise UserError(f"{spec} does not exist")
        return path
    match = PINNED_WHEEL.fullmatch(spec.strip())
    if match is None:
        raise UserError(
            f"{spec!r}: expected a .whl path, or a pinned requirement such as "
            "'flashinfer-jit-cache==0.6.3+cu130 --hash=sha256:<64 hex>'"
        )
    hashes: list[str] = re.findall(r"[0-9a-f]{64}", match["hashes"])
    for digest in hashes:  # a wheel of any of the pinned hashes, fetched before
        entry = cache / "wheels" / digest
        found = sorted(entry.glob("*.whl")) if entry.is_dir() else []
        if len(found) == 1 and sha256_of(found[0]) == digest:
            return found[0]
    with scratch_directory(cache / "wheels", "download") as scratch:  # makes cache/wheels
        say(f"fetching {match['requirement']} through pip")
        (scratch / "requirements.txt").write_text(" ".join(spec.split()) + "\n")
        result = pip_download(
            scratch / "out",
            *(option for tag in platforms for option in ("--platform", tag)),
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
        digest = sha256_of(wheels[0])
        if digest not in hashes:  # pip checked it; so do we
            raise UserError(f"{wheels[0].name} does not match its pinned sha256")
        entry = cache / "wheels" / digest
        if entry.exists():
            shutil.rmtree(entry)
        entry.mkdir()
        return Path(shutil.move(str(wheels[0]), entry / wheels[0].name))


def cached_path(artifact: Artifact, sdists: Path) -> Path:
    return sdists / artifact.sha256 / artifact.file


def cached_sdist_path(upstream: Upstream, sdists: Path) -> Path:
    return cached_path(upstream.source, sdists)


def fetch_sdist(upstream: Upstream, sdists: Path) -> Path:
    """The verified file the vendor tree of `upstream` is made from (its sdist, or its first
    wheel), downloaded only when the cache lacks it."""
    return fetch_artifact(upstream, upstream.source, sdists)


def fetch_artifact(upstream: Upstream, artifact: Artifact, sdists: Path) -> Path:
    """Return the verified `artifact` of `upstream`, downloading it only when the cache lacks
    it.

    Located in the places pip is configured to look and downloaded by name (index.py), never
    through `pip download`, which would run an sdist's build backend to read its metadata;
    nothing of a file whose sha256 differs from the pin is kept."""
    target = cached_path(artifact, sdists)
    if target.is_file():
        if sha256_of(target) == artifact.sha256:
            return target
        say(f"cached {target} does not match its pin; fetching it again")
        target.unlink()

    sources = index.pip_sources()
    say(f"fetching {artifact.file} ({upstream.project}=={upstream.version}) through pip's sources")
    links = [
        link
        for link in index.project_links(sources, upstream.project, FETCH_TIMEOUT)
        if link.name == artifact.file
    ]
    if not links:
        raise UserError(
            f"no {artifact.file} for {upstream.project}=={upstream.version} in "
            f"{sources.describe()} (pip's configuration: `pip config list`). Check that pip "
            "reaches your package index, and the file name in pins.toml."
        )
    mismatches: list[str] = []
    with scratch_directory(sdists, "download") as scratch:  # makes sdists/
        for link in links:
            if link.sha256 is not None and link.sha256 != artifact.sha256:
                mismatches.append(link.sha256)  # the index says so: not even downloaded
                continue
            got = index.download(link, scratch / artifact.file, sources, FETCH_TIMEOUT)
            if got == artifact.sha256:
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(scratch / artifact.file, target)
                return target
            mismatches.append(got)
    raise UserError(
        f"sha256 mismatch for {artifact.file} ({upstream.project}=={upstream.version}): the "
        f"index serves a file whose hash is not the pinned one.\n"
        f"  Expected sha256 {artifact.sha256}\n"
        + "".join(f"  Got      sha256 {digest}\n" for digest in dict.fromkeys(mismatches))
        + "Nothing of it was kept, unpacked or run. Fix the index, or the pin in pins.toml."
    )
