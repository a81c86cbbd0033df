"""Publishing as a static PEP 503 tree (--static): pip installs from it, it merges, it never
replaces a file, and its pages and modes are what a web server serves as they are."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from sm120_build.publish import write_static_index
from sm120_build.wheels import assemble_wheelhouse

from .conftest import small_wheel, wheelhouse_project
from .test_publish import fresh_install, publish, required_versions


def test_static_index_installs_with_pip(project: Path, tmp_path: Path) -> None:
    static = tmp_path / "mirror"
    result = publish(project, "--static", str(static))
    assert result.returncode == 0, result.stderr
    assert (static / "simple/alpha-pkg/index.html").is_file()
    installed = fresh_install(project, (static / "simple").as_uri() + "/", tmp_path)
    for name, version in required_versions(project).items():
        assert installed[name] == version


def test_static_index_merges_and_keeps_what_was_there(project: Path, tmp_path: Path) -> None:
    static = tmp_path / "mirror"
    (static / "packages").mkdir(parents=True)
    (static / "simple" / "gamma-pkg").mkdir(parents=True)
    other_project = small_wheel(tmp_path, "gamma_pkg", "0.1")
    shutil.copyfile(other_project, static / "packages" / other_project.name)
    (static / "simple" / "gamma-pkg" / "index.html").write_text("<a href='x'>kept</a>\n")
    assert publish(project, "--static", str(static)).returncode == 0
    earlier = sorted(p.name for p in (static / "packages").iterdir())

    # A newer alpha build joins the earlier one instead of replacing the tree.
    (tmp_path / "newer-scratch").mkdir()
    newer_wheel = small_wheel(tmp_path / "newer-scratch", "alpha_pkg", "1.1")
    newer = wheelhouse_project(tmp_path / "newer", [newer_wheel])
    assert publish(newer, "--static", str(static)).returncode == 0
    names = sorted(p.name for p in (static / "packages").iterdir())
    assert set(earlier) < set(names)
    assert "alpha_pkg-1.1-py3-none-any.whl" in names
    page = (static / "simple" / "alpha-pkg" / "index.html").read_text()
    assert "alpha_pkg-1.0" in page and "alpha_pkg-1.1" in page
    assert (static / "simple" / "gamma-pkg" / "index.html").read_text() == "<a href='x'>kept</a>\n"
    root_page = (static / "simple" / "index.html").read_text()
    assert all(f'href="{p}/"' in root_page for p in ("alpha-pkg", "beta-pkg", "gamma-pkg"))


def test_static_index_refuses_other_content_under_a_name_and_writes_nothing(
    project: Path, tmp_path: Path
) -> None:
    static = tmp_path / "mirror"
    assert publish(project, "--static", str(static)).returncode == 0
    (alpha,) = (static / "packages").glob("alpha_pkg-*.whl")
    alpha.write_bytes(b"something else")
    before = {p: p.read_bytes() for p in static.rglob("*") if p.is_file()}
    result = publish(project, "--static", str(static))
    ours = hashlib.sha256((project / "wheelhouse" / alpha.name).read_bytes()).hexdigest()
    assert result.returncode == 1
    assert (
        f"error: {alpha} already exists with other content:\n"
        f"  index sha256 {hashlib.sha256(b'something else').hexdigest()}\n"
        f"  ours  sha256 {ours}\n"
        "An index never replaces a file; nothing was written. Bump the version (a changed "
        "series does) or publish to another directory.\n"
    ) in result.stderr
    assert {p: p.read_bytes() for p in static.rglob("*") if p.is_file()} == before


def test_static_index_again_from_the_same_wheelhouse_changes_nothing(
    project: Path, tmp_path: Path
) -> None:
    static = tmp_path / "mirror"
    assert publish(project, "--static", str(static)).returncode == 0
    before = {p: p.read_bytes() for p in static.rglob("*") if p.is_file()}
    again = publish(project, "--static", str(static))
    assert again.returncode == 0, again.stderr
    assert {p: p.read_bytes() for p in static.rglob("*") if p.is_file()} == before


def test_static_index_pages_and_modes(project: Path, tmp_path: Path) -> None:
    """The pages pip reads, byte for byte, and a tree a web server can serve as it is."""
    static = tmp_path / "mirror"
    result = publish(project, "--static", str(static))
    assert result.returncode == 0, result.stderr
    assert f"static index: {static}/simple/ (added 2 wheels; 2 projects)" in result.stderr
    (alpha,) = (static / "packages").glob("alpha_pkg-*.whl")
    digest = hashlib.sha256(alpha.read_bytes()).hexdigest()
    head = '<!DOCTYPE html>\n<html><head><meta name="pypi:repository-version" content="1.0">'
    assert (static / "simple/alpha-pkg/index.html").read_text() == (
        f"{head}<title>alpha-pkg</title></head>\n<body>\n"
        f'<a href="../../packages/{alpha.name.replace("+", "%2B")}#sha256={digest}">'
        f"{alpha.name}</a><br>\n</body></html>\n"
    )
    assert (static / "simple/index.html").read_text() == (
        f"{head}<title>Simple index</title></head>\n<body>\n"
        '<a href="alpha-pkg/">alpha-pkg</a><br>\n<a href="beta-pkg/">beta-pkg</a><br>\n'
        "</body></html>\n"
    )
    for directory in (static, static / "packages", static / "simple", static / "simple/alpha-pkg"):
        assert directory.stat().st_mode & 0o777 == 0o755, directory
    for file in (alpha, static / "simple/index.html", static / "simple/beta-pkg/index.html"):
        assert file.stat().st_mode & 0o777 == 0o644, file
    assert not [p for p in static.rglob(".*")]  # no .partial left


def test_static_index_refuses_a_file_or_a_foreign_directory(project: Path, tmp_path: Path) -> None:
    file = tmp_path / "mirror.txt"
    file.write_text("x")
    result = publish(project, "--static", str(file))
    assert result.returncode == 1
    assert f"error: --static {file} is a file; name a directory" in result.stderr
    half = tmp_path / "half"
    (half / "packages").mkdir(parents=True)  # packages/ without simple/: not ours to add to
    result = publish(project, "--static", str(half))
    assert result.returncode == 1
    assert (
        f"error: {half} is neither empty nor a static index (packages/ + simple/); "
        "choose another directory"
    ) in result.stderr
    assert [p.name for p in half.iterdir()] == ["packages"]


def test_a_project_page_lists_every_version_in_order(project: Path, tmp_path: Path) -> None:
    """write_static_index called as a library (no closure given), twice: the second
    wheelhouse's alpha joins the first's on one page."""
    static = tmp_path / "mirror"
    write_static_index(project / "wheelhouse", static, tmp_path / "cache")
    newer = tmp_path / "newer"
    (newer / "scratch").mkdir(parents=True)
    wheel = small_wheel(newer / "scratch", "alpha_pkg", "1.1")
    assemble_wheelhouse([wheel], [], newer / "wheelhouse")
    write_static_index(newer / "wheelhouse", static, tmp_path / "cache")
    files = sorted((static / "packages").glob("alpha_pkg-*.whl"))
    assert [f.name for f in files] == [
        "alpha_pkg-1.0+sm120.pabc12345-py3-none-any.whl",
        "alpha_pkg-1.1-py3-none-any.whl",
    ]
    links = [
        f'<a href="../../packages/{f.name.replace("+", "%2B")}#sha256='
        f'{hashlib.sha256(f.read_bytes()).hexdigest()}">{f.name}</a><br>\n'
        for f in files
    ]
    page = (static / "simple/alpha-pkg/index.html").read_text()
    assert page.endswith("<body>\n" + "".join(links) + "</body></html>\n")
