"""lock-node and publish --with-dependencies: the fresh-node closure, resolved by uv from
pip's configured sources, installed by pip with --require-hashes from the published index
alone; a tampered file fails with pip's own hash error."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sm120_build.node_lock import Target, parse_pins, platform_of
from sm120_build.sums import checked_wheels

from .conftest import installed_versions, small_wheel, wheel_in, wheelhouse_project
from .test_publish import hash_checked_install, index, publish  # noqa: F401 (index: a fixture)

pytestmark = pytest.mark.slow  # fresh virtual environments, real uv and pip


@pytest.fixture
def closure(tmp_path: Path) -> dict[str, Path]:
    """A project whose wheelhouse holds alpha (which needs gamma) and beta, and a find-links
    directory, pip's only configured source, that serves gamma."""
    links = tmp_path / "links"
    wheel_in(links, "gamma_pkg", "3.0")
    (tmp_path / "scratch").mkdir()
    wheels = [
        small_wheel(
            tmp_path / "scratch", "alpha_pkg", "1.0+sm120.pabc12345", requires=("gamma-pkg>=3",)
        ),
        small_wheel(tmp_path / "scratch", "beta_pkg", "2.0"),
    ]
    root = wheelhouse_project(tmp_path / "project", wheels)
    return {"root": root, "links": links, "tmp": tmp_path}


def pip_env(closure: dict[str, Path], **more: str) -> dict[str, str]:
    """pip configured as the build machine's: find-links only, no index."""
    return dict(
        os.environ,
        PIP_CONFIG_FILE=os.devnull,
        PIP_NO_INDEX="1",
        PIP_FIND_LINKS=str(closure["links"]),
        SM120_CACHE_DIR=str(closure["tmp"] / "cache"),
        HOME=str(closure["tmp"]),
        **more,
    )


def sm120_build(closure: dict[str, Path], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sm120_build", *args],
        cwd=closure["root"],
        env=pip_env(closure),
        capture_output=True,
        text=True,
        timeout=300,
    )


def fresh_venv(where: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    return where / "bin" / "python"


def test_the_lock_names_its_target_and_pins_the_whole_closure(closure: dict[str, Path]) -> None:
    result = sm120_build(closure, "lock-node", "--python-version", "3.11")
    assert result.returncode == 0, result.stderr
    lock = closure["root"] / "wheelhouse" / "node-lock.txt"
    text = lock.read_text()
    assert "Target: CPython 3.11, x86_64-manylinux_2_28; no torch in this closure." in text
    pins = {pin.name: pin for pin in parse_pins(text)}
    assert set(pins) == {"alpha-pkg", "beta-pkg", "gamma-pkg"}
    ours = {
        path.name.split("-")[0]: digest
        for path, digest in checked_wheels(closure["root"] / "wheelhouse").items()
    }
    assert pins["alpha-pkg"].hashes == (ours["alpha_pkg"],)
    assert pins["alpha-pkg"].version == "1.0+sm120.pabc12345"
    (gamma,) = closure["links"].glob("gamma_pkg-*.whl")
    import hashlib

    assert pins["gamma-pkg"].hashes == (hashlib.sha256(gamma.read_bytes()).hexdigest(),)

    # The published static index alone installs it, pip check clean.
    mirror = closure["tmp"] / "mirror"
    published = sm120_build(closure, "publish", "--static", str(mirror), "--with-dependencies")
    assert published.returncode == 0, published.stderr
    assert (mirror / "packages" / gamma.name).is_file()
    python = fresh_venv(closure["tmp"] / "node")
    installed = hash_checked_install(python, lock, "--index-url", (mirror / "simple").as_uri())
    assert installed.returncode == 0, installed.stderr
    env = {"PATH": os.environ["PATH"], "HOME": str(closure["tmp"])}
    assert installed_versions(python, env)["gamma-pkg"] == "3.0"
    check = subprocess.run([str(python), "-m", "pip", "check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout

    # A file that is not the one locked fails with pip's own hash error.
    tampered = closure["tmp"] / "tampered"
    tampered.mkdir()
    other = small_wheel(closure["tmp"], "gamma_pkg", "3.0", payload="changed = 1\n")
    shutil.move(other, tampered / gamma.name)
    for path in (closure["root"] / "wheelhouse").glob("*.whl"):
        shutil.copy(path, tampered)
    python = fresh_venv(closure["tmp"] / "node-tampered")
    refused = hash_checked_install(python, lock, "--no-index", "--find-links", str(tampered))
    assert refused.returncode != 0
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in refused.stderr
    assert "gamma-pkg" in refused.stderr.lower() or "gamma_pkg" in refused.stderr


def test_a_target_is_named_as_the_resolver_takes_it() -> None:
    from sm120_build.errors import UserError

    with pytest.raises(UserError, match=r"give MAJOR\.MINOR"):
        Target("3", "x86_64-manylinux_2_28")
    with pytest.raises(UserError, match="ARCH-manylinux_2_Y"):
        Target("3.12", "manylinux_2_28_x86_64")
    assert platform_of([Path("a-1-py3-none-any.whl")]) == "x86_64-manylinux_2_28"
    jit = Path("f-1-py3-none-manylinux_2_34_x86_64.whl")
    assert platform_of([jit, Path("a-1-py3-none-any.whl")]) == "x86_64-manylinux_2_34"
    tags = Target("3.12", "x86_64-manylinux_2_28").pip_platforms()
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags
    assert "manylinux2014_x86_64" in tags and "manylinux_2_29_x86_64" not in tags


def test_publish_with_dependencies_needs_the_lock(closure: dict[str, Path]) -> None:
    result = sm120_build(
        closure, "publish", "--static", str(closure["tmp"] / "m"), "--with-dependencies"
    )
    assert result.returncode == 1
    assert "node-lock.txt is missing: run `nox -s lock_node` first" in result.stderr
    assert not (closure["tmp"] / "m").exists()


def test_the_lock_keeps_to_pips_configured_constraints(closure: dict[str, Path]) -> None:
    """pip fetches the locked closure (publish --with-dependencies), so a version that pip's
    configured constraints exclude must not be locked: gamma 4.0 is served, the constraint
    caps it below 4, the lock pins 3.0."""
    wheel_in(closure["links"], "gamma_pkg", "4.0")
    constraints = closure["tmp"] / "constraints.txt"
    constraints.write_text("gamma-pkg<4\n")
    result = subprocess.run(
        [sys.executable, "-m", "sm120_build", "lock-node", "--python-version", "3.11"],
        cwd=closure["root"],
        env=pip_env(closure, PIP_CONSTRAINT=str(constraints)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    lock = (closure["root"] / "wheelhouse" / "node-lock.txt").read_text()
    assert {pin.name: pin.version for pin in parse_pins(lock)}["gamma-pkg"] == "3.0"


def test_a_wheelhouse_with_its_companion_installs_alone_and_locks(tmp_path: Path) -> None:
    """The build puts the pinned companion (flashinfer-cubin) into the wheelhouse: the
    offline recipe (--find-links wheelhouse/, no index) installs, and the lock takes the
    companion by one of its pinned hashes. A companion file that is not pinned is refused."""
    from sm120_build.pins import Companion

    links = tmp_path / "links"
    gamma = wheel_in(links, "gamma_pkg", "3.0")
    digest = hashlib.sha256(gamma.read_bytes()).hexdigest()
    (tmp_path / "scratch").mkdir()
    alpha = small_wheel(tmp_path / "scratch", "alpha_pkg", "1.0+sm120.p1", requires=("gamma-pkg",))
    pin = Companion("gamma-pkg", "3.0", ("0" * 64, digest))
    root = wheelhouse_project(tmp_path / "project", [alpha], [pin], [gamma])
    wheelhouse = root / "wheelhouse"

    python = fresh_venv(tmp_path / "offline")
    offline = hash_checked_install(
        python, wheelhouse / "requirements.txt", "--no-index", "--find-links", str(wheelhouse)
    )
    assert offline.returncode == 0, offline.stderr
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    assert installed_versions(python, env)["gamma-pkg"] == "3.0"

    closure = {"root": root, "links": links, "tmp": tmp_path}
    result = sm120_build(closure, "lock-node", "--python-version", "3.11")
    assert result.returncode == 0, result.stderr
    locked = {pin.name: pin for pin in parse_pins((wheelhouse / "node-lock.txt").read_text())}
    assert locked["gamma-pkg"].hashes == (digest,)

    unpinned = wheelhouse_project(
        tmp_path / "unpinned", [alpha], [Companion("gamma-pkg", "3.0", ("0" * 64,))], [gamma]
    )
    refused = sm120_build({**closure, "root": unpinned}, "lock-node", "--python-version", "3.11")
    assert refused.returncode == 1
    assert f"{gamma.name} is not what {unpinned / 'wheelhouse' / 'requirements.txt'} pins" in (
        refused.stderr
    )
    assert not (unpinned / "wheelhouse" / "node-lock.txt").exists()


def test_pylock_from_the_published_index_installs_with_uv_and_pip(
    closure: dict[str, Path],
    index: Any,  # noqa: F811 (the fixture imported above)
) -> None:
    """lock-node, publish --with-dependencies to a pypiserver (fallback off), then
    lock-node --pylock-index: uv's pylock.toml names that index's files, pins what
    node-lock.txt pins, and installs with `uv pip sync` and with pip's `-r pylock.toml`
    into fresh venvs. A hash edited in it makes both refuse."""
    from sm120_build.pins import read_toml

    assert sm120_build(closure, "lock-node", "--python-version", "3.11").returncode == 0
    early = sm120_build(closure, "lock-node", "--pylock-index", index.simple)
    assert early.returncode == 1
    assert "(publish the closure there first: publish --with-dependencies)" in early.stderr
    assert not (closure["root"] / "wheelhouse" / "pylock.toml").exists()
    published = publish(
        closure["root"],
        "--repository-url",
        index.upload,
        "--index-url",
        index.simple,
        "--with-dependencies",
        find_links=closure["links"],
    )
    assert published.returncode == 0, published.stderr
    made = sm120_build(closure, "lock-node", "--pylock-index", index.simple)
    assert made.returncode == 0, made.stderr
    pylock = closure["root"] / "wheelhouse" / "pylock.toml"
    data = read_toml(pylock)
    lock = {
        pin.name: pin
        for pin in parse_pins((closure["root"] / "wheelhouse" / "node-lock.txt").read_text())
    }
    assert {p["name"] for p in data["packages"]} == set(lock)
    for package in data["packages"]:
        (file,) = package["wheels"]
        assert file["url"].startswith(index.simple.rsplit("/simple", 1)[0])
        assert (file["hashes"]["sha256"],) == lock[package["name"]].hashes

    node_env = {
        "PATH": os.environ["PATH"],
        "HOME": str(closure["tmp"]),
        "PIP_CONFIG_FILE": os.devnull,
    }

    def uv_sync(python: Path) -> list[str]:
        """uv's install of the lock into `python`'s environment, nothing else in it."""
        return [
            sys.executable,
            "-m",
            "uv",
            "pip",
            "sync",
            "--no-config",
            "-p",
            str(python),
            str(pylock),
        ]

    uv_venv = closure["tmp"] / "uv-node"
    subprocess.run(
        [sys.executable, "-m", "uv", "venv", "-q", "-p", sys.executable, str(uv_venv)], check=True
    )
    synced = subprocess.run(
        uv_sync(uv_venv / "bin/python"), env=node_env, capture_output=True, text=True
    )
    assert synced.returncode == 0, synced.stderr
    version = subprocess.run(  # uv's venv has no pip: ask the installed metadata
        [
            str(uv_venv / "bin/python"),
            "-c",
            "import importlib.metadata as m; print(m.version('gamma-pkg'))",
        ],
        capture_output=True,
        text=True,
    )
    assert version.stdout.strip() == "3.0", version.stderr

    def pip_node(name: str) -> Path:
        """A fresh venv with a pip that reads pylock.toml (26.1 and later)."""
        python = fresh_venv(closure["tmp"] / name)
        upgraded = subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "pip==26.3"],
            capture_output=True,
            text=True,
        )
        assert upgraded.returncode == 0, upgraded.stderr
        return python

    python = pip_node("pip-node")
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "-r", str(pylock)],
        env=node_env,
        capture_output=True,
        text=True,
    )
    assert installed.returncode == 0, installed.stderr
    assert installed_versions(python, node_env)["alpha-pkg"] == "1.0+sm120.pabc12345"

    gamma = lock["gamma-pkg"].hashes[0]
    pylock.write_text(pylock.read_text().replace(gamma, "0" * 64))
    for command in (
        uv_sync(fresh_venv(closure["tmp"] / "uv2")),
        [str(pip_node("pip2")), "-m", "pip", "install", "-r", str(pylock)],
    ):
        refused = subprocess.run(command, env=node_env, capture_output=True, text=True)
        assert refused.returncode != 0
        assert "hash" in (refused.stdout + refused.stderr).lower()
