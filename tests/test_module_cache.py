"""Built modules cached one by one: keys, storing from a built wheel, reuse, damage."""

from __future__ import annotations

import dataclasses
import json
import zipfile
from pathlib import Path
from typing import Any

import pytest

from sm120_build.jit_cache import module_cache
from sm120_build.jit_cache.cmake import KernelBuild
from sm120_build.jit_cache.render import Module
from sm120_build.layout import JIT_CACHE_PREFIX

from .conftest import zip_wheel

PACKAGE = {
    "flashinfer_jit_cache/__init__.py": b"",
    "flashinfer_jit_cache-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\n",
}


def module(called: str, **changes: object) -> Module:
    fields: dict[str, object] = {
        "name": called,
        "recipe": "recipe",
        "cuda_sources": [f"/tmp/src/{called}.cu"],
        "cxx_sources": [],
        "cuda_flags": ["-O3", "-gencode=arch=compute_120f,code=sm_120f"],
        "cxx_flags": ["-O3"],
        "link_flags": ["-shared"],
        "device_link": False,
    }
    fields.update(changes)
    return Module(**fields)  # type: ignore[arg-type]


def command(name: str) -> list[str]:
    return ["nvcc", f"-D{name}_EXPORTS", "-c", f"{name}.cu", "-o", f"CMakeFiles/{name}.dir/x.o"]


def contents(wheel: Path) -> dict[str, tuple[bytes, int]]:
    with zipfile.ZipFile(wheel) as archive:
        return {i.filename: (archive.read(i), i.external_attr >> 16) for i in archive.infolist()}


MODULE_FILES = {
    # "norm" is a prefix of "norm_extra": each entry must take its own directory only.
    f"{JIT_CACHE_PREFIX}norm/norm.so": b"\x7fELF norm",
    f"{JIT_CACHE_PREFIX}norm_extra/norm_extra.so": b"\x7fELF norm_extra",
}


@pytest.fixture
def stored(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """A build of norm and norm_extra, cut into the module cache."""
    built = zip_wheel(tmp_path / "built.whl", {**PACKAGE, **MODULE_FILES})
    keys = {name: module_cache.key("inputs", module(name)) for name in ("norm", "norm_extra")}
    build = KernelBuild(
        wheel=built,
        modules={"norm": "recipe", "norm_extra": "recipe"},
        compile_commands=[command("norm"), command("norm_extra")],
        compile_seconds={"norm": 1.0, "norm_extra": 2.0},
    )
    module_cache.store(tmp_path / "modules", build, keys)
    return tmp_path / "modules", built, keys


def test_the_key_follows_the_shared_inputs_and_every_field_of_the_module() -> None:
    base = module_cache.key("inputs", module("norm"))
    assert base == module_cache.key("inputs", module("norm"))
    assert module_cache.key("other inputs", module("norm")) != base
    changes = {
        "name": "rope",
        "recipe": "rope",
        "cuda_sources": ["/tmp/src/other.cu"],
        "cxx_sources": ["/tmp/src/binding.cpp"],
        "cuda_flags": ["-O2", "-gencode=arch=compute_120f,code=sm_120f"],
        "cxx_flags": ["-O2"],
        "link_flags": ["-shared", "-lcublas"],
        "device_link": True,
    }
    assert sorted(changes) == sorted(f.name for f in dataclasses.fields(Module))
    for field, value in changes.items():
        assert module_cache.key("inputs", module("norm", **{field: value})) != base, field


def test_stored_modules_come_back_with_their_own_files_and_commands(stored: Any) -> None:
    directory, _, keys = stored
    found = module_cache.lookup(directory, keys)
    assert sorted(found) == ["norm", "norm_extra"]
    assert found["norm"] == module_cache.CachedModule(
        "norm", "recipe", [command("norm")], directory / keys["norm"] / module_cache.ARCHIVE
    )
    # The entry's record, for the provenance and for whoever reads the cache: sorted keys,
    # so the same module gives the same bytes.
    assert (directory / keys["norm"] / module_cache.RECORD).read_text() == json.dumps(
        {"compile_commands": [command("norm")], "name": "norm", "recipe": "recipe"}
    )
    with zipfile.ZipFile(found["norm"].archive) as archive:
        assert archive.namelist() == [f"{JIT_CACHE_PREFIX}norm/norm.so"]


def test_a_package_wheel_plus_cached_modules_holds_what_the_build_did(
    stored: Any, tmp_path: Path
) -> None:
    directory, built, keys = stored
    package_only = zip_wheel(tmp_path / "package.whl", PACKAGE)
    found = module_cache.lookup(directory, keys)
    whole = module_cache.add_to_wheel(package_only, list(found.values()), tmp_path / "whole.whl")
    assert contents(whole) == contents(built)  # names, bytes and the executable mode


def test_a_module_never_built_is_not_found(stored: Any) -> None:
    directory, _, _ = stored
    assert (
        module_cache.lookup(directory, {"rope": module_cache.key("inputs", module("rope"))}) == {}
    )


def test_a_damaged_entry_is_discarded_and_said(
    stored: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    directory, _, keys = stored
    archive = directory / keys["norm"] / module_cache.ARCHIVE
    archive.write_bytes(archive.read_bytes() + b"damage")
    found = module_cache.lookup(directory, keys)
    assert sorted(found) == ["norm_extra"]
    assert not (directory / keys["norm"]).exists()
    assert "module norm" in capfd.readouterr().err
