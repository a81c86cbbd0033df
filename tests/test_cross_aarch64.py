"""The default configuration cross-built for aarch64 hosts on this x86_64 machine
(`build_wheels -- --platform aarch64`, docs/aarch64.md), beside the x86_64 build of the same
checkout: AArch64 shared objects with sm_120f SASS, compiled with the x86_64 build's flags but
the host compiler, tagged manylinux aarch64 by auditwheel, loaded by an aarch64 Python under
qemu-user, and read (not loaded) by the node check on this x86_64 machine."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sm120_build import hosts

from . import aarch64_python
from .conftest import build_wheels
from .test_build_e2e import cuda_tool, elf_archs

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.uname().machine != "x86_64", reason="cross-builds from x86_64"),
    pytest.mark.skipif(
        shutil.which("aarch64-linux-gnu-g++") is None,
        reason="needs the aarch64 cross compiler (Debian: g++-aarch64-linux-gnu)",
    ),
]


def jit_cache_wheel(wheelhouse: Path) -> Path:
    (found,) = wheelhouse.glob("flashinfer_jit_cache-*.whl")
    return found


def provenance(wheel: Path) -> dict[str, Any]:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/sm120-build.json")]
        found: dict[str, Any] = json.loads(archive.read(name))
        return found


@pytest.fixture(scope="module")
def aarch64(built_project: Path) -> Path:
    """The x86_64 build's checkout built again for aarch64 hosts (its toolkit, sdists and
    vendor trees shared): its wheelhouse-aarch64/."""
    result = build_wheels(built_project, "--platform", "aarch64")
    assert "wheelhouse-aarch64/" in result.stderr
    return built_project / "wheelhouse-aarch64"


@pytest.fixture(scope="module")
def shared_objects(aarch64: Path, module_tmp: Callable[[str], Path]) -> list[Path]:
    target = module_tmp("aarch64-so")
    with zipfile.ZipFile(jit_cache_wheel(aarch64)) as archive:
        names = [name for name in archive.namelist() if name.endswith(".so")]
        return [Path(archive.extract(name, target)) for name in names]


def test_the_wheelhouse_holds_the_aarch64_jit_cache_and_the_shared_wheels(
    aarch64: Path, built_project: Path
) -> None:
    wheel = jit_cache_wheel(aarch64)
    assert re.search(r"-py3-none-manylinux_2_\d+_aarch64\.whl$", wheel.name), wheel.name
    record = provenance(wheel)
    assert record["host"] == "aarch64" and record["archs"] == ["12.0f"]
    assert "aarch64 cudart: nvidia_cuda_runtime-13.0.96-" in record["toolkit"]["source"]
    # The pure-Python wheels are the x86_64 build's, byte for byte.
    x86_64 = built_project / "wheelhouse"
    for pure in ("flashinfer_python-*.whl", "sglang-*.whl", "flashinfer_cubin-*.whl"):
        (ours,) = aarch64.glob(pure)
        assert ours.read_bytes() == (x86_64 / ours.name).read_bytes()
    assert provenance(jit_cache_wheel(x86_64))["host"] == "x86_64"


def test_every_shared_object_is_aarch64_code_with_sm_120f_sass(
    shared_objects: list[Path],
) -> None:
    assert shared_objects
    for shared_object in shared_objects:
        header = subprocess.run(
            ["readelf", "-h", str(shared_object)], capture_output=True, text=True, check=True
        ).stdout
        assert re.search(r"Machine:\s+AArch64$", header, flags=re.MULTILINE), header
        assert hosts.elf_machine(shared_object) == hosts.HOSTS["aarch64"].elf_machine
        assert elf_archs(shared_object) == ["sm_120f"] * 3


def test_the_compile_flags_are_the_x86_64_build_s_but_for_the_host_compiler(
    aarch64: Path, built_project: Path
) -> None:
    """Per translation unit: the same words but the compiler itself (argv[0]: the cross g++
    for C++ units) and nvcc's -ccbin (the cross g++ for the host side of CUDA units)."""

    def host_neutral(commands: list[list[str]]) -> list[list[str]]:
        return [[w for w in command[1:] if not w.startswith("-ccbin")] for command in commands]

    cross = provenance(jit_cache_wheel(aarch64))["compile_commands"]
    native = provenance(jit_cache_wheel(built_project / "wheelhouse"))["compile_commands"]
    assert len(cross) == len(native) == 3
    assert host_neutral(cross) == host_neutral(native)
    ccbin = {w for command in cross for w in command if w.startswith("-ccbin")}
    assert ccbin and all(w.endswith("aarch64-linux-gnu-g++") for w in ccbin), ccbin
    assert not any(w.startswith("-ccbin") for command in native for w in command)


def cubins(shared_object: Path, target: Path) -> dict[str, str]:
    """sha256 of each device image (cubin) a .so holds, by its name."""
    target.mkdir(parents=True)
    subprocess.run(
        [cuda_tool("cuobjdump"), "--extract-elf", "all", str(shared_object)],
        cwd=target,
        capture_output=True,
        check=True,
    )
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in target.iterdir()}


def test_the_device_code_is_the_x86_64_build_s_byte_for_byte(
    shared_objects: list[Path], built_project: Path, module_tmp: Callable[[str], Path]
) -> None:
    """Only the host code differs: what verify_gpu proves of the x86_64 build's device code
    holds for the aarch64 build's."""
    scratch = module_tmp("cubins")
    with zipfile.ZipFile(jit_cache_wheel(built_project / "wheelhouse")) as archive:
        names = [name for name in archive.namelist() if name.endswith(".so")]
        native = {
            Path(name).name: Path(archive.extract(name, scratch / "x86_64")) for name in names
        }
    assert sorted(native) == sorted(p.name for p in shared_objects)
    for shared_object in shared_objects:
        cross = cubins(shared_object, scratch / "cubins-aarch64" / shared_object.stem)
        same = cubins(native[shared_object.name], scratch / "cubins-x86_64" / shared_object.stem)
        assert len(cross) == 3 and cross == same


def tvm_ffi_library(cache: Path, target: Path) -> Path:
    """libtvm_ffi.so from the aarch64 apache-tvm-ffi wheel the cross-build fetched."""
    (wheel,) = cache.glob("wheels/*/apache_tvm_ffi-*_aarch64*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return Path(archive.extract("tvm_ffi/lib/libtvm_ffi.so", target))


@pytest.mark.skipif(aarch64_python.missing() is not None, reason=str(aarch64_python.missing()))
def test_the_modules_load_in_an_aarch64_python_under_qemu(
    shared_objects: list[Path], built_project: Path, module_tmp: Callable[[str], Path]
) -> None:
    """dlopen only (no GPU): every symbol they bind resolves against the aarch64 glibc and
    libstdc++, and tvm-ffi's aarch64 library, as `import tvm_ffi` loads it on the node."""
    scratch = module_tmp("qemu")
    python = aarch64_python.aarch64_python(scratch / "sysroot")
    library = tvm_ffi_library(built_project / ".cache", scratch)
    script = (
        "import ctypes, platform, sys\n"
        "print(platform.machine())\n"
        "ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)\n"
        "for path in sys.argv[2:]:\n"
        "    ctypes.CDLL(path)\n"
        "    print('loaded', path)\n"
    )
    result = subprocess.run(
        [*python, "-c", script, str(library), *map(str, shared_objects)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "aarch64"
    assert result.stdout.count("loaded ") == len(shared_objects)
    # The load resolves what each module binds: without tvm-ffi's library it fails.
    alone = subprocess.run(
        [*python, "-c", script, "libc.so.6", str(shared_objects[0])],
        capture_output=True,
        text=True,
    )
    assert alone.returncode != 0 and "undefined symbol: TVMFFI" in alone.stderr


def test_the_node_check_reads_the_archs_and_says_why_it_loads_nothing_here(
    aarch64: Path, module_tmp: Callable[[str], Path]
) -> None:
    """`sm120-node-check --arch 12.1` on this x86_64 machine, over the aarch64 wheels installed
    for an aarch64 target (uv's --python-platform): the archs and the host CPU of the shared
    objects, and no load."""
    venv = module_tmp("aarch64-node") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    wheels = [*aarch64.glob("flashinfer_*.whl"), *aarch64.glob("sm120_build-*.whl")]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "uv",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--python",
            str(venv / "bin" / "python"),
            "--python-platform",
            "aarch64-manylinux_2_34",
            *map(str, wheels),
            "packaging",  # the node tools' one requirement
        ],
        check=True,
    )
    result = subprocess.run(
        [str(venv / "bin" / "sm120-node-check"), "--arch", "12.1"],
        env={"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(venv)},
        capture_output=True,
        text=True,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert re.search(
        r"node_check: sm_121 \(--arch\); .* \(12\.0f; 1 aarch64 shared objects\)", output
    )
    assert (
        "NOT CHECKED the 1 recipes' modules were not loaded: the jit-cache's shared objects "
        f"are aarch64 code and this machine is {os.uname().machine}, which cannot load them"
    ) in output
    assert "FAIL" not in output  # 12.0f runs on sm_121: the family


def test_the_node_lock_resolves_sglang_s_closure_for_aarch64_from_wheels_alone(
    aarch64: Path, built_project: Path
) -> None:
    """sglang 0.5.9 pins torch-memory-saver 0.0.9, which has no aarch64 wheel: the lock
    names it, and never builds its sdist."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sm120_build",
            "lock-node",
            "--platform",
            "aarch64-manylinux_2_34",
        ],
        cwd=built_project,
        env=dict(os.environ, SM120_CACHE_DIR=str(built_project / ".cache")),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1, result.stderr
    assert "for CPython 3.12, aarch64-manylinux_2_34" in result.stderr
    assert "torch-memory-saver==0.0.9 has no usable wheels" in result.stderr
    assert not (aarch64 / "node-lock.txt").exists()
