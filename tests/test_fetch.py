"""fetch_sdist through real pip, pointed at a local find-links directory of generated sdists."""

import hashlib
from dataclasses import replace
from pathlib import Path

import pytest

from sm120_build.errors import UserError
from sm120_build.fetch import cached_sdist_path, fetch_pinned_wheel, fetch_sdist

from .conftest import fixture_upstream, make_tarball, wheel_in

SETUP = {
    "PKG-INFO": "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n",
    "pyproject.toml": '[build-system]\nrequires = ["setuptools"]\n'
    'build-backend = "setuptools.build_meta"\n\n[project]\nname = "demo"\nversion = "1.0"\n',
    "demo.py": "",
}


@pytest.fixture
def local_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """pip configured, through its own environment variables, to see only a local directory."""
    links = tmp_path / "links"
    links.mkdir()
    make_tarball(links / "demo-1.0.tar.gz", SETUP)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("PIP_NO_BUILD_ISOLATION", "0")  # pip: "0" turns isolation off
    monkeypatch.delenv("PIP_CONSTRAINT", raising=False)
    return links


def test_fetch_verifies_and_caches_by_content(local_index: Path, tmp_path: Path) -> None:
    upstream = fixture_upstream(local_index / "demo-1.0.tar.gz")
    cache = tmp_path / "cache"
    path = fetch_sdist(upstream, cache)
    assert path == cache / upstream.sha256 / "demo-1.0.tar.gz"
    assert path.read_bytes() == (local_index / "demo-1.0.tar.gz").read_bytes()


def test_second_fetch_uses_no_network(
    local_index: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream = fixture_upstream(local_index / "demo-1.0.tar.gz")
    cache = tmp_path / "cache"
    fetch_sdist(upstream, cache)
    # pip can no longer find anything: a second fetch must not need it.
    (local_index / "demo-1.0.tar.gz").unlink()
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/")
    assert fetch_sdist(upstream, cache).is_file()


def test_sha256_mismatch_names_file_and_both_hashes(local_index: Path, tmp_path: Path) -> None:
    real = fixture_upstream(local_index / "demo-1.0.tar.gz")
    pinned = replace(real, sha256="0" * 64)
    cache = tmp_path / "cache"
    with pytest.raises(UserError) as caught:
        fetch_sdist(pinned, cache)
    assert str(caught.value) == (
        "sha256 mismatch for demo-1.0.tar.gz (demo==1.0): the index serves a file whose hash "
        f"is not the pinned one.\n  Expected sha256 {'0' * 64}\n  Got      sha256 {real.sha256}\n"
        "Nothing of it was kept, unpacked or run. Fix the index, or the pin in pins.toml."
    )
    # Nothing of the bad download is left in the cache.
    assert not cached_sdist_path(pinned, cache).exists()
    assert [p for p in cache.rglob("*") if p.is_file()] == []


def test_corrupt_cache_entry_is_fetched_again(
    local_index: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    upstream = fixture_upstream(local_index / "demo-1.0.tar.gz")
    cache = tmp_path / "cache"
    path = fetch_sdist(upstream, cache)
    assert capsys.readouterr().err == (
        "sm120-build: fetching demo-1.0.tar.gz (demo==1.0) through pip's sources\n"
    )
    path.write_bytes(b"corrupted")
    assert (
        fetch_sdist(upstream, cache).read_bytes() == (local_index / "demo-1.0.tar.gz").read_bytes()
    )
    assert capsys.readouterr().err.startswith(
        f"sm120-build: cached {path} does not match its pin; fetching it again\n"
    )


def test_unknown_project_is_a_clear_error(local_index: Path, tmp_path: Path) -> None:
    upstream = replace(fixture_upstream(local_index / "demo-1.0.tar.gz"), project="nope")
    with pytest.raises(UserError) as refused:
        fetch_sdist(upstream, tmp_path / "cache")
    message = str(refused.value)
    assert message.startswith("no demo-1.0.tar.gz for nope==1.0 in ")
    assert message.endswith(
        " (pip's configuration: `pip config list`). Check that pip reaches your package "
        "index, and the file name in pins.toml."
    )


def test_hostile_sdist_with_the_wrong_hash_never_runs(
    local_index: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index serves a different sdist under the pinned name, whose setup.py would write
    outside any build directory. pip must refuse it on the hash before running anything."""
    honest = fixture_upstream(local_index / "demo-1.0.tar.gz")
    marker = tmp_path / "setup-py-ran"
    hostile = {
        "PKG-INFO": SETUP["PKG-INFO"],
        "setup.py": f"open({str(marker)!r}, 'w').write('ran')\n"
        "from setuptools import setup\nsetup(name='demo', version='1.0')\n",
    }
    served = tmp_path / "hostile-links"
    served.mkdir()
    make_tarball(served / "demo-1.0.tar.gz", hostile)
    monkeypatch.setenv("PIP_FIND_LINKS", str(served))
    cache = tmp_path / "cache"
    with pytest.raises(UserError, match=r"sha256 mismatch for demo-1.0.tar.gz") as caught:
        fetch_sdist(honest, cache)
    assert honest.sha256 in str(caught.value)
    assert not marker.exists()
    assert [p for p in cache.rglob("*") if p.is_file()] == []


# fetch_pinned_wheel: a wheel named by a path, or pinned by hash and fetched through pip.


def pinned(wheel: Path) -> str:
    name, version = wheel.name.split("-")[:2]
    return f"{name}=={version} --hash=sha256:{hashlib.sha256(wheel.read_bytes()).hexdigest()}"


@pytest.fixture
def wheel_links(local_index: Path, tmp_path: Path) -> Path:
    """The local find-links directory, now also serving one small wheel."""
    return wheel_in(local_index, "demo_wheel", "1.0", payload="X = 1\n")


def test_a_wheel_path_is_taken_as_it_is(tmp_path: Path) -> None:
    wheel = tmp_path / "given-1.0-py3-none-any.whl"
    wheel.write_bytes(b"zip")
    assert fetch_pinned_wheel(str(wheel), tmp_path / "cache") == wheel
    assert not (tmp_path / "cache").exists()
    with pytest.raises(UserError) as missing:
        fetch_pinned_wheel(str(tmp_path / "absent-1.0-py3-none-any.whl"), tmp_path / "cache")
    assert str(missing.value) == f"{tmp_path / 'absent-1.0-py3-none-any.whl'} does not exist"


@pytest.mark.parametrize(
    "spec",
    [
        "demo_wheel==1.0",  # no hash
        "demo_wheel==1.0 --hash=sha256:" + "0" * 63,  # a hash too short
        "demo_wheel>=1.0 --hash=sha256:" + "0" * 64,  # not pinned
        "demo_wheel==1.0 --hash=md5:" + "0" * 64,
    ],
)
def test_a_spec_that_pins_nothing_is_refused_with_the_form_expected(
    spec: str, tmp_path: Path
) -> None:
    with pytest.raises(UserError) as refused:
        fetch_pinned_wheel(spec, tmp_path / "cache")
    assert str(refused.value) == (
        f"{spec!r}: expected a .whl path, or a pinned requirement such as "
        "'flashinfer-jit-cache==0.6.3+cu130 --hash=sha256:<64 hex>'"
    )


def test_a_pinned_wheel_is_fetched_once_into_its_hash(
    wheel_links: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    digest = hashlib.sha256(wheel_links.read_bytes()).hexdigest()
    fetched = fetch_pinned_wheel(f"  {pinned(wheel_links)}\n", cache)
    assert fetched == cache / "wheels" / digest / wheel_links.name
    assert fetched.read_bytes() == wheel_links.read_bytes()
    assert "sm120-build: fetching demo_wheel==1.0 through pip\n" in capsys.readouterr().err
    assert sorted(p.name for p in (cache / "wheels").iterdir()) == [digest]  # no scratch left
    assert [p.name for p in cache.iterdir()] == ["wheels"]
    wheel_links.unlink()  # the second time pip is not asked
    assert fetch_pinned_wheel(pinned(fetched), cache) == fetched
    assert "fetching" not in capsys.readouterr().err


def test_any_of_several_pinned_hashes_is_found_in_the_cache(
    wheel_links: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    fetched = fetch_pinned_wheel(pinned(wheel_links), cache)
    wheel_links.unlink()
    other = "--hash=sha256:" + "1" * 64
    name, rest = pinned(fetched).split(" ", 1)
    assert fetch_pinned_wheel(f"{name} {other} {rest}", cache) == fetched


def test_a_corrupt_cache_entry_is_fetched_again(wheel_links: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    fetched = fetch_pinned_wheel(pinned(wheel_links), cache)
    fetched.write_bytes(b"corrupt")
    again = fetch_pinned_wheel(pinned(wheel_links), cache)
    assert again == fetched and again.read_bytes() == wheel_links.read_bytes()


def test_a_wheel_of_another_hash_is_refused_by_pip_and_nothing_is_kept(
    wheel_links: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    spec = "demo_wheel==1.0 --hash=sha256:" + "2" * 64
    with pytest.raises(UserError) as refused:
        fetch_pinned_wheel(spec, cache)
    message = str(refused.value)
    assert message.startswith("pip could not download demo_wheel==1.0:\nERROR: ")  # pip's text
    assert "2" * 64 in message  # pip's own hash report, passed on
    assert list((cache / "wheels").iterdir()) == []


def test_a_pinned_requirement_is_never_taken_as_an_sdist(local_index: Path, tmp_path: Path) -> None:
    """Only wheels: an sdist served under the pinned name and hash would run its setup.py
    when pip reads its metadata."""
    marker = tmp_path / "setup-py-ran"
    hostile = {
        "PKG-INFO": "Metadata-Version: 2.1\nName: sneaky\nVersion: 1.0\n",
        "setup.py": f"open({str(marker)!r}, 'w').write('ran')\n"
        "from setuptools import setup\nsetup(name='sneaky', version='1.0')\n",
    }
    make_tarball(local_index / "sneaky-1.0.tar.gz", hostile)
    digest = hashlib.sha256((local_index / "sneaky-1.0.tar.gz").read_bytes()).hexdigest()
    with pytest.raises(UserError, match=r"^pip could not download sneaky==1\.0:"):
        fetch_pinned_wheel(f"sneaky==1.0 --hash=sha256:{digest}", tmp_path / "cache")
    assert not marker.exists()


def simple_index(root: Path, links: list[tuple[str, str]]) -> str:
    """A PEP 503 tree on disk whose demo page links files by (href, sha256 fragment)."""
    (root / "simple" / "demo").mkdir(parents=True)
    (root / "simple" / "demo" / "index.html").write_text(
        "".join(f'<a href="{href}#sha256={digest}">demo-1.0.tar.gz</a>\n' for href, digest in links)
    )
    return (root / "simple").as_uri() + "/"


@pytest.fixture
def index_only(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("PIP_NO_INDEX", "PIP_FIND_LINKS"):
        monkeypatch.delenv(variable, raising=False)


def test_a_link_whose_declared_hash_differs_is_not_even_downloaded(
    local_index: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, index_only: None
) -> None:
    upstream = fixture_upstream(local_index / "demo-1.0.tar.gz")
    sdist = (local_index / "demo-1.0.tar.gz").as_uri()
    url = simple_index(tmp_path / "index", [(sdist, "1" * 64), (sdist, "2" * 64)])
    monkeypatch.setenv("PIP_INDEX_URL", url)
    with pytest.raises(UserError) as refused:
        fetch_sdist(upstream, tmp_path / "cache")
    assert (
        f"  Expected sha256 {upstream.sha256}\n  Got      sha256 {'1' * 64}\n"
        f"  Got      sha256 {'2' * 64}\nNothing of it was kept"
    ) in str(refused.value)


def test_the_first_link_with_the_pinned_hash_is_taken(
    local_index: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, index_only: None
) -> None:
    upstream = fixture_upstream(local_index / "demo-1.0.tar.gz")
    sdist = (local_index / "demo-1.0.tar.gz").as_uri()
    url = simple_index(tmp_path / "index", [(sdist, "1" * 64), (sdist, upstream.sha256)])
    monkeypatch.setenv("PIP_INDEX_URL", url)
    path = fetch_sdist(upstream, tmp_path / "deep" / "cache")
    assert path.read_bytes() == (local_index / "demo-1.0.tar.gz").read_bytes()
