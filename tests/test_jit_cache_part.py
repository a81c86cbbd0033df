"""The compile stage's own bookkeeping, in process: what keys a part's cache entry and each
module's, what a part records, a part found in the cache, and the jit-cache wheel assembled
from parts (with real shared objects, auditwheel and the glibc baseline)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from sm120_build import jit_cache
from sm120_build import pins as pins_module
from sm120_build.cache import sha256_of, store_wheel
from sm120_build.errors import UserError
from sm120_build.jit_cache import (
    KernelRequest,
    Part,
    PartKeys,
    ShardSpec,
    assemble,
    check_paths,
    compile_part,
    part_keys,
    part_record,
    version,
)
from sm120_build.jit_cache.arch import Arch
from sm120_build.jit_cache.cmake import KernelBuild
from sm120_build.jit_cache.module_cache import CachedModule
from sm120_build.jit_cache.shards import Costs, load_costs
from sm120_build.layout import PROVENANCE_FILE, Layout
from sm120_build.toolkit import Toolkit
from sm120_build.vendor.state import VendorState, write_state

from .conftest import fresh_root, refusal, zip_wheel

CUDA = Toolkit(Path("/opt/cuda"), (13, 0), "13.0.88", frozenset({"sm_120"}))
REQUEST = KernelRequest(
    recipes={"norm": "gen_norm_module()", "rope": "gen_rope_module()"},
    archs=[Arch.parse("12.0f"), Arch.parse("12.0f")],  # asked twice, counted once
)
INPUTS = "a" * 64
HALF = ShardSpec(1, 2)
NO_COSTS = Costs({}, {})


def vendored(layout: Layout, inputs: str = INPUTS) -> None:
    """A complete vendor tree of FlashInfer as far as the compile stage reads it: its state."""
    git = layout.vendor / "flashinfer" / ".git"
    git.mkdir(parents=True, exist_ok=True)
    write_state(git.parent, VendorState(inputs, "base", "head", complete=True, exact=True))


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    root = fresh_root(tmp_path)
    result = Layout(root=root, cache=root / ".cache")
    vendored(result)
    return result


@pytest.fixture
def pins(layout: Layout) -> pins_module.Pins:
    return pins_module.load(layout.pins_file)


def test_the_version_names_the_upstream_toolkit_archs_once_and_the_series(
    layout: Layout, pins: pins_module.Pins
) -> None:
    request = dataclasses.replace(REQUEST, archs=[Arch.parse("12.1a"), Arch.parse("12.0f")])
    upstream = pins.upstream("flashinfer").version
    assert version(layout, pins, request, CUDA) == f"{upstream}+cu130.sm120f.sm121a.p{INPUTS[:8]}"


KeysOf = Callable[..., PartKeys]


@pytest.fixture
def keys_of(layout: Layout, pins: pins_module.Pins) -> KeysOf:
    def keys(
        request: KernelRequest = REQUEST,
        cuda: Toolkit = CUDA,
        source: str = "pip:nvidia-cuda-nvcc",
        shard: ShardSpec = HALF,
        costs: Costs = NO_COSTS,
        build_pins: pins_module.Pins = pins,
        sglang_inputs: str = "",
    ) -> PartKeys:
        jit_version = version(layout, build_pins, request, cuda)
        return part_keys(
            layout, build_pins, request, cuda, source, shard, costs, jit_version, sglang_inputs
        )

    return keys


def changed(before: PartKeys, after: PartKeys) -> set[str]:
    return {
        f.name
        for f in dataclasses.fields(PartKeys)
        if getattr(before, f.name) != getattr(after, f.name)
    }


def test_part_keys_are_stable_and_distinct(keys_of: KeysOf) -> None:
    keys = keys_of()
    assert keys == keys_of()
    assert len({keys.inputs, keys.build, keys.entry}) == 3
    assert all(len(key) == 64 for key in (keys.inputs, keys.build, keys.entry))


def test_what_shapes_every_module_changes_every_key(
    keys_of: KeysOf, layout: Layout, pins: pins_module.Pins
) -> None:
    before = keys_of()
    everything = {"inputs", "build", "entry"}
    assert changed(before, keys_of(source="/usr/local/cuda")) == everything
    assert changed(before, keys_of(cuda=dataclasses.replace(CUDA, full_version="13.0.89"))) == (
        everything
    )
    # The toolkit's label (and so the version) alone, its full version the same.
    assert changed(before, keys_of(cuda=dataclasses.replace(CUDA, version=(12, 9)))) == everything
    other_archs = dataclasses.replace(REQUEST, archs=[Arch.parse("12.0a")])
    assert changed(before, keys_of(request=other_archs)) == everything
    more_requirements = dataclasses.replace(
        pins, build_requirements=[*pins.build_requirements, "extra==1"]
    )
    assert changed(before, keys_of(build_pins=more_requirements)) == everything
    vendored(layout, "b" * 64)
    assert changed(before, keys_of()) == everything
    vendored(layout, INPUTS[:8] + "b" * 56)  # the same series label, so the same version
    assert changed(before, keys_of()) == everything
    vendored(layout)
    for name in ("CMakeLists.txt", "pyproject.toml"):
        file = layout.kernel_project / name
        original = file.read_text()
        file.write_text(original + "\n# changed\n")
        assert changed(before, keys_of()) == everything, name
        file.write_text(original)
    assert keys_of() == before


def test_what_shapes_only_the_part_changes_its_build_and_entry_keys(
    keys_of: KeysOf, layout: Layout
) -> None:
    before = keys_of()
    part_only = {"build", "entry"}
    assert changed(before, keys_of(shard=ShardSpec(1, 3))) == part_only
    assert changed(before, keys_of(costs=Costs({"norm": 10.0}, {}))) == part_only
    assert changed(before, keys_of(costs=Costs({}, {"norm": 1.5}))) == part_only
    # The patched sglang's inputs, where its kernels are asked for: its own modules are keyed
    # by them one by one, FlashInfer's are not.
    assert changed(before, keys_of(sglang_inputs="c" * 64)) == part_only
    reordered = dataclasses.replace(REQUEST, recipes=dict(reversed(REQUEST.recipes.items())))
    assert keys_of(request=reordered) == before
    fewer = dataclasses.replace(REQUEST, recipes={"norm": "gen_norm_module()"})
    assert changed(before, keys_of(request=fewer)) == part_only
    package = layout.kernel_project / "flashinfer_jit_cache" / "__init__.py"
    original = package.read_text()
    package.write_text(original + "# changed\n")
    assert changed(before, keys_of()) == part_only
    package.write_text(original)
    # Written by every build, or by Python: neither is an input.
    (layout.kernel_project / "flashinfer_jit_cache" / "_build_meta.py").write_text("v = 1\n")
    cache = layout.kernel_project / "flashinfer_jit_cache" / "__pycache__"
    cache.mkdir()
    (cache / "x.pyc").write_bytes(b"\0")
    assert keys_of() == before


def test_each_shard_has_its_own_entry_of_one_build(keys_of: KeysOf) -> None:
    first, second = keys_of(shard=ShardSpec(1, 2)), keys_of(shard=ShardSpec(2, 2))
    assert changed(first, second) == {"entry"}


def test_the_host_compiler_keys_every_module(
    keys_of: KeysOf, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = keys_of()
    compiler = tmp_path / "other-c++"
    compiler.write_text("#!/bin/sh\necho 'other c++ 1.0'\n")
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", str(compiler))
    assert changed(before, keys_of()) == {"inputs", "build", "entry"}


def test_the_python_whose_headers_modules_include_keys_every_module(
    keys_of: KeysOf, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = keys_of()
    monkeypatch.setattr("platform.python_version", lambda: "3.99.0")
    assert changed(before, keys_of()) == {"inputs", "build", "entry"}


def test_the_code_that_shapes_modules_keys_them_and_the_code_that_splits_keys_parts(
    keys_of: KeysOf, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy of this package stands for it, changed one file at a time."""
    here = Path(jit_cache.__file__).parent
    copy = tmp_path / "sm120_build"
    shutil.copytree(here.parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(jit_cache, "_HERE", copy / "jit_cache")
    before = keys_of()
    for name, keys in [
        ("jit_cache/render.py", {"inputs", "build", "entry"}),
        ("jit_cache/sccache.py", {"inputs", "build", "entry"}),
        ("toolkit.py", {"inputs", "build", "entry"}),
        ("hosts.py", {"inputs", "build", "entry"}),
        ("jit_cache/shards.py", {"build", "entry"}),
        ("jit_cache/__init__.py", {"build", "entry"}),
    ]:
        file = copy / name
        original = file.read_text()
        file.write_text(original + "# changed\n")
        assert changed(before, keys_of()) == keys, name
        file.write_text(original)
    assert keys_of() == before


@pytest.mark.skipif(
    shutil.which("aarch64-linux-gnu-g++") is None or os.uname().machine != "x86_64",
    reason="needs the aarch64 cross compiler on an x86_64 machine",
)
def test_the_host_cpu_keys_every_module(keys_of: KeysOf) -> None:
    """An aarch64 build's modules are other bytes than the x86_64 build's of the same flags:
    its host and cross compilers key every module, so neither takes the other's."""
    aarch64 = dataclasses.replace(REQUEST, platform="aarch64")
    assert changed(keys_of(), keys_of(request=aarch64)) == {"inputs", "build", "entry"}


def test_a_part_records_its_keys_share_and_every_module_built_or_taken(tmp_path: Path) -> None:
    keys = PartKeys("i" * 64, "b" * 64, "e" * 64)
    built = KernelBuild(
        wheel=tmp_path / "w.whl",
        modules={"rope": "gen_rope_module()"},
        compile_commands=[["nvcc", "-c", "rope.cu"]],
        compile_seconds={"rope": 3.0},
    )
    cached = {
        "norm": CachedModule("norm", "gen_norm_module()", [["nvcc", "-c", "norm.cu"]], tmp_path),
        "act": CachedModule("act", "gen_act_module()", [["c++", "-c", "act.cc"]], tmp_path),
    }
    request = dataclasses.replace(REQUEST, archs=[Arch.parse("12.1a"), Arch.parse("12.0f")])
    toolkit_record = {"cuda": "13.0.88", "source": "pip"}
    record = part_record(
        keys, ShardSpec(2, 3), [["a"], ["rope", "norm", "act"], ["b"]], request, "1.0+x",
        toolkit_record, built, cached,
    )  # fmt: skip
    assert record == {
        "key": "b" * 64,
        "index": 2,
        "count": 3,
        "plan": [["a"], ["rope", "norm", "act"], ["b"]],
        "version": "1.0+x",
        "toolkit": {"cuda": "13.0.88", "source": "pip"},
        "host": "x86_64",
        "archs": ["12.0f", "12.1a"],
        "recipes": REQUEST.recipes,
        "modules": {
            "rope": "gen_rope_module()",
            "norm": "gen_norm_module()",
            "act": "gen_act_module()",
        },
        "compile_commands": [
            ["nvcc", "-c", "rope.cu"],
            ["nvcc", "-c", "norm.cu"],
            ["c++", "-c", "act.cc"],
        ],
    }
    json.dumps(record)  # the part's record.json


def package_files(version_: str) -> dict[str, bytes]:
    dist_info = f"flashinfer_jit_cache-{version_}.dist-info"
    return {
        "flashinfer_jit_cache/__init__.py": b"",
        f"{dist_info}/METADATA": (
            f"Metadata-Version: 2.1\nName: flashinfer-jit-cache\nVersion: {version_}\n".encode()
        ),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nTag: py3-none-linux_x86_64\n",
    }


def test_a_part_in_the_cache_is_taken_without_rendering_or_compiling(
    layout: Layout, pins: pins_module.Pins, keys_of: KeysOf, tmp_path: Path
) -> None:
    """Nothing here could render or compile (no FlashInfer sources, no toolkit at /opt/cuda):
    the part comes from its entry, and only from the entry of its own keys."""
    shard = ShardSpec(2, 2)
    keys = keys_of(shard=shard, costs=load_costs(layout.costs_file))
    jit_version = version(layout, pins, REQUEST, CUDA)
    wheel = zip_wheel(
        tmp_path / f"flashinfer_jit_cache-{jit_version}-py3-none-linux_x86_64.whl",
        package_files(jit_version),
    )
    record = {"key": keys.build, "index": 2, "count": 2}
    entry = layout.cache / "artifacts" / "jit-cache" / keys.entry
    stored = store_wheel(wheel, entry, {"record.json": json.dumps(record)})
    part = compile_part(layout, pins, REQUEST, CUDA, "pip:nvidia-cuda-nvcc", shard)
    assert part == Part(stored, record)
    # One shard's entry is not another's: shard 1 has none, and sets out to render.
    with pytest.raises(UserError):
        compile_part(layout, pins, REQUEST, CUDA, "pip:nvidia-cuda-nvcc", ShardSpec(1, 2))


def shared_object(directory: Path, source: str) -> bytes:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "m.c").write_text(source)
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O1", "-o", str(directory / "m.so"), str(directory / "m.c")],
        check=True,
    )
    return (directory / "m.so").read_bytes()


PLAIN = "int answer(void) { return 42; }\n"
# pthread_create moved into libc in glibc 2.34 (pthread_create@GLIBC_2.34): built on this
# machine it needs 2.34, above a 2.28 baseline.
NEWER = (
    "#include <pthread.h>\nstatic void *run(void *a) { return a; }\n"
    "int start(void) { pthread_t t; return pthread_create(&t, 0, run, 0); }\n"
)


def part_of(
    directory: Path, jit_version: str, modules: dict[str, str], source: str = PLAIN
) -> Part:
    files = package_files(jit_version)
    for name in modules:
        files[f"flashinfer_jit_cache/jit_cache/{name}/{name}.so"] = shared_object(
            directory / name, source
        )
    wheel = zip_wheel(
        directory / f"flashinfer_jit_cache-{jit_version}-py3-none-linux_x86_64.whl", files
    )
    record = {
        "toolkit": {"cuda": "13.0.88", "source": "pip"},
        "host": "x86_64",
        "archs": ["12.0f"],
        "recipes": REQUEST.recipes,
        "modules": modules,
        "compile_commands": [[f"nvcc -c {name}.cu"] for name in modules][::-1],
    }
    return Part(wheel, record)


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the parts are tagged x86_64")
def test_the_wheel_assembled_from_parts_holds_every_module_and_its_provenance(
    layout: Layout, pins: pins_module.Pins, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jit_version = version(layout, pins, REQUEST, CUDA)
    parts = [
        part_of(tmp_path / "one", jit_version, {"norm": "gen_norm_module()"}),
        part_of(tmp_path / "two", jit_version, {"rope": "gen_rope_module()"}),
    ]
    out = tmp_path / "out"
    out.mkdir()
    wheel = assemble(layout, pins, parts, None, out)
    assert wheel.parent == out
    assert "platform tag manylinux_2_5_x86_64" in capsys.readouterr().err
    # The contents' label, and the tag auditwheel gives a .so that needs nothing newer.
    expected = rf"flashinfer_jit_cache-{re.escape(jit_version)}\.c[0-9a-f]{{8}}"
    expected += r"-py3-none-manylinux_2_5_x86_64\.whl"
    assert re.fullmatch(expected, wheel.name), wheel.name
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (provenance_name,) = [n for n in names if n.endswith(f".dist-info/{PROVENANCE_FILE}")]
        provenance = json.loads(archive.read(provenance_name))
    assert {
        "flashinfer_jit_cache/jit_cache/norm/norm.so",
        "flashinfer_jit_cache/jit_cache/rope/rope.so",
    } <= set(names)
    upstream = pins.upstream("flashinfer")
    assert provenance["upstream"]["version"] == upstream.version
    assert [p["file"] for p in provenance["patches"]] == [
        f"patches/flashinfer/{line}"
        for line in (layout.patches / "flashinfer" / "series").read_text().split()
    ]
    assert provenance["toolkit"] == {"cuda": "13.0.88", "source": "pip"}
    assert provenance["archs"] == ["12.0f"] and provenance["host"] == "x86_64"
    assert provenance["recipes"] == REQUEST.recipes
    assert provenance["modules"] == {"norm": "gen_norm_module()", "rope": "gen_rope_module()"}
    assert provenance["compile_commands"] == [["nvcc -c norm.cu"], ["nvcc -c rope.cu"]]
    assert "served" in provenance["profiles"] and "base_jit_cache" not in provenance
    # What each derived profile still compiles on the node, for the node check.
    compiled = provenance["compiled_on_node"]
    assert "served" not in compiled and compiled["llama-3.1-8b-instruct"][0]["name"].startswith(
        "triton "
    )


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the parts are tagged x86_64")
def test_an_assembled_wheel_above_the_glibc_baseline_is_refused_and_nothing_is_written(
    layout: Layout, pins: pins_module.Pins, tmp_path: Path
) -> None:
    jit_version = version(layout, pins, REQUEST, CUDA)
    parts = [part_of(tmp_path / "one", jit_version, {"norm": "gen_norm_module()"}, NEWER)]
    out = tmp_path / "out"
    out.mkdir()
    message = refusal(assemble, layout, pins, parts, None, out, "2.28")
    assert "2.28" in message and "pthread_create" in message
    assert list(out.iterdir()) == []
    assert assemble(layout, pins, parts, None, out, "2.34").parent == out  # at the baseline


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the parts are tagged x86_64")
def test_a_base_jit_cache_gives_the_modules_no_part_built_and_is_recorded(
    layout: Layout, pins: pins_module.Pins, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jit_version = version(layout, pins, REQUEST, CUDA)
    ours = part_of(tmp_path / "ours", jit_version, {"norm": "gen_norm_module()"})
    base = part_of(
        tmp_path / "base",
        f"{pins.upstream('flashinfer').version}+cu130.upstream",
        {"norm": "x", "act": "y"},
        "int base(void) { return 7; }\n",
    ).wheel
    out = tmp_path / "out"
    out.mkdir()
    wheel = assemble(layout, pins, [ours], str(base), out)
    said = capsys.readouterr().err
    assert f"kept 1 module(s) of {base.name}; ours replace the rest" in said
    with zipfile.ZipFile(wheel) as archive, zipfile.ZipFile(ours.wheel) as built:
        (provenance_name,) = [n for n in archive.namelist() if n.endswith(PROVENANCE_FILE)]
        provenance = json.loads(archive.read(provenance_name))
        norm = "flashinfer_jit_cache/jit_cache/norm/norm.so"
        assert archive.read(norm) == built.read(norm)  # ours, not the base's
        assert "flashinfer_jit_cache/jit_cache/act/act.so" in archive.namelist()
    assert provenance["base_jit_cache"] == {
        "wheel": base.name,
        "sha256": sha256_of(base),
        "modules": ["act"],
    }
    assert provenance["modules"] == {"norm": "gen_norm_module()"}  # what we built


def test_the_paths_nvcc_would_see_are_checked_before_anything_runs(tmp_path: Path) -> None:
    fine = Layout(root=tmp_path, cache=tmp_path / "cache")
    check_paths(fine, REQUEST)
    check_paths(fine, dataclasses.replace(REQUEST, cuda_home=tmp_path / "cuda"))
    spaced = Layout(root=tmp_path, cache=tmp_path / "a cache")
    assert refusal(check_paths, spaced, REQUEST).startswith(
        f"the cache (SM120_CACHE_DIR) is '{tmp_path}/a cache', and the CUDA toolchain"
    )
    home = dataclasses.replace(REQUEST, cuda_home=tmp_path / "cuda;12")
    assert refusal(check_paths, fine, home) == (
        f"--cuda-home is '{tmp_path}/cuda;12', and the CUDA toolchain cannot take a path with "
        "whitespace, ';', quotes, '$' or '\\' in it (nvcc splits its options there). Use a "
        "path without them: for the cache, set SM120_CACHE_DIR; for the checkout (nox keeps "
        "its environments in .nox/ there), clone it elsewhere."
    )


def test_a_python_environment_nvcc_cannot_take_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernels compile against this environment's tvm-ffi headers: a venv under a path
    with a space reaches nvcc's include options."""
    monkeypatch.setattr(sys, "prefix", f"{tmp_path}/my env")
    fine = Layout(root=tmp_path, cache=tmp_path / "cache")
    assert refusal(check_paths, fine, REQUEST).startswith(
        f"this Python environment (its tvm-ffi headers are compiled against) is "
        f"'{tmp_path}/my env', and the CUDA toolchain cannot take"
    )
