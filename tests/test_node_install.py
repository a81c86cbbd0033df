"""A node that reaches only the internal index: a pypiserver with its fallback to the public
index off, fed by `publish` (and `publish --with-dependencies`) from a real build's
wheelhouse; then both README node recipes in fresh virtual environments that see that index
alone, each ending with `pip check` and the venv's own `sm120-node-check --arch 12.0`, with no
checkout of this repository on the path.

Reduced for CI: the wheelhouse without the sglang wheel, so the environments hold FlashInfer
(CPU torch) and not sglang's closure of gigabytes; the full sglang 0.5.9 closure was resolved,
mirrored and installed once by hand (docs/node-closure.md)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sm120_build.pins import load as load_pins

from .conftest import REPO, wheelhouse_project
from .test_build_e2e import node_check
from .test_publish import hash_checked_install, index, publish  # noqa: F401 (index: a fixture)

pytestmark = pytest.mark.slow  # a real build, a real index server, fresh venvs


@pytest.fixture
def flashinfer_project(built_project: Path, tmp_path: Path) -> Path:
    """The built wheelhouse less the sglang wheel, requirements.txt written again for it."""
    companions = list(load_pins(REPO / "pins.toml").companions.values())
    companion_prefixes = tuple(f"{pin.name.replace('-', '_')}-" for pin in companions)
    built = sorted((built_project / "wheelhouse").glob("*.whl"))
    ours = [p for p in built if not p.name.startswith(("sglang-", *companion_prefixes))]
    companion_wheels = [p for p in built if p.name.startswith(companion_prefixes)]
    return wheelhouse_project(tmp_path / "project", ours, companions, companion_wheels)


def fresh_venv(where: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    return where


def pip_check(venv: Path) -> None:
    result = subprocess.run(
        [str(venv / "bin/python"), "-m", "pip", "check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def checked_node(venv: Path, where: Path) -> None:
    where.mkdir()
    status, output, report = node_check(venv, where, "--arch", "12.0")
    assert status == 0, output
    assert report["jit_compiles"] == 0


def test_both_node_recipes_install_from_the_internal_index_alone(
    flashinfer_project: Path,
    index: Any,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    root = flashinfer_project
    target = f"{sys.version_info.major}.{sys.version_info.minor}"  # the venvs' own Python
    locked = subprocess.run(
        [sys.executable, "-m", "sm120_build", "lock-node", "--python-version", target],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert locked.returncode == 0, locked.stderr
    published = publish(
        root, "--repository-url", index.upload, "--index-url", index.simple, "--with-dependencies"
    )
    assert published.returncode == 0, published.stderr
    assert any(index.packages.glob("flashinfer_cubin-*.whl"))
    assert any(index.packages.glob("torch-*.whl"))

    # (a) An existing environment: stock flashinfer-python 0.6.3 with its dependencies, as
    # the public index gives them; our wheels swapped in from the internal index alone.
    existing = fresh_venv(tmp_path / "existing")
    stock = subprocess.run(
        [
            *(str(existing / "bin/python"), "-m", "pip", "install", "--quiet"),
            *("flashinfer-python==0.6.3", "torch==2.13.0"),
        ],
        capture_output=True,
        text=True,
    )
    assert stock.returncode == 0, stock.stderr
    swapped = hash_checked_install(
        existing / "bin/python", root / "wheelhouse/requirements.txt", "--index-url", index.simple
    )
    assert swapped.returncode == 0, swapped.stderr
    pip_check(existing)
    checked_node(existing, tmp_path / "a")
    shutil.rmtree(existing)  # 2.3 GB; the fresh node beside it takes 6.7 GB (CUDA torch)

    # (b) A fresh node: the whole lock from the internal index alone.
    fresh = fresh_venv(tmp_path / "fresh")
    installed = hash_checked_install(
        fresh / "bin/python", root / "wheelhouse/node-lock.txt", "--index-url", index.simple
    )
    assert installed.returncode == 0, installed.stderr
    pip_check(fresh)
    checked_node(fresh, tmp_path / "b")
