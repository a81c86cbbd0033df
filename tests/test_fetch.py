"""fetch_sdist through real pip, pointed at a local find-links directory of generated sdists."""

from dataclasses import replace
from pathlib import Path

import pytest

from sm120_build.errors import UserError
from sm120_build.fetch import cached_sdist_path, fetch_sdist

from .conftest import fixture_upstream, make_tarball

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
    message = str(caught.value)
    assert "demo-1.0.tar.gz" in message
    assert "0" * 64 in message and real.sha256 in message
    # Nothing of the bad download is left in the cache.
    assert not cached_sdist_path(pinned, cache).exists()
    assert [p for p in cache.rglob("*") if p.is_file()] == []


def test_corrupt_cache_entry_is_fetched_again(local_index: Path, tmp_path: Path) -> None:
    upstream = fixture_upstream(local_index / "demo-1.0.tar.gz")
    cache = tmp_path / "cache"
    path = fetch_sdist(upstream, cache)
    path.write_bytes(b"corrupted")
    assert (
        fetch_sdist(upstream, cache).read_bytes() == (local_index / "demo-1.0.tar.gz").read_bytes()
    )


def test_unknown_project_is_a_clear_error(local_index: Path, tmp_path: Path) -> None:
    upstream = replace(fixture_upstream(local_index / "demo-1.0.tar.gz"), project="nope")
    with pytest.raises(UserError, match=r"no demo-1.0.tar.gz for nope==1.0 in "):
        fetch_sdist(upstream, tmp_path / "cache")


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
