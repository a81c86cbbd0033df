"""Package indexes read through their simple API (PEP 503), as pip is configured to see them.

Fetching an sdist must never run it. `pip download` of an sdist prepares its metadata, which
runs its build backend (setup.py), before we could look at a byte of it; so sdists are
located here instead, in the same places pip would look (its find-links, index-url and
extra-index-url, from its configuration files and PIP_* variables exactly as
`pip config list` reports them), downloaded by name, and checked by sha256. publish.py reads
an index back the same way.
"""

from __future__ import annotations

import base64
import hashlib
import html
import html.parser
import os
import re
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)

from .errors import UserError


def server_of(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.hrefs.append(href)


def page_links(page: bytes) -> list[str]:
    parser = _Links()
    parser.feed(page.decode("utf-8", "replace"))
    return [html.unescape(href) for href in parser.hrefs]


@dataclass(frozen=True)
class Reader:
    """GETs from an index, authenticating with Basic credentials when it asks (HTTP 401)."""

    timeout: float
    credentials: tuple[str, str] | None = None

    def get(self, url: str) -> bytes | None:
        """GET url; None for 404 (or a missing file: URL). Failures become clear errors."""
        try:
            return self._open(url, None)
        except urllib.error.HTTPError as exc:
            if exc.code == 401 and self.credentials is not None:
                exc.close()  # the refusal's connection: the authenticated request opens its own
                return self._get_authenticated(url)
            return self._failure(url, exc)

    def _get_authenticated(self, url: str) -> bytes | None:
        assert self.credentials is not None
        token = base64.b64encode(":".join(self.credentials).encode()).decode()
        try:
            return self._open(url, f"Basic {token}")
        except urllib.error.HTTPError as exc:
            return self._failure(url, exc)

    def _open(self, url: str, authorization: str | None) -> bytes:
        if url.startswith("file:"):
            path = Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path))
            if path.is_dir():
                path = path / "index.html"  # as pip reads a file: index
            try:
                return path.read_bytes()
            except FileNotFoundError:
                raise urllib.error.HTTPError(url, 404, "Not Found", None, None) from None  # type: ignore[arg-type]
        request = urllib.request.Request(url)
        if authorization is not None:
            request.add_header("Authorization", authorization)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return bytes(response.read())
        except urllib.error.HTTPError:
            raise
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise UserError(
                f"cannot read {_without_credentials(url)} from {server_of(url)}: {reason} "
                f"(within {self.timeout:g} s)"
            ) from None

    @staticmethod
    def _failure(url: str, exc: urllib.error.HTTPError) -> None:
        exc.close()  # it holds the response's connection open
        if exc.code == 404:
            return None
        hint = ""
        if exc.code in (401, 403):
            hint = (
                "; the index wants credentials to read: give them as "
                "TWINE_USERNAME/TWINE_PASSWORD, in a keyring or in ~/.pypirc"
            )
        raise UserError(
            f"{_without_credentials(url)} answered HTTP {exc.code} {exc.reason}{hint}"
        ) from None


def _without_credentials(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


@dataclass(frozen=True)
class Link:
    """One file a source offers: its name, where to get it, and the sha256 the source
    states for it (None when it states none)."""

    name: str
    url: str
    sha256: str | None


@dataclass(frozen=True)
class Sources:
    """Where pip looks for packages: find-links first, then the indexes; and the constraint
    files pip applies to whatever it installs or downloads."""

    find_links: tuple[str, ...]
    indexes: tuple[str, ...]
    constraints: tuple[str, ...] = ()

    def describe(self) -> str:
        places = [*self.find_links, *self.indexes]
        return ", ".join(_without_credentials(place) for place in places) or "nowhere"


_TRUE = ("1", "true", "yes", "on")


def pip_sources() -> Sources:
    """pip's find-links, index-url, extra-index-url and constraint files, and whether it uses
    an index at all, from its configuration files and environment, as `pip config list`
    reports them."""
    result = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True
    )
    if result.returncode != 0:
        raise UserError(f"`pip config list` failed:\n{result.stderr.strip()}")
    # Later sections win, as in pip: global, then the download command's, then PIP_*.
    rank = {"global": 0, "download": 1, ":env:": 2}
    settings: dict[str, tuple[int, str]] = {}
    for line in result.stdout.splitlines():
        match = re.fullmatch(r"([^.\s]+)\.([\w-]+)='(.*)'", line.strip())
        if match is None or match.group(1) not in rank:
            continue
        section, key, value = match.groups()
        if key not in settings or rank[section] >= settings[key][0]:
            settings[key] = (rank[section], value)

    def values(key: str) -> list[str]:
        return settings[key][1].split() if key in settings else []

    indexes: list[str] = []
    if not (values("no-index") and values("no-index")[0].lower() in _TRUE):
        indexes = values("index-url")[:1] or [_pip_default_index()]
        indexes += values("extra-index-url")
    return Sources(tuple(values("find-links")), tuple(indexes), tuple(values("constraint")))


def _pip_default_index() -> str:
    # pip's own default, so that no index is named here.
    from pip._internal.models.index import PyPI

    return str(PyPI.simple_url)


def _reader_for(url: str, timeout: float) -> tuple[Reader, str]:
    """A reader with the credentials a URL carries (as pip takes them), and the URL
    without them."""
    parts = urllib.parse.urlsplit(url)
    credentials = None
    if parts.username is not None:
        credentials = (
            urllib.parse.unquote(parts.username),
            urllib.parse.unquote(parts.password or ""),
        )
    return Reader(timeout, credentials), _without_credentials(url)


def _links_on(page: bytes, page_url: str) -> list[Link]:
    links = []
    for href in page_links(page):
        url = urllib.parse.urljoin(page_url, href)
        path, _, fragment = url.partition("#")
        name = urllib.parse.unquote(path.rsplit("/", 1)[-1])
        sha = fragment.removeprefix("sha256=") if fragment.startswith("sha256=") else None
        links.append(Link(name, path, sha))
    return links


def project_of(file_name: str) -> str | None:
    """The canonical project name a wheel's or sdist's file name gives, if it is one."""
    try:
        if file_name.endswith(".whl"):
            return str(parse_wheel_filename(file_name)[0])
        return str(parse_sdist_filename(file_name)[0])
    except (InvalidWheelFilename, InvalidSdistFilename):
        return None


def project_links(sources: Sources, project: str, timeout: float) -> list[Link]:
    """Every file the sources offer for `project`, find-links first, in pip's order."""
    links: list[Link] = []
    for place in sources.find_links:
        if "://" not in place:  # a local directory, as pip takes it
            directory = Path(place)
            if directory.is_dir():
                links += [
                    Link(p.name, p.resolve().as_uri(), None) for p in sorted(directory.iterdir())
                ]
            continue
        reader, url = _reader_for(place, timeout)
        page = reader.get(url)
        if page is not None:
            links += _links_on(page, url)
    for index in sources.indexes:
        reader, url = _reader_for(index, timeout)
        page_url = urllib.parse.urljoin(url.rstrip("/") + "/", f"{canonicalize_name(project)}/")
        page = reader.get(page_url)
        if page is not None:
            links += _links_on(page, page_url)
    return [link for link in links if project_of(link.name) == canonicalize_name(project)]


def download(link: Link, destination: Path, sources: Sources, timeout: float) -> str:
    """Write the linked file to `destination`; return its sha256. The credentials of the
    source it came from are offered if the server asks."""
    place = next(
        (p for p in (*sources.find_links, *sources.indexes) if server_of(p) == server_of(link.url)),
        None,
    )
    reader = _reader_for(place, timeout)[0] if place else Reader(timeout)
    data = reader.get(link.url)
    if data is None:
        raise UserError(f"{_without_credentials(link.url)} is listed but not served (HTTP 404)")
    partial = destination.with_name(f".{destination.name}.partial")
    try:
        partial.write_bytes(data)
        os.replace(partial, destination)
    except OSError as exc:
        # A full disk raises without a file name: name it, and keep nothing half-written.
        partial.unlink(missing_ok=True)
        raise UserError(
            f"cannot write {destination} ({len(data)} bytes): {exc.strerror or exc}; nothing "
            "of it was kept. Free space there (or set SM120_CACHE_DIR elsewhere) and run again."
        ) from None
    return hashlib.sha256(data).hexdigest()
