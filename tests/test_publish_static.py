"""Publishing as a static PEP 503 tree (--static): pip installs from it, it merges, it never
replaces a file, and its pages and modes are what a web server serves as they are."""

from __future__ import annotations

import hashlib
import shutil
import stat
from pathlib import Path
from typing import Any

from sm120_build import static_index
from sm120_build.publish import write_static_index
from sm120_build.wheels import assemble_wheelhouse

from .conftest import small_wheel, wheelhouse_project
from .test_publish import fresh_install, fresh_install_from, publish, required_versions


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
    assert (
        f"static index: {static}/simple/ (added 2 of 2 files, 0 already there; 2 projects)"
    ) in result.stderr
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
    again = publish(project, "--static", str(static))
    assert (
        f"static index: {static}/simple/ (added 0 of 2 files, 2 already there; 2 projects)"
    ) in again.stderr


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
    write_static_index(project / "wheelhouse", static)
    newer = tmp_path / "newer"
    (newer / "scratch").mkdir(parents=True)
    wheel = small_wheel(newer / "scratch", "alpha_pkg", "1.1")
    assemble_wheelhouse([wheel], [], [], newer / "wheelhouse")
    write_static_index(newer / "wheelhouse", static)
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


def _outside_and_mirror(project: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A published mirror, and a file outside it that a planted link points at."""
    static = tmp_path / "mirror"
    assert publish(project, "--static", str(static)).returncode == 0
    outside = tmp_path / "outside.txt"
    outside.write_text("not the mirror's")
    outside.chmod(0o600)
    return static, outside


def _assert_refused_naming(result: Any, link: Path, outside: Path) -> None:
    assert result.returncode == 1
    assert "holds symbolic links, which a static index never has" in result.stderr
    assert f"\n  {link}\n" in result.stderr
    assert outside.read_text() == "not the mirror's"
    assert stat.S_IMODE(outside.stat().st_mode) == 0o600


def test_a_planted_partial_link_is_refused_and_nothing_is_written_through_it(
    project: Path, tmp_path: Path
) -> None:
    """A packages/.X.partial link used to be followed: the outside file got the wheel's
    bytes and mode 644."""
    static, outside = _outside_and_mirror(project, tmp_path)
    (tmp_path / "newer-scratch").mkdir()
    newer = wheelhouse_project(
        tmp_path / "newer", [small_wheel(tmp_path / "newer-scratch", "alpha_pkg", "1.1")]
    )
    link = static / "packages" / ".alpha_pkg-1.1-py3-none-any.whl.partial"
    link.symlink_to(outside)
    _assert_refused_naming(publish(newer, "--static", str(static)), link, outside)
    assert not (static / "packages" / "alpha_pkg-1.1-py3-none-any.whl").exists()


def test_a_project_page_link_is_refused(project: Path, tmp_path: Path) -> None:
    """simple/<project> as a link used to have its index.html written outside."""
    static, outside = _outside_and_mirror(project, tmp_path)
    shutil.rmtree(static / "simple" / "alpha-pkg")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (static / "simple" / "alpha-pkg").symlink_to(elsewhere)
    result = publish(project, "--static", str(static))
    _assert_refused_naming(result, static / "simple" / "alpha-pkg", outside)
    assert list(elsewhere.iterdir()) == []


def test_a_packages_link_is_refused(project: Path, tmp_path: Path) -> None:
    """packages/ as a link used to send the wheels outside the mirror."""
    static, outside = _outside_and_mirror(project, tmp_path)
    shutil.rmtree(static / "packages")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (static / "packages").symlink_to(elsewhere)
    result = publish(project, "--static", str(static))
    _assert_refused_naming(result, static / "packages", outside)
    assert list(elsewhere.iterdir()) == []


def test_a_mirror_that_is_itself_a_link_is_refused(project: Path, tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "mirror").symlink_to(real)
    result = publish(project, "--static", str(tmp_path / "mirror"))
    assert result.returncode == 1
    assert "is a symbolic link; name the directory itself" in result.stderr
    assert list(real.iterdir()) == []


def test_a_link_planted_after_the_check_is_replaced_not_followed(tmp_path: Path) -> None:
    """Between the check and the write, a link at the very name being written: the rename
    replaces the link; the file it pointed at is untouched."""
    outside = tmp_path / "outside.txt"
    outside.write_text("not the mirror's")
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "index.html").symlink_to(outside)
    with static_index._opened(mirror) as directory:
        directory.write("index.html", b"page")
    assert outside.read_text() == "not the mirror's"
    assert not (mirror / "index.html").is_symlink()
    assert (mirror / "index.html").read_bytes() == b"page"


def test_copies_show_progress_and_lock_files_reach_the_tree(project: Path, tmp_path: Path) -> None:
    """Each copy is announced with its number and the running total; the wheelhouse's lock
    files land in locks/<digest>/, from which a node with only the tree installs."""
    static = tmp_path / "mirror"
    (project / "wheelhouse" / "node-lock.txt").write_text("# a lock\n")
    result = publish(project, "--static", str(static))
    assert result.returncode == 0, result.stderr
    copying = [line for line in result.stderr.splitlines() if "copying" in line]
    assert [line.split(" (")[1].split(",")[0] for line in copying] == ["1 of 2", "2 of 2"]
    (locks,) = (static / "locks").iterdir()
    requirements = (project / "wheelhouse" / "requirements.txt").read_bytes()
    assert locks.name == hashlib.sha256(requirements).hexdigest()[:16]
    assert (locks / "requirements.txt").read_bytes() == requirements
    assert (locks / "node-lock.txt").read_text() == "# a lock\n"
    assert (
        f"for nodes: {locks}/ (requirements.txt, node-lock.txt, SHA256SUMS, 0 envelopes)"
        in result.stderr
    )
    assert (locks / "SHA256SUMS").read_bytes() == (
        project / "wheelhouse" / "SHA256SUMS"
    ).read_bytes()
    installed = fresh_install_from(locks / "requirements.txt", static, tmp_path)
    for name, version in required_versions(project).items():
        assert installed[name] == version


def test_the_aarch64_wheelhouse_publishes_with_platform_and_only_then(
    tmp_path: Path,
) -> None:
    """`publish --platform aarch64` takes wheelhouse-aarch64/ (build_wheels --platform
    aarch64); without a build for it, it names the command that makes one."""
    (tmp_path / "scratch").mkdir()
    wheel = small_wheel(tmp_path / "scratch", "alpha_pkg", "1.0+sm120.pabc12345")
    root = wheelhouse_project(tmp_path / "project", [wheel])
    missing = publish(root, "--platform", "aarch64", "--static", str(tmp_path / "none"))
    assert missing.returncode == 1
    assert (
        "wheelhouse-aarch64/ does not exist: build it first (nox -s build_wheels -- "
        "--platform aarch64)"
    ) in missing.stderr
    assert not (tmp_path / "none").exists()
    (root / "wheelhouse").rename(root / "wheelhouse-aarch64")
    static = tmp_path / "mirror"
    result = publish(root, "--platform", "aarch64", "--static", str(static))
    assert result.returncode == 0, result.stderr
    assert (static / "packages" / wheel.name).is_file()
    unknown = publish(root, "--platform", "ppc64le", "--static", str(tmp_path / "other"))
    assert unknown.returncode == 1
    assert "the build can target x86_64, aarch64 hosts" in unknown.stderr
