"""Publish wheelhouse/ to an internal package index with twine, or as a static PEP 503 tree.

Uploading is idempotent: a file the index already serves with our sha256 is skipped, a file
it serves with other content stops the run before anything else is uploaded. Afterwards the
index's simple pages are read back and every file must be served with our sha256.
Credentials reach twine the way twine takes them (TWINE_USERNAME/TWINE_PASSWORD, a keyring,
~/.pypirc); this module never reads, prints or writes them.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import (
    canonicalize_name,
    parse_wheel_filename,
)

from .cache import scratch_directory, sha256_of
from .console import say
from .errors import UserError
from .index import Reader, page_links, server_of
from .node_lock import mirror_files, parse_pins
from .static_index import StaticFile, write_tree
from .sums import checked_wheels

DEFAULT_TIMEOUT = 120  # seconds: one request to the index, or one upload


def check_url(url: str, option: str) -> str:
    """Refuse a URL with credentials in it: nox echoes its command line."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https", "file") or not (parts.netloc or parts.path):
        raise UserError(f"{option} {url!r} is not an http(s) URL")
    if parts.username is not None or parts.password is not None:
        raise UserError(
            f"{option} carries credentials in the URL, which nox prints with its command line. "
            "Give them as TWINE_USERNAME/TWINE_PASSWORD, in a keyring or in ~/.pypirc."
        )
    return url


@dataclass(frozen=True)
class LocalWheel:
    path: Path
    project: str
    sha256: str


def local_wheels(wheelhouse: Path) -> list[LocalWheel]:
    """The wheelhouse's wheels, checked against its SHA256SUMS; each project its
    requirements.txt pins must have its wheel there (our own and the companions a build
    fetched), or a node that reaches only the internal index could not install."""
    requirements = wheelhouse / "requirements.txt"
    if not requirements.is_file():
        raise UserError(f"{requirements} is missing: run `nox -s build_wheels` first")
    wheels = [
        LocalWheel(path, str(canonicalize_name(parse_wheel_filename(path.name)[0])), digest)
        for path, digest in checked_wheels(wheelhouse).items()
    ]
    held = {wheel.project for wheel in wheels}
    lacking = [pin.name for pin in parse_pins(requirements.read_text()) if pin.name not in held]
    if lacking:
        raise UserError(
            f"{wheelhouse} holds no wheel of {', '.join(lacking)}, which requirements.txt pins "
            "(a wheelhouse built before the build fetched its companions): rebuild it with "
            "`nox -s build_wheels`"
        )
    return wheels


@contextmanager
def closure_wheels(wheelhouse: Path, cache: Path, wanted: bool) -> Iterator[list[LocalWheel]]:
    """With --with-dependencies, every file of wheelhouse/node-lock.txt for its target,
    fetched through pip with its pinned hash (for as long as the publishing takes)."""
    if not wanted:
        yield []
        return
    with scratch_directory(cache, "closure") as scratch:
        yield [
            LocalWheel(path, str(canonicalize_name(parse_wheel_filename(path.name)[0])), digest)
            for path in mirror_files(wheelhouse, scratch)
            for digest in [sha256_of(path)]
        ]


def _with(wheels: list[LocalWheel], more: list[LocalWheel]) -> list[LocalWheel]:
    names = {wheel.path.name for wheel in wheels}
    return wheels + [wheel for wheel in more if wheel.path.name not in names]


def twine_credentials(repository_url: str | None, repository: str | None) -> tuple[str, str] | None:
    """The username and password twine would use for this repository, if it has any."""
    from twine import exceptions, settings

    try:
        resolved = settings.Settings(
            repository_url=repository_url,
            repository_name=repository or "pypi",
            username=os.environ.get("TWINE_USERNAME"),
            password=os.environ.get("TWINE_PASSWORD"),
            non_interactive=True,
        )
        username, password = resolved.username, resolved.password
    except exceptions.TwineException:
        return None
    return (username, password) if username and password else None


def served_files(reader: Reader, index_url: str, project: str) -> dict[str, str]:
    """filename -> sha256 of what the index's simple page for `project` serves."""
    # urljoin drops the empty segments a URL already ending in "/" gets here.
    page_url = urllib.parse.urljoin(index_url + "/", f"{project}/")
    page = reader.get(page_url)
    if page is None:
        return {}
    files = {}
    for href in page_links(page):
        url = urllib.parse.urljoin(page_url, href)
        path, _, fragment = url.partition("#")
        name = urllib.parse.unquote(path.rsplit("/", 1)[-1])
        if fragment.startswith("sha256="):
            files[name] = fragment.removeprefix("sha256=")
        else:
            content = reader.get(path)
            files[name] = hashlib.sha256(content or b"").hexdigest()
    return files


def _twine(*args: str, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    # twine writes through rich, which wraps and cuts lines at the terminal's width (COLUMNS,
    # else 80 when not a terminal): a long path lost the wheel's name. Wide enough for any,
    # without colour; rich pads some lines to that width, so trailing blanks go.
    env = dict(os.environ, COLUMNS="10000")
    result = subprocess.run(
        [sys.executable, "-m", "twine", "--no-color", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    result.stdout = "\n".join(line.rstrip() for line in result.stdout.splitlines())
    result.stderr = "\n".join(line.rstrip() for line in result.stderr.splitlines())
    return result


def _upload_failure(output: str) -> str:
    http = re.search(r"HTTPError: (\d{3}) ([^\n]*?) from", output)
    if http and http.group(1) in ("401", "403"):
        return (
            f"the index rejected the credentials or their rights (HTTP {http.group(1)} "
            f"{http.group(2)}): check TWINE_USERNAME/TWINE_PASSWORD, your keyring or "
            "~/.pypirc"
        )
    if http:
        return f"the index answered HTTP {http.group(1)} {http.group(2)}"
    for marker, meaning in (
        ("Connection refused", "the connection was refused: is the index running at that URL?"),
        ("timed out", "the connection timed out"),
    ):
        if marker in output:
            return meaning
    lines = [line for line in output.splitlines() if line.strip()]
    return lines[-1] if lines else "twine failed without output"


def publish(
    wheelhouse: Path,
    repository_url: str | None,
    repository: str | None,
    index_url: str,
    timeout: float = DEFAULT_TIMEOUT,
    closure: list[LocalWheel] | None = None,
) -> None:
    index_url = check_url(index_url, "--index-url")
    if repository_url:
        check_url(repository_url, "--repository-url")
    wheels = _with(local_wheels(wheelhouse), closure or [])
    check = _twine("check", *(str(w.path) for w in wheels))
    if check.returncode != 0:
        output = check.stdout + check.stderr
        failed = [Path(name).name for name in re.findall(r"^Checking (.+?): FAILED", output, re.M)]
        raise UserError(
            f"twine check failed for {', '.join(failed) or 'a wheel'}; nothing was "
            f"uploaded. twine said:\n{output}"
        )

    target = (
        ["--repository-url", repository_url]
        if repository_url
        else ["--repository", repository or ""]
    )
    reader = Reader(timeout, twine_credentials(repository_url, repository))
    status: dict[str, str] = {}
    try:
        # Every file is looked up before any is uploaded: one the index serves with other
        # content stops the run with nothing uploaded.
        missing = []
        for wheel in wheels:
            served = served_files(reader, index_url, wheel.project)
            if wheel.path.name not in served:
                missing.append(wheel)
            elif served[wheel.path.name] != wheel.sha256:
                status[wheel.path.name] = (
                    f"on the index with OTHER content (sha256 {served[wheel.path.name]})"
                )
                raise UserError(
                    f"{index_url} already serves {wheel.path.name} with other "
                    f"content:\n  index sha256 {served[wheel.path.name]}\n"
                    f"  ours  sha256 {wheel.sha256}\n"
                    "Indexes do not allow replacing a file; nothing was uploaded."
                )
            else:
                status[wheel.path.name] = "already there (identical), skipped"
        for number, wheel in enumerate(missing, 1):
            say(f"uploading {wheel.path.name} ({number} of {len(missing)})")
            server = server_of(repository_url) if repository_url else f"repository {repository}"
            try:
                upload = _twine(
                    "upload",
                    "--non-interactive",
                    "--disable-progress-bar",
                    *target,
                    str(wheel.path),
                    timeout=timeout,
                )
            except subprocess.TimeoutExpired:
                raise UserError(
                    f"uploading {wheel.path.name} to {server} got no answer within "
                    f"{timeout:g} s (--timeout); is the index up and answering?"
                ) from None
            if upload.returncode != 0:
                raise UserError(
                    f"uploading {wheel.path.name} to {server} failed: "
                    f"{_upload_failure(upload.stdout + upload.stderr)}"
                )
            status[wheel.path.name] = "uploaded"
        for wheel in wheels:
            served = served_files(reader, index_url, wheel.project)
            if served.get(wheel.path.name) != wheel.sha256:
                raise UserError(
                    f"after uploading, {index_url} serves {wheel.path.name} with "
                    f"sha256 {served.get(wheel.path.name, 'nothing')}, not {wheel.sha256}"
                )
    finally:
        _summary(wheels, status, index_url)
    envelopes = sorted(wheelhouse.glob("*.intoto.jsonl"))
    if envelopes:
        say(
            f"{len(envelopes)} provenance envelopes not uploaded: an index takes distributions "
            "only. Nodes get them from a static tree (publish --static DIR: packages/ and "
            "locks/<digest>/) or from the wheelhouse"
        )


def _summary(wheels: list[LocalWheel], status: dict[str, str], index_url: str) -> None:
    say(f"summary for {index_url}:")
    for wheel in wheels:
        say(f"  {wheel.path.name}: {status.get(wheel.path.name, 'NOT on the index')}")


def write_static_index(
    wheelhouse: Path, destination: Path, closure: list[LocalWheel] | None = None
) -> Path:
    """Add the wheelhouse and `closure` to the static tree at `destination`
    (static_index.py), with its lock files; return the lock directory."""
    wheels = _with(local_wheels(wheelhouse), closure or [])
    files = [StaticFile(w.path, w.path.name, w.project, w.sha256) for w in wheels]
    return write_tree(wheelhouse, destination, files)
