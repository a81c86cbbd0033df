"""Publish wheelhouse/ to an internal package index with twine, or as a static PEP 503 tree.

Uploading is idempotent: a file the index already serves with our sha256 is skipped, a file
it serves with other content stops the run before anything else is uploaded. Afterwards the
index's simple pages are read back and every file must be served with our sha256.
Credentials reach twine the way twine takes them (TWINE_USERNAME/TWINE_PASSWORD, a keyring,
~/.pypirc); this module never reads, prints or writes them.
"""

from __future__ import annotations

import hashlib
import html
import html.parser
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from .cache import sha256_of
from .console import say
from .errors import UserError

READ_TIMEOUT = 30  # seconds for one request to the index


def redact(url: str) -> str:
    """The URL without any user:password@ part, for messages."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=host))


@dataclass(frozen=True)
class LocalWheel:
    path: Path
    project: str
    sha256: str


def local_wheels(wheelhouse: Path) -> list[LocalWheel]:
    """The wheelhouse's wheels, checked against its SHA256SUMS."""
    sums_file = wheelhouse / "SHA256SUMS"
    if not sums_file.is_file():
        raise UserError(f"{sums_file} is missing: run `nox -s build_wheels` first")
    sums = dict(reversed(line.split("  ", 1)) for line in sums_file.read_text().splitlines())
    wheels = []
    for path in sorted(wheelhouse.glob("*.whl")):
        digest = sha256_of(path)
        if sums.get(path.name) != digest:
            raise UserError(f"{path} does not match SHA256SUMS; rebuild with `nox -s build_wheels`")
        wheels.append(
            LocalWheel(path, str(canonicalize_name(parse_wheel_filename(path.name)[0])), digest)
        )
    if not wheels:
        raise UserError(f"{wheelhouse} holds no wheels: run `nox -s build_wheels` first")
    return wheels


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.hrefs.append(href)


def _get(url: str) -> bytes | None:
    """GET url; None for 404. Network and HTTP failures become clear errors."""
    try:
        with urllib.request.urlopen(url, timeout=READ_TIMEOUT) as response:
            return response.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise UserError(f"{redact(url)} answered HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UserError(f"cannot reach {redact(url)}: {reason}") from None


def served_files(index_url: str, project: str) -> dict[str, str]:
    """filename -> sha256 of what the index's simple page for `project` serves."""
    page_url = urllib.parse.urljoin(index_url.rstrip("/") + "/", f"{project}/")
    page = _get(page_url)
    if page is None:
        return {}
    parser = _Links()
    parser.feed(page.decode("utf-8", "replace"))
    files = {}
    for href in parser.hrefs:
        url = urllib.parse.urljoin(page_url, html.unescape(href))
        path, _, fragment = url.partition("#")
        name = urllib.parse.unquote(path.rsplit("/", 1)[-1])
        if fragment.startswith("sha256="):
            files[name] = fragment.removeprefix("sha256=")
        else:
            content = _get(path)
            files[name] = hashlib.sha256(content or b"").hexdigest()
    return files


def _twine(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "twine", *args], capture_output=True, text=True)


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
    wheelhouse: Path, repository_url: str | None, repository: str | None, index_url: str
) -> None:
    wheels = local_wheels(wheelhouse)
    check = _twine("check", *(str(w.path) for w in wheels))
    if check.returncode != 0:
        raise UserError(f"twine check failed:\n{check.stdout}{check.stderr}")

    target = (
        ["--repository-url", repository_url]
        if repository_url
        else ["--repository", repository or ""]
    )
    status: dict[str, str] = {}
    try:
        for wheel in wheels:
            served = served_files(index_url, wheel.project)
            if wheel.path.name in served:
                if served[wheel.path.name] != wheel.sha256:
                    raise UserError(
                        f"{redact(index_url)} already serves {wheel.path.name} with other "
                        f"content:\n  index sha256 {served[wheel.path.name]}\n"
                        f"  ours  sha256 {wheel.sha256}\n"
                        "Indexes do not allow replacing a file; nothing after it was uploaded."
                    )
                status[wheel.path.name] = "already there (identical), skipped"
                continue
            say(f"uploading {wheel.path.name}")
            upload = _twine(
                "upload", "--non-interactive", "--disable-progress-bar", *target, str(wheel.path)
            )
            if upload.returncode != 0:
                raise UserError(
                    f"uploading {wheel.path.name} failed: "
                    f"{_upload_failure(upload.stdout + upload.stderr)}"
                )
            status[wheel.path.name] = "uploaded"
        for wheel in wheels:
            served = served_files(index_url, wheel.project)
            if served.get(wheel.path.name) != wheel.sha256:
                raise UserError(
                    f"after uploading, {redact(index_url)} serves {wheel.path.name} with "
                    f"sha256 {served.get(wheel.path.name, 'nothing')}, not {wheel.sha256}"
                )
    finally:
        _summary(wheels, status, index_url)


def _summary(wheels: list[LocalWheel], status: dict[str, str], index_url: str) -> None:
    say(f"summary for {redact(index_url)}:")
    for wheel in wheels:
        say(f"  {wheel.path.name}: {status.get(wheel.path.name, 'NOT on the index')}")


def write_static_index(wheelhouse: Path, destination: Path) -> None:
    """A PEP 503 tree (packages/ + simple/) that pip installs from over file:// or HTTP."""
    wheels = local_wheels(wheelhouse)
    if destination.exists() and not (destination / "simple").is_dir():
        raise UserError(f"{destination} exists and is not a static index; choose another directory")
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{destination.name}-", dir=destination.parent))
    try:
        (staging / "packages").mkdir()
        projects: dict[str, list[LocalWheel]] = {}
        for wheel in wheels:
            shutil.copyfile(wheel.path, staging / "packages" / wheel.path.name)
            projects.setdefault(wheel.project, []).append(wheel)
        root_links = []
        for project, members in sorted(projects.items()):
            (staging / "simple" / project).mkdir(parents=True)
            links = "".join(
                f'<a href="../../packages/{urllib.parse.quote(w.path.name)}#sha256={w.sha256}">'
                f"{html.escape(w.path.name)}</a><br>\n"
                for w in members
            )
            (staging / "simple" / project / "index.html").write_text(_page(project, links))
            root_links.append(f'<a href="{project}/">{project}</a><br>\n')
        (staging / "simple" / "index.html").write_text(_page("Simple index", "".join(root_links)))
        staging.chmod(0o755)
        if destination.exists():
            shutil.rmtree(destination)
        os.replace(staging, destination)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    say(f"static index: {destination}/simple/ ({len(wheels)} wheels)")


def _page(title: str, body: str) -> str:
    return (
        f'<!DOCTYPE html>\n<html><head><meta name="pypi:repository-version" '
        f'content="1.0"><title>{html.escape(title)}</title></head>\n<body>\n{body}'
        "</body></html>\n"
    )
