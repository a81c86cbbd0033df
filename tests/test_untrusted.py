"""Hostile input can neither run code nor plant files: base and shard wheels, sdists (pinned
and candidate), a wheelhouse on a node, credentials in URLs, paths the toolchain cannot
take. Each hostile input is made here."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import time
import venv
import zipfile
from pathlib import Path

import pytest

from sm120_build.bump.candidate import fetch_candidate
from sm120_build.cache import sha256_of
from sm120_build.errors import UserError
from sm120_build.fetch import fetch_sdist
from sm120_build.jit_cache.overlay import check_base, overlay_base
from sm120_build.jit_cache.shards import ShardSpec, read_shards, write_shard
from sm120_build.vendor import vendor_upstream

from .conftest import (
    REPO,
    fixture_upstream,
    install_this_project,
    make_tarball,
    record_of,
    refusal,
    zip_wheel,
)

MODULE = "flashinfer_jit_cache/jit_cache/norm/norm.so"


def jit_cache_files(version: str, extra: dict[str, bytes] | None = None) -> dict[str, bytes]:
    return {
        "flashinfer_jit_cache/__init__.py": b"",
        MODULE: b"\x7fELF norm",
        f"flashinfer_jit_cache-{version}.dist-info/WHEEL": b"Wheel-Version: 1.0\n",
        **(extra or {}),
    }


def base_wheel(directory: Path, files: dict[str, bytes]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    return zip_wheel(directory / "flashinfer_jit_cache-0.6.3+cu130-py3-none-any.whl", files)


# --- base wheels ---------------------------------------------------------------------------


def test_a_base_wheel_member_that_climbs_out_is_refused_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    """`jit_cache/../../sitecustomize.py` used to be copied into our wheel, hash-pinned,
    and counted as a kept module: on a node it ran on every `python -c pass`."""
    planted = "flashinfer_jit_cache/jit_cache/../../sitecustomize.py"
    base = base_wheel(tmp_path / "base", jit_cache_files("0.6.3+cu130", {planted: b"evil()\n"}))
    ours = base_wheel(tmp_path / "ours", jit_cache_files("0.6.3+cu130"))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(UserError, match=r"refusing member '.*\.\./\.\./sitecustomize\.py'"):
        overlay_base(ours, base, out)
    assert list(out.iterdir()) == []


@pytest.mark.parametrize(
    ("member", "why"),
    [
        ("/etc/sitecustomize.py", "absolute path"),
        ("flashinfer_jit_cache/./jit_cache/norm/x.so", "normalised"),
        ("sitecustomize.py", "outside flashinfer_jit_cache/"),
        ("flashinfer_jit_cache-0.6.3+cu130.data/purelib/evil.pth", "outside flashinfer_jit_cache/"),
        ("flashinfer_jit_cache/jit_cache/loose.so", "not inside a module's directory"),
    ],
)
def test_base_wheel_members_may_only_go_where_a_jit_cache_keeps_them(
    tmp_path: Path, member: str, why: str
) -> None:
    base = base_wheel(tmp_path, jit_cache_files("0.6.3+cu130", {member: b"x"}))
    with pytest.raises(UserError, match=why) as caught:
        check_base(base, "0.6.3")
    assert str(caught.value).startswith(f"--base-jit-cache {base.name}: refusing member ")


def test_a_well_formed_jit_cache_wheel_with_its_licences_is_taken(tmp_path: Path) -> None:
    """PEP 639 puts licence texts in .dist-info/licenses/: a real jit-cache wheel has them."""
    licence = "flashinfer_jit_cache-0.6.3+cu130.dist-info/licenses/licenses/FlashInfer-LICENSE.txt"
    check_base(base_wheel(tmp_path, jit_cache_files("0.6.3+cu130", {licence: b"text"})), "0.6.3")


def test_a_base_wheel_with_a_link_member_is_refused(tmp_path: Path) -> None:
    base = base_wheel(tmp_path, jit_cache_files("0.6.3+cu130"))
    with zipfile.ZipFile(base, "a") as archive:
        link = zipfile.ZipInfo("flashinfer_jit_cache/jit_cache/norm/link.so")
        link.external_attr = 0o120777 << 16
        archive.writestr(link, "/usr/lib/python3/sitecustomize.py")
    with pytest.raises(UserError, match="symbolic link"):
        check_base(base, "0.6.3")


def test_a_base_wheel_whose_record_does_not_match_is_refused(tmp_path: Path) -> None:
    files = jit_cache_files("0.6.3+cu130")
    base = base_wheel(tmp_path, files)
    record_name, record = record_of(files)
    with zipfile.ZipFile(base, "w") as archive:  # the same RECORD, the module changed
        for name, data in {**files, MODULE: b"\x7fELF other", record_name: record}.items():
            archive.writestr(name, data)
    with pytest.raises(UserError, match=r"norm\.so does not match its RECORD"):
        check_base(base, "0.6.3")


# --- shard wheels --------------------------------------------------------------------------


def test_a_shard_wheel_changed_after_build_shard_is_not_merged(tmp_path: Path) -> None:
    """16 changed bytes in a shard's norm.so used to come out of the merge with a fresh
    RECORD, SHA256SUMS and hashes."""
    plan = [["norm"]]
    files = jit_cache_files("1")
    wheel = zip_wheel(tmp_path / "flashinfer_jit_cache-1-py3-none-any.whl", files)
    record = {"key": "k", "index": 1, "count": 1, "plan": plan, "modules": {"norm": "norm"}}
    shards = tmp_path / "shards"
    written = write_shard(shards, ShardSpec(1, 1), wheel, record)
    assert read_shards(shards)[0].record["wheel"]["file"] == wheel.name
    # Tampered consistently: a valid wheel with a fresh RECORD, only the bytes differ.
    recorded = sha256_of(wheel)
    tampered = {**files, MODULE: b"\x7fELF norm" + b"\x90" * 16}
    zip_wheel(written / wheel.name, tampered)
    assert refusal(read_shards, shards) == (
        f"shard 1-of-1: {wheel.name} is not the wheel its build recorded ({wheel.name}, "
        f"sha256 {recorded}; it has {sha256_of(written / wheel.name)}). It changed after "
        "`build_shard`: build that shard again, or fetch it again from its build."
    )


def test_a_shard_wheel_recorded_with_a_planted_member_is_not_merged(tmp_path: Path) -> None:
    """The hash matches (the shard's own build recorded it), the member does not belong in
    a jit-cache wheel: refused by the shard's name before the merge reads anything."""
    planted = {**jit_cache_files("1"), "sitecustomize.py": b"evil()\n"}
    wheel = zip_wheel(tmp_path / "flashinfer_jit_cache-1-py3-none-any.whl", planted)
    record = {"key": "k", "index": 1, "count": 1, "plan": [["norm"]], "modules": {"norm": "r"}}
    write_shard(tmp_path / "shards", ShardSpec(1, 1), wheel, record)
    assert refusal(read_shards, tmp_path / "shards").startswith(
        f"shard 1-of-1: {wheel.name}: refusing member 'sitecustomize.py': it "
    )


# --- sdists: nothing of them ever runs -----------------------------------------------------


def hostile_sdist(path: Path, marker: Path, version: str = "1.0") -> Path:
    """An sdist whose setup.py (and PEP 517 backend through it) writes `marker`."""
    return make_tarball(
        path,
        {
            "PKG-INFO": f"Metadata-Version: 2.1\nName: demo\nVersion: {version}\n",
            "setup.py": f"open({str(marker)!r}, 'w').write('ran')\n"
            f"from setuptools import setup\nsetup(name='demo', version='{version}')\n",
            "src/code.txt": "alpha\n",
        },
        top=f"demo-{version}",
    )


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """pip configured, through its own variables, to see only a local find-links directory."""
    links = tmp_path / "links"
    links.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    # pip: "0" turns build isolation off, so that a pip that did prepare an sdist's
    # metadata would run its setup.py with the setuptools at hand (and write the marker).
    monkeypatch.setenv("PIP_NO_BUILD_ISOLATION", "0")
    monkeypatch.delenv("PIP_CONSTRAINT", raising=False)
    return links


def test_vendoring_a_pinned_sdist_never_runs_it(served: Path, tmp_path: Path) -> None:
    """Case 2d: the pin names a hostile file (its hash matches). pip's download used to run
    its setup.py to read its metadata; now nothing of it runs, fetching or vendoring."""
    marker = tmp_path / "setup-py-ran"
    upstream = fixture_upstream(hostile_sdist(served / "demo-1.0.tar.gz", marker))
    sdist = fetch_sdist(upstream, tmp_path / "sdists")
    series = tmp_path / "patches" / "demo"
    series.mkdir(parents=True)
    (series / "series").write_text("")
    vendor_upstream(upstream, sdist, series, tmp_path / "vendor" / "demo")
    assert (tmp_path / "vendor" / "demo" / "setup.py").is_file()
    assert not marker.exists()


def test_a_bump_candidate_sdist_is_never_run(served: Path, tmp_path: Path) -> None:
    marker = tmp_path / "setup-py-ran"
    hostile_sdist(served / "demo-2.0.tar.gz", marker, version="2.0")
    pinned = fixture_upstream(hostile_sdist(tmp_path / "demo-1.0.tar.gz", marker))
    (tmp_path / "scratch").mkdir()
    (sdist,) = fetch_candidate(pinned, "2.0", tmp_path / "scratch")
    assert sdist.name == "demo-2.0.tar.gz"
    assert not marker.exists()


def test_an_sdist_with_a_link_member_writes_nothing_through_it(
    served: Path, tmp_path: Path
) -> None:
    """pip's unpack used to write through a symlink member before the tool refused it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    sdist = served / "demo-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as archive:
        link = tarfile.TarInfo("demo-1.0/escape")
        link.type, link.linkname = tarfile.SYMTYPE, str(outside)
        archive.addfile(link)
        data = b"planted\n"
        member = tarfile.TarInfo("demo-1.0/escape/planted.txt")
        member.size = len(data)
        archive.addfile(member, io.BytesIO(data))
    upstream = fixture_upstream(sdist)
    fetched = fetch_sdist(upstream, tmp_path / "sdists")
    series = tmp_path / "patches" / "demo"
    series.mkdir(parents=True)
    (series / "series").write_text("")
    with pytest.raises(UserError, match=r"refusing link 'demo-1\.0/escape'"):
        vendor_upstream(upstream, fetched, series, tmp_path / "vendor" / "demo")
    assert list(outside.iterdir()) == []


# --- the wheelhouse on a node ------------------------------------------------------------


def fake_pure_wheel(directory: Path, project: str, version: str, body: bytes) -> Path:
    package = project.replace("-", "_")
    return zip_wheel(
        directory / f"{package}-{version}-py3-none-any.whl",
        {
            f"{package}/__init__.py": body,
            f"{package}-{version}.dist-info/METADATA": (
                f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n".encode()
            ),
            f"{package}-{version}.dist-info/WHEEL": (
                b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
            ),
        },
    )


def wheelhouse_of(directory: Path, body: bytes) -> Path:
    directory.mkdir(parents=True)
    # The three wheels the node installs (node/install.OURS).
    for project, version in (
        ("flashinfer-python", "0.6.3"),
        ("flashinfer-jit-cache", "0.6.3"),
        ("sglang", "0.5.9"),
    ):
        fake_pure_wheel(directory, project, f"{version}+sm120.p12345678", body)
    (directory / "SHA256SUMS").write_text(
        "".join(
            f"{__import__('hashlib').sha256(p.read_bytes()).hexdigest()}  {p.name}\n"
            for p in sorted(directory.glob("*.whl"))
        )
    )
    return directory


def node_python(tmp_path: Path) -> Path:
    """A node's venv, holding this package with its requirements, as the wheelhouse installs
    it."""
    venv.create(tmp_path / "node", with_pip=True)
    python = tmp_path / "node" / "bin" / "python"
    install_this_project(str(python), tmp_path)
    return python


def install_from(python: Path, wheelhouse: Path) -> subprocess.CompletedProcess[str]:
    code = "import sys, pathlib; from sm120_build.node.install import install_checked; "
    code += "from sm120_build.errors import exit_status; "
    code += f"sys.exit(exit_status(lambda: install_checked(pathlib.Path({str(wheelhouse)!r})) "
    code += "or 0, False))"
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True)


@pytest.mark.slow
def test_the_node_installs_only_what_sha256sums_vouches_for(tmp_path: Path) -> None:
    """A .pth added to the flashinfer-python wheel used to be installed, and it ran; with
    the same version already installed, the old install was kept and checked."""
    python = node_python(tmp_path)
    first = wheelhouse_of(tmp_path / "first", b"WHICH = 'first'\n")
    assert install_from(python, first).returncode == 0
    second = wheelhouse_of(tmp_path / "second", b"WHICH = 'second'\n")
    # The same version again, other bytes: installed over the first, not skipped.
    assert install_from(python, second).returncode == 0
    which = subprocess.run(
        [str(python), "-c", "import flashinfer_python as m; print(m.WHICH)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert which.stdout.strip() == "second"
    # A .pth planted in a wheel after the build: refused before pip runs.
    marker = tmp_path / "pth-ran"
    (planted,) = second.glob("flashinfer_python-*.whl")
    with zipfile.ZipFile(planted, "a") as archive:
        archive.writestr("evil.pth", f"import os; open({str(marker)!r}, 'w')\n")
    result = install_from(python, second)
    assert result.returncode == 1
    assert "does not match SHA256SUMS" in result.stderr
    subprocess.run([str(python), "-c", "pass"], check=True)
    assert not marker.exists()


# --- credentials and paths -----------------------------------------------------------------


def test_nox_never_echoes_a_password_in_a_url(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "nox",
            "--noxfile",
            str(REPO / "noxfile.py"),
            "--envdir",
            str(tmp_path / "envs"),
            "-s",
            "publish",
            "--",
            "--repository-url",
            "https://alice:s3cret-token@127.0.0.1:9/",
            "--index-url",
            "https://127.0.0.1:9/simple/",
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0
    assert "carries credentials" in result.stderr
    assert "s3cret-token" not in result.stdout + result.stderr


def test_a_cache_path_with_a_space_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """It used to fail after about 90 s of compiling, with an nvcc error naming nothing."""
    root = tmp_path / "project"
    root.mkdir()
    for name in ("pins.toml", "profiles.toml", "profiles-derived.toml"):
        shutil.copy(REPO / name, root)
    cache = tmp_path / "build cache"
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "sm120_build", "build-wheels"],
        cwd=root,
        env=dict(os.environ, SM120_CACHE_DIR=str(cache)),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert time.monotonic() - started < 30
    assert f"the cache (SM120_CACHE_DIR) is {str(cache)!r}" in result.stderr
    assert "set SM120_CACHE_DIR" in result.stderr
    assert not (root / "vendor").exists()


def test_unmarked_nonempty_cache_dirs_need_force_on_the_command_line(tmp_path: Path) -> None:
    root = tmp_path / "project"
    root.mkdir()
    shutil.copy(REPO / "pins.toml", root)
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / ".tmp-x").write_text("someone else's\n")
    env = dict(os.environ, SM120_CACHE_DIR=str(shared))
    command = [sys.executable, "-m", "sm120_build", "export-patches"]
    refused = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
    assert refused.returncode == 1 and "--force" in refused.stderr
    adopted = subprocess.run(
        [*command, "--force"], cwd=root, env=env, capture_output=True, text=True
    )
    assert "not marked" not in adopted.stderr
    assert (shared / ".tmp-x").read_text() == "someone else's\n"
