"""Shared fixtures: small generated sdists and patch series, and the real project layout."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from sm120_build.errors import UserError
from sm120_build.pins import Companion, Upstream
from sm120_build.pins import load as load_pins
from sm120_build.wheels import assemble_wheelhouse, finalize_wheel

REPO = Path(__file__).resolve().parents[1]
PINS_TOOLKIT = load_pins(REPO / "pins.toml").toolkit_requirement


def make_tarball(path: Path, members: dict[str, str], top: str = "demo-1.0") -> Path:
    """A gzipped tarball whose files live under one top-level directory."""
    with tarfile.open(path, "w:gz") as archive:
        for name, text in sorted(members.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{name}" if top else name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def record_of(files: dict[str, bytes]) -> tuple[str, bytes]:
    """(RECORD's name, its bytes) for a wheel holding `files`: each file with its urlsafe
    base64 sha256 and size, as the wheel spec has it (written here, not by the code under
    test)."""
    (dist_info,) = {name.split("/")[0] for name in files if ".dist-info/" in name}
    record_name = f"{dist_info}/RECORD"
    rows = []
    for name, data in sorted(files.items()):
        if name != record_name:
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            rows.append(f"{name},sha256={digest.decode()},{len(data)}\n")
    rows.append(f"{record_name},,\n")
    return record_name, "".join(rows).encode()


def write_tree(root: Path, files: dict[str, str]) -> Path:
    """`files` (path relative to `root` -> text) written under `root`, with their
    directories; `root`."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@contextmanager
def sglang_modules_forgotten() -> Iterator[None]:
    """Every sglang module imported meanwhile (a test's generated sglang, imported in
    process and patched by the render) forgotten afterwards."""
    before = set(sys.modules)
    try:
        yield
    finally:
        for name in set(sys.modules) - before:
            if name == "sglang" or name.startswith("sglang."):
                del sys.modules[name]


def refusal(call: Callable[..., object], *args: object) -> str:
    """What `call(*args)` refuses with: its UserError's message (it must raise one)."""
    with pytest.raises(UserError) as refused:
        call(*args)
    return str(refused.value)


def free_port() -> int:
    """A loopback port nothing listens on when this returns."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def zip_wheel(path: Path, files: dict[str, bytes]) -> Path:
    """A wheel holding `files` (a .so executable) and a RECORD that lists them."""
    record_name, record = record_of(files)
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in {**files, record_name: record}.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o100755 if name.endswith(".so") else 0o100644) << 16
            archive.writestr(info, data)
    return path


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The compile tests (marked `mutation`) after the rest: the mutation run stops at a
    mutant's first failing test (`-x`), so it pays for nvcc only when no quicker test
    failed first. The sort is stable: the order is otherwise pytest's own."""
    items.sort(key=lambda item: item.get_closest_marker("mutation") is not None)


def fixture_upstream(sdist: Path, name: str = "demo") -> Upstream:
    return Upstream(
        name=name,
        project="demo",
        version="1.0",
        sdist=sdist.name,
        sha256=hashlib.sha256(sdist.read_bytes()).hexdigest(),
        git_url="",
        git_tag="",
        git_commit="",
    )


HEADER = (
    "Description: {subject}\n Why this change exists.\nAuthor: test suite\nForwarded: not-needed\n"
)


def make_patch(path: Path, file: str, lines: list[str], index: int, new: str, subject: str) -> Path:
    """A one-hunk patch that replaces lines[index] by `new`, with three lines of context."""
    start, end = max(0, index - 3), min(len(lines), index + 4)
    body = [(" " if n != index else "-") + lines[n] for n in range(start, end)]
    body.insert(index - start + 1, "+" + new)
    count = end - start
    path.write_text(
        HEADER.format(subject=subject) + "\n"
        f"diff --git a/{file} b/{file}\n--- a/{file}\n+++ b/{file}\n"
        f"@@ -{start + 1},{count} +{start + 1},{count} @@\n" + "\n".join(body) + "\n"
    )
    return path


@pytest.fixture
def demo(tmp_path: Path) -> Callable[..., tuple[Upstream, Path, Path]]:
    """An sdist with one file, plus an empty series directory: (upstream, sdist, series)."""

    def create(lines: list[str] | None = None) -> tuple[Upstream, Path, Path]:
        text = "\n".join(lines or ["alpha", "beta", "gamma"]) + "\n"
        sdist = make_tarball(tmp_path / "demo-1.0.tar.gz", {"src/code.txt": text})
        series = tmp_path / "patches" / "demo"
        series.mkdir(parents=True)
        (series / "series").write_text("")
        return fixture_upstream(sdist), sdist, series

    return create


def write_series(series: Path, *patches: Path) -> None:
    (series / "series").write_text("".join(f"{p.name}\n" for p in patches))


def fresh_root(base: Path) -> Path:
    """A scratch project root with this repo's pins, waivers, audit scope, profiles,
    patches, ci/ and kernel project."""
    root = base / "project"
    root.mkdir(parents=True)
    shutil.copy(REPO / "pins.toml", root)
    shutil.copy(REPO / "audit-waivers.toml", root)
    shutil.copy(REPO / "audit-scope.toml", root)
    shutil.copy(REPO / "profiles.toml", root)
    shutil.copy(REPO / "profiles-derived.toml", root)  # profiles.toml includes it
    shutil.copytree(REPO / "patches", root / "patches")
    shutil.copytree(REPO / "ci", root / "ci")  # the shard plan's cost table
    shutil.copytree(
        REPO / "kernel",
        root / "kernel",
        ignore=shutil.ignore_patterns("__pycache__", "_build_meta.py"),
    )
    return root


def run_build(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`sm120-build build-wheels` in root, with a build cache of its own."""
    env = dict(os.environ, SM120_CACHE_DIR=str(root / ".cache"))
    return subprocess.run(
        [sys.executable, "-m", "sm120_build", "build-wheels", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )


def installed_versions(python: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """What `python`'s environment holds, by pip's own listing: canonical name -> version."""
    listing = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=freeze"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {
        canonicalize_name(name): version
        for name, version in (line.split("==") for line in listing.split() if "==" in line)
    }


def build_wheels(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    result = run_build(root, *args)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    return result


def install_this_project(python: str, scratch: Path, extras: str = "") -> None:
    """pip install this checkout's package, as it is now, into `python`'s environment, from
    a copy (a build from the checkout itself leaves build/ and an .egg-info in it): as a
    node has it, or with `extras` ("forge": as the build machine has it)."""
    copy = scratch / "sm120-build-source"
    copy.mkdir()
    shutil.copy(REPO / "pyproject.toml", copy)
    shutil.copytree(REPO / "src", copy / "src", ignore=shutil.ignore_patterns("*.egg-info"))
    target = f"{copy}[{extras}]" if extras else str(copy)
    subprocess.run([python, "-m", "pip", "install", "--quiet", target], check=True, cwd=scratch)


@pytest.fixture(scope="module")
def module_tmp(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str], Path]]:
    """`tmp_path_factory.mktemp` for module-scoped fixtures. What it made is removed when the
    module's tests end, unless one of them failed (kept to look at, as pyproject's
    tmp_path_retention_policy keeps a failed test's tmp_path). Without this, the slow suite
    held every module's project roots and node venvs (1.3 GB and 2 to 7 GB each) until the
    session ended: 34 GB, which filled CI's disk. One module's failure keeps only its own:
    keeping every later module's too filled the disk again, failing tests that had no fault."""
    made: list[Path] = []
    failed_before = request.session.testsfailed

    def mktemp(name: str) -> Path:
        made.append(tmp_path_factory.mktemp(name))
        return made[-1]

    yield mktemp
    if request.session.testsfailed == failed_before:
        for path in made:
            shutil.rmtree(path, ignore_errors=True)


def ed25519_key_pair(directory: Path) -> tuple[Path, Path]:
    """A signing key and its public key in PEM, as `openssl genpkey -algorithm ed25519` and
    `openssl pkey -pubout` write them: (private, public)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private, public = directory / "sign.key", directory / "sign.pub"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return private, public


@pytest.fixture(scope="session")
def built_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One clean build of the default configuration (sm_120a, pinned toolkit), its
    provenance signed with the key pair in the directory above it (sign.key, sign.pub)."""
    base = tmp_path_factory.mktemp("first")
    private, _ = ed25519_key_pair(base)
    root = fresh_root(base)
    build_wheels(root, "--sign-key", str(private))
    return root


@pytest.fixture(scope="session")
def vendored_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This repo's pins and patches, vendored with a fresh cache (a real fetch)."""
    root = fresh_root(tmp_path_factory.mktemp("vendored"))
    env = dict(os.environ, SM120_CACHE_DIR=str(root / ".cache"))
    subprocess.run([sys.executable, "-m", "sm120_build", "vendor"], cwd=root, env=env, check=True)
    return root


# Small wheels and a project whose wheelhouse holds two, for the publishing tests.


def small_wheel(
    directory: Path,
    name: str,
    version: str,
    payload: str = "",
    requires: tuple[str, ...] = (),
    description: tuple[str, str] = ("text/plain", "A test wheel.\n"),
) -> Path:
    """A finalized pure wheel; `description` is its long description's (type, text)."""
    metadata = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: test\n"
        + "".join(f"Requires-Dist: {requirement}\n" for requirement in requires)
        + f"Description-Content-Type: {description[0]}\n\n{description[1]}"
    )
    raw = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(raw, "w") as archive:
        archive.writestr(f"{name}/__init__.py", payload)
        archive.writestr(f"{name}-{version}.dist-info/METADATA", metadata)
        archive.writestr(
            f"{name}-{version}.dist-info/WHEEL",
            "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
    (directory / "final").mkdir(exist_ok=True)
    return finalize_wheel(raw, directory / "final", {})


def sglang_wheel(
    directory: Path,
    version: str,
    tag: str,
    metadata: bytes = b"",
    files: dict[str, bytes] | None = None,
) -> Path:
    """An sglang wheel for one target `tag`, as sglang publishes only wheels since 0.5.11:
    `metadata` follows its METADATA's Version line (Requires-Dist lines, say)."""
    info = f"sglang-{version}.dist-info"
    return zip_wheel(
        directory / f"sglang-{version}-{tag}.whl",
        {
            **(files or {"sglang/__init__.py": b""}),
            f"{info}/METADATA": (
                f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n".encode() + metadata
            ),
            f"{info}/WHEEL": f"Wheel-Version: 1.0\nTag: {tag}\n".encode(),
        },
    )


def wheel_in(links: Path, name: str, version: str, payload: str = "") -> Path:
    """A small wheel in a find-links directory (as pip's only configured source serves)."""
    links.mkdir(exist_ok=True)
    built = small_wheel(links, name, version, payload)
    return Path(shutil.move(built, links / built.name))


def wheelhouse_project(
    root: Path,
    wheels: list[Path],
    companions: Sequence[Companion] = (),
    companion_wheels: Sequence[Path] = (),
) -> Path:
    """A project root holding this repo's pins.toml and a wheelhouse of `wheels` (and of
    `companion_wheels`, as `build_wheels` fetches them), as `build_wheels` leaves one for
    publish and lock_node."""
    root.mkdir(parents=True)
    shutil.copy(REPO / "pins.toml", root)
    assemble_wheelhouse(wheels, list(companions), list(companion_wheels), root / "wheelhouse")
    return root


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project root whose wheelhouse holds two small wheels."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    wheels = [
        small_wheel(scratch, "alpha_pkg", "1.0+sm120.pabc12345"),
        small_wheel(scratch, "beta_pkg", "2.0"),
    ]
    return wheelhouse_project(tmp_path / "project", wheels)
