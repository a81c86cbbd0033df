"""publish.py's parts, each on its own: the URL check, the reading of twine's failures, the
index's served files and the static tree's pages. test_publish.py runs the whole against
a real index server."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from sm120_build.errors import UserError
from sm120_build.index import Reader
from sm120_build.publish import (
    LocalWheel,
    _summary,
    _upload_failure,
    check_url,
    served_files,
    twine_credentials,
)


@pytest.mark.parametrize(
    "url",
    ["https://pypi.internal/simple/", "http://127.0.0.1:8080/", "file:///srv/index/simple/"],
)
def test_http_and_file_urls_pass_unchanged(url: str) -> None:
    assert check_url(url, "--index-url") == url


@pytest.mark.parametrize("url", ["ftp://host/simple/", "pypi.internal/simple", "https://", ""])
def test_other_urls_are_refused_naming_the_option(url: str) -> None:
    with pytest.raises(UserError) as refused:
        check_url(url, "--repository-url")
    assert str(refused.value) == f"--repository-url {url!r} is not an http(s) URL"


@pytest.mark.parametrize(
    "url", ["https://user:secret@host/simple/", "https://user@host/", "https://:secret@host/"]
)
def test_credentials_in_a_url_are_refused_without_echoing_them(url: str) -> None:
    with pytest.raises(UserError) as refused:
        check_url(url, "--index-url")
    assert str(refused.value) == (
        "--index-url carries credentials in the URL, which nox prints with its command line. "
        "Give them as TWINE_USERNAME/TWINE_PASSWORD, in a keyring or in ~/.pypirc."
    )


@pytest.mark.parametrize("code", ["401", "403"])
def test_an_auth_refusal_points_at_the_credentials(code: str) -> None:
    output = f"Uploading x.whl\nERROR HTTPError: {code} Forbidden from http://i/\nmore\n"
    assert _upload_failure(output) == (
        f"the index rejected the credentials or their rights (HTTP {code} Forbidden): "
        "check TWINE_USERNAME/TWINE_PASSWORD, your keyring or ~/.pypirc"
    )


def test_another_http_error_is_quoted() -> None:
    output = "ERROR HTTPError: 409 Conflict from http://i/\n"
    assert _upload_failure(output) == "the index answered HTTP 409 Conflict"


@pytest.mark.parametrize(
    ("output", "meaning"),
    [
        (
            "... [Errno 111] Connection refused')",
            "the connection was refused: is the index running at that URL?",
        ),
        ("ReadTimeoutError: read timed out. (read timeout=3)", "the connection timed out"),
    ],
)
def test_connection_failures_are_named(output: str, meaning: str) -> None:
    assert _upload_failure(output) == meaning


def test_otherwise_the_last_line_twine_printed_or_a_word_that_there_was_none() -> None:
    output = "first\n  \nsecond\nERROR something odd\n\n"
    assert _upload_failure(output) == "ERROR something odd"
    assert _upload_failure("\n  \n") == "twine failed without output"


def static_page(root: Path, project: str, body: str) -> str:
    (root / project).mkdir(parents=True)
    (root / project / "index.html").write_text(body)
    return (root / project).as_uri()


def test_served_files_takes_the_hash_from_the_link_or_hashes_the_file(tmp_path: Path) -> None:
    simple = tmp_path / "simple"
    packages = tmp_path / "packages"
    packages.mkdir()
    (packages / "beta_pkg-2.0-py3-none-any.whl").write_bytes(b"beta")
    digest = "ab" * 32
    static_page(
        simple,
        "alpha-pkg",
        f'<a href="../../packages/alpha_pkg-1.0-py3-none-any.whl#sha256={digest}">a</a>\n'
        '<a href="../../packages/beta%5Fpkg-2.0-py3-none-any.whl">b</a>\n',
    )
    served = served_files(Reader(5), simple.as_uri(), "alpha-pkg")
    assert served == {
        "alpha_pkg-1.0-py3-none-any.whl": digest,
        "beta_pkg-2.0-py3-none-any.whl": hashlib.sha256(b"beta").hexdigest(),
    }


class RecordingReader(Reader):
    """A real Reader that also notes each URL it was asked for."""

    def __init__(self) -> None:
        super().__init__(5)
        self.urls: list[str] = []

    def get(self, url: str) -> bytes | None:
        self.urls.append(url)
        return super().get(url)


@pytest.mark.parametrize("slashes", ["", "/", "//"])
def test_the_project_page_is_asked_for_below_the_index_url_however_it_ends(
    tmp_path: Path, slashes: str
) -> None:
    simple = tmp_path / "simple"
    static_page(simple, "alpha-pkg", "")
    reader = RecordingReader()
    assert served_files(reader, simple.as_uri() + slashes, "alpha-pkg") == {}
    assert reader.urls == [simple.as_uri() + "/alpha-pkg/"]


def test_a_project_the_index_does_not_have_serves_nothing(tmp_path: Path) -> None:
    (tmp_path / "simple").mkdir()
    assert served_files(Reader(5), (tmp_path / "simple").as_uri() + "/", "absent") == {}


def test_a_linked_file_that_is_missing_hashes_as_empty(tmp_path: Path) -> None:
    simple = tmp_path / "simple"
    static_page(simple, "gone", '<a href="../../packages/gone-1.0-py3-none-any.whl">g</a>')
    served = served_files(Reader(5), simple.as_uri(), "gone")
    assert served == {"gone-1.0-py3-none-any.whl": hashlib.sha256(b"").hexdigest()}


def test_the_summary_names_every_file_and_what_happened_to_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wheels = [
        LocalWheel(tmp_path / name, name.split("-")[0], "0" * 64) for name in ("a-1.whl", "b-1.whl")
    ]
    _summary(wheels, {"a-1.whl": "uploaded"}, "http://i/simple/")
    assert capsys.readouterr().err == (
        "sm120-build: summary for http://i/simple/:\n"
        "sm120-build:   a-1.whl: uploaded\n"
        "sm120-build:   b-1.whl: NOT on the index\n"
    )


PYPIRC = """\
[distutils]
index-servers =
    pypi
    internal

[pypi]
username = __token__
password = pypi-token

[internal]
repository = https://pypi.internal/
username = builder
password = builder-secret
"""


@pytest.fixture
def pypirc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home whose ~/.pypirc names two repositories, and no TWINE_* variables."""
    (tmp_path / ".pypirc").write_text(PYPIRC)
    monkeypatch.setenv("HOME", str(tmp_path))
    for variable in (
        "TWINE_USERNAME",
        "TWINE_PASSWORD",
        "TWINE_REPOSITORY",
        "TWINE_REPOSITORY_URL",
    ):
        monkeypatch.delenv(variable, raising=False)
    return tmp_path / ".pypirc"


def test_credentials_come_from_the_environment_for_a_url(
    pypirc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TWINE_USERNAME", "uploader")
    monkeypatch.setenv("TWINE_PASSWORD", "secret")
    assert twine_credentials("http://127.0.0.1:1/", None) == ("uploader", "secret")


def test_a_url_takes_no_credentials_from_pypirc(pypirc: Path) -> None:
    assert twine_credentials("http://127.0.0.1:1/", None) is None


def test_a_username_without_a_password_is_no_credentials(
    pypirc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TWINE_USERNAME", "uploader")
    assert twine_credentials("http://127.0.0.1:1/", None) is None


def test_a_named_repository_or_pypi_takes_its_pypirc_credentials(pypirc: Path) -> None:
    assert twine_credentials(None, "internal") == ("builder", "builder-secret")
    assert twine_credentials(None, None) == ("__token__", "pypi-token")


def test_a_repository_pypirc_does_not_name_is_no_credentials(pypirc: Path) -> None:
    assert twine_credentials(None, "elsewhere") is None
