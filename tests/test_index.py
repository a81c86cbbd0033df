"""Reading package indexes as pip is configured to see them, in process, against a real HTTP
server on loopback: what is read, what is asked for with credentials, what each failure
says (never the credentials), and a download that keeps nothing half-written."""

from __future__ import annotations

import base64
import hashlib
import http.server
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from sm120_build import index
from sm120_build.errors import UserError
from sm120_build.index import Link, Reader, Sources

from .conftest import free_port

TOKEN = base64.b64encode(b"reader:s3cret/pw").decode()
SHA = hashlib.sha256(b"wheel bytes").hexdigest()


class Handler(http.server.BaseHTTPRequestHandler):
    """GET only: /simple/demo/ and its file, /private/... behind Basic auth, /forbidden/,
    /broken/ (500); the rest 404. Each request's Authorization header is kept."""

    seen: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        Handler.seen.append(self.headers.get("Authorization"))
        pages = {
            "/simple/demo/": (
                b'<a href="../../files/demo-1.0.tar.gz#sha256=' + SHA.encode() + b'">a</a>'
                b'<A HREF="/files/demo-1.0-py3-none-any.whl#md5=00">b</A>'
                b'<a href="/files/other-2.0.tar.gz">c</a><a>no href</a>'
                b'<a href="/files/demo%2B-1.0.tar.gz?x=1&amp;y=2">d</a>'
            ),
            "/files/demo-1.0.tar.gz": b"wheel bytes",
        }
        if self.path.startswith("/private/"):
            if self.headers.get("Authorization") != f"Basic {TOKEN}":
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="index"')
                self.end_headers()
                return
            pages[self.path] = b"private bytes"
        status = {"/forbidden/": 403, "/broken/": 500}.get(
            self.path, 200 if self.path in pages else 404
        )
        body = pages.get(self.path, b"")
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def without_pip_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """None of the shell's PIP_* settings: pip is configured as each test says."""
    for name in [n for n in os.environ if n.startswith("PIP_")]:
        monkeypatch.delenv(name)


@pytest.fixture
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    Handler.seen.clear()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_a_server_is_named_by_scheme_host_and_port_never_by_credentials() -> None:
    assert index.server_of("https://u:p@Index.example:8443/simple/") == "https://index.example:8443"
    assert index.server_of("https://index.example/simple/") == "https://index.example"
    assert index.server_of("file:///srv/wheels") == "file://"


def test_credentials_are_taken_out_of_a_url_and_its_port_kept() -> None:
    assert index._without_credentials("https://u:p@host:8443/s/?q=1") == "https://host:8443/s/?q=1"
    assert index._without_credentials("https://u@host/s/") == "https://host/s/"
    assert index._without_credentials("https://host/s/") == "https://host/s/"
    reader, url = index._reader_for("https://read%40er:pa%3Ass@host/simple/", 7)
    assert (reader.credentials, reader.timeout, url) == (
        ("read@er", "pa:ss"),
        7,
        "https://host/simple/",
    )
    assert index._reader_for("https://user@host/", 1)[0].credentials == ("user", "")
    assert index._reader_for("https://host/", 1)[0].credentials is None


def test_sources_are_described_without_credentials() -> None:
    sources = Sources(("/srv/wheels",), ("https://u:p@host/simple/", "https://other/simple/"))
    assert sources.describe() == "/srv/wheels, https://host/simple/, https://other/simple/"
    assert Sources((), ()).describe() == "nowhere"


def test_a_page_s_links_are_joined_unquoted_and_carry_only_a_sha256(server: str) -> None:
    page_url = f"{server}/simple/demo/"
    page = Reader(5).get(page_url)
    assert page is not None
    assert index._links_on(page, page_url) == [
        Link("demo-1.0.tar.gz", f"{server}/files/demo-1.0.tar.gz", SHA),
        Link("demo-1.0-py3-none-any.whl", f"{server}/files/demo-1.0-py3-none-any.whl", None),
        Link("other-2.0.tar.gz", f"{server}/files/other-2.0.tar.gz", None),
        Link("demo+-1.0.tar.gz?x=1&y=2", f"{server}/files/demo%2B-1.0.tar.gz?x=1&y=2", None),
    ]


def test_only_the_asked_project_s_files_are_listed_find_links_first(
    server: str, tmp_path: Path
) -> None:
    links = tmp_path / "links"
    links.mkdir()
    for name in ("demo-0.9.tar.gz", "Demo-1.1-py3-none-any.whl", "unrelated-1.0.tar.gz", "x"):
        (links / name).write_text(name)
    more = tmp_path / "more"
    more.mkdir()
    (more / "demo-0.8.tar.gz").write_text("demo")
    sources = Sources(
        (str(links), str(tmp_path / "missing"), str(more), f"{server}/simple/demo/"),
        (f"{server}/simple/",),
    )
    found = index.project_links(sources, "DEMO", 5)
    assert [link.name for link in found] == [
        "Demo-1.1-py3-none-any.whl",
        "demo-0.9.tar.gz",
        "demo-0.8.tar.gz",  # the second directory
        "demo-1.0.tar.gz",  # the find-links page
        "demo-1.0-py3-none-any.whl",
        "demo-1.0.tar.gz",  # the index's project page, /simple/demo/
        "demo-1.0-py3-none-any.whl",
    ]
    assert found[0].url == (links / "Demo-1.1-py3-none-any.whl").resolve().as_uri()
    assert [link.url for link in found[3:]] == [
        f"{server}/files/demo-1.0.tar.gz",
        f"{server}/files/demo-1.0-py3-none-any.whl",
    ] * 2
    assert index.project_links(Sources((), (f"{server}/simple",)), "absent", 5) == []


def test_a_project_is_named_by_a_file_only_if_the_file_is_a_wheel_or_sdist() -> None:
    assert index.project_of("Flash_Infer-0.6.3-py3-none-any.whl") == "flash-infer"
    assert index.project_of("flashinfer_python-0.6.3.tar.gz") == "flashinfer-python"
    assert index.project_of("README.txt") is None
    assert index.project_of("broken.whl") is None


def test_a_reader_asks_with_credentials_only_when_the_index_wants_them(server: str) -> None:
    assert Reader(5, ("reader", "s3cret/pw")).get(f"{server}/private/x") == b"private bytes"
    assert Handler.seen == [None, f"Basic {TOKEN}"]
    assert Reader(5, ("reader", "s3cret/pw")).get(f"{server}/absent") is None
    assert Handler.seen[-1] is None  # not offered where no one asked


@pytest.mark.parametrize(
    ("path", "credentials", "said"),
    [
        ("/private/x", None, "answered HTTP 401 Unauthorized; the index wants credentials"),
        (
            "/private/x",
            ("reader", "wrong"),
            "answered HTTP 401 Unauthorized; the index wants credentials",
        ),
        ("/forbidden/", None, "answered HTTP 403 Forbidden; the index wants credentials to read"),
        ("/broken/", None, "answered HTTP 500 Internal Server Error"),
    ],
)
def test_a_refusal_is_a_clear_error_that_names_no_credentials(
    server: str, path: str, credentials: tuple[str, str] | None, said: str
) -> None:
    # As a find-links page, read as it is named: with the credentials pip would use.
    place = f"{server}{path}"
    if credentials:
        place = place.replace("://", f"://{':'.join(credentials)}@")
    with pytest.raises(UserError) as refused:
        index.project_links(Sources((place,), ()), "demo", 5)
    message = str(refused.value)
    assert message.startswith(f"{server}{path} {said}")
    assert "wrong" not in message
    if "credentials" in said:
        assert message.endswith("as TWINE_USERNAME/TWINE_PASSWORD, in a keyring or in ~/.pypirc")
    else:
        assert message == f"{server}{path} {said}"


def test_an_index_that_cannot_be_reached_names_the_server_and_the_time_allowed() -> None:
    port = free_port()
    with pytest.raises(UserError) as refused:
        index.project_links(Sources((), (f"http://u:p@127.0.0.1:{port}/simple",)), "demo", 2.5)
    message = str(refused.value)
    assert message.startswith(
        f"cannot read http://127.0.0.1:{port}/simple/demo/ from http://127.0.0.1:{port}: "
    )
    assert message.endswith("(within 2.5 s)") and "Connection refused" in message


def test_a_file_url_reads_a_directory_s_index_html_and_a_missing_file_is_absent(
    tmp_path: Path,
) -> None:
    (tmp_path / "index.html").write_bytes(b"<a href='x'>x</a>")
    (tmp_path / "f").write_bytes(b"bytes")
    assert Reader(1).get(tmp_path.as_uri()) == b"<a href='x'>x</a>"
    assert Reader(1).get((tmp_path / "f").as_uri()) == b"bytes"
    assert Reader(1).get((tmp_path / "absent").as_uri()) is None


def test_a_download_writes_the_file_whole_and_returns_its_sha256(
    server: str, tmp_path: Path
) -> None:
    link = Link("demo-1.0.tar.gz", f"{server}/files/demo-1.0.tar.gz", SHA)
    sources = Sources((), (f"{server}/simple/",))
    assert index.download(link, tmp_path / "demo-1.0.tar.gz", sources, 5) == SHA
    assert (tmp_path / "demo-1.0.tar.gz").read_bytes() == b"wheel bytes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo-1.0.tar.gz"]


def test_a_download_offers_the_credentials_of_the_source_it_came_from(
    server: str, tmp_path: Path
) -> None:
    private = f"{server}/private/demo-1.0.tar.gz"
    sources = Sources(
        (), ("https://elsewhere.invalid/simple/", server.replace("://", "://reader:s3cret%2Fpw@"))
    )
    got = index.download(Link("demo-1.0.tar.gz", private, None), tmp_path / "d", sources, 5)
    assert got == hashlib.sha256(b"private bytes").hexdigest()
    with pytest.raises(UserError, match="answered HTTP 401"):
        index.download(Link("d", private, None), tmp_path / "e", Sources((), ()), 5)


def test_a_listed_file_the_server_does_not_have_is_a_clear_error(
    server: str, tmp_path: Path
) -> None:
    with pytest.raises(UserError) as refused:
        index.download(
            Link("gone.tar.gz", f"{server}/files/gone.tar.gz", None),
            tmp_path / "g",
            Sources((), ()),
            5,
        )
    assert str(refused.value) == f"{server}/files/gone.tar.gz is listed but not served (HTTP 404)"
    assert not any(tmp_path.iterdir())


def test_a_download_that_cannot_be_written_keeps_nothing_and_says_what_to_do(
    server: str, tmp_path: Path
) -> None:
    destination = tmp_path / "gone" / "demo-1.0.tar.gz"  # its directory was removed
    link = Link("demo-1.0.tar.gz", f"{server}/files/demo-1.0.tar.gz", SHA)
    with pytest.raises(UserError) as refused:
        index.download(link, destination, Sources((), ()), 5)
    assert str(refused.value) == (
        f"cannot write {destination} (11 bytes): No such file or directory; nothing of it was "
        "kept. Free space there (or set SM120_CACHE_DIR elsewhere) and run again."
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.usefixtures("without_pip_settings")
def test_pip_s_sources_come_from_its_configuration_as_pip_ranks_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The download command's section beats [global], PIP_* beats both; --no-index leaves
    the find-links alone."""
    config = tmp_path / "pip.conf"
    config.write_text(
        "[global]\n"
        "index-url = https://global.invalid/simple\n"
        "extra-index-url = https://extra.invalid/simple https://more.invalid/simple\n"
        "find-links = /srv/global-links\n"
        "constraint = /etc/global-constraints.txt\n"
        "no-index = false\n"
        "[download]\n"
        "index-url = https://download.invalid/simple\n"
        "constraint = /etc/download-constraints.txt\n"
        "[install]\n"
        "index-url = https://install.invalid/simple\n"
    )
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    monkeypatch.setenv("PIP_FIND_LINKS", "/srv/a /srv/b")
    assert index.pip_sources() == Sources(
        ("/srv/a", "/srv/b"),
        (
            "https://download.invalid/simple",
            "https://extra.invalid/simple",
            "https://more.invalid/simple",
        ),
        ("/etc/download-constraints.txt",),
    )
    monkeypatch.setenv("PIP_INDEX_URL", "https://env.invalid/simple")
    assert index.pip_sources().indexes[0] == "https://env.invalid/simple"
    for no_index in ("1", "true", "YES", "on"):
        monkeypatch.setenv("PIP_NO_INDEX", no_index)
        assert index.pip_sources() == Sources(
            ("/srv/a", "/srv/b"), (), ("/etc/download-constraints.txt",)
        )
    monkeypatch.setenv("PIP_NO_INDEX", "0")
    assert len(index.pip_sources().indexes) == 3


@pytest.mark.usefixtures("without_pip_settings")
def test_without_an_index_url_pip_s_own_default_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    from pip._internal.models.index import PyPI

    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    assert index.pip_sources() == Sources((), (PyPI.simple_url,), ())


def test_a_pip_that_cannot_read_its_configuration_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "pip.conf"
    config.write_text("[global\nindex-url = broken\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    with pytest.raises(UserError) as refused:
        index.pip_sources()
    assert str(refused.value).startswith("`pip config list` failed:\n")
    assert "pip.conf" in str(refused.value)


def test_a_page_that_is_not_utf_8_still_gives_its_links() -> None:
    page = b'<a href="demo-1.0.tar.gz">caf\xe9</a><a href="demo-1.1.tar.gz">x</a>'
    assert index.page_links(page) == ["demo-1.0.tar.gz", "demo-1.1.tar.gz"]


def test_a_url_without_credentials_is_left_exactly_as_it_was() -> None:
    url = "https://Index.Example:8443/Simple/"
    assert index._without_credentials(url) == url
