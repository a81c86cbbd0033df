"""Integration: sglang's own JIT kernels (RoPE, the KV-cache store, QK-norm) built ahead of
time into the jit-cache wheel, and loaded on a node by the patched sglang (patch 0003) with
no nvcc and nothing compiled.

Slow: one build of three small kernels (about 30 s of nvcc on 2 cores) and a fresh virtual
environment with CPU torch and the wheels.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from .conftest import REPO, build_wheels, fresh_root
from .test_build_e2e import elf_archs, extracted, make_node, node_check, wheel_of

pytestmark = pytest.mark.slow

KERNELS = {
    "sglang_rope": "sgl_kernel_jit_apply_rope_pos_ids_cos_sin_cache",
    "sglang_kvcache_2048": "sgl_kernel_jit_kvcache_2048_true",
    "sglang_qknorm_128_bf16": "sgl_kernel_jit_qknorm_128_true_bf16_t",
}


@pytest.fixture(scope="module")
def built(module_tmp: Callable[[str], Path]) -> Path:
    root = fresh_root(module_tmp("sglang-kernels"))
    build_wheels(root, *(f"--module={recipe}" for recipe in KERNELS))
    return root


@pytest.fixture(scope="module")
def node(built: Path, module_tmp: Callable[[str], Path]) -> Path:
    venv = make_node(built / "wheelhouse", module_tmp("sglang-node") / "venv")
    (sglang,) = (built / "wheelhouse").glob("sglang-*.whl")
    subprocess.run(
        [str(venv / "bin/python"), "-m", "pip", "install", "--quiet", "--no-deps", str(sglang)],
        check=True,
    )
    return venv


def test_the_kernels_are_built_as_load_jit_would_build_them(built: Path, tmp_path: Path) -> None:
    """One module per instantiation, named as load_jit names it, with the plain sm_120
    machine code load_jit asks for on a 12.0 GPU (TVM_FFI_CUDA_ARCH_LIST=12.0), and no
    libcudart or libtvm_ffi to find on the node."""
    modules = extracted(wheel_of(built, "flashinfer_jit_cache"), tmp_path)
    assert sorted(modules) == sorted(KERNELS.values())
    for shared_object in modules.values():
        assert elf_archs(shared_object) == ["sm_120"]
        needed = subprocess.run(
            ["readelf", "-d", str(shared_object)], capture_output=True, text=True, check=True
        ).stdout
        assert "libcudart" not in needed and "libtvm_ffi" not in needed


def test_the_node_loads_sglangs_kernels_without_nvcc(node: Path, tmp_path: Path) -> None:
    status, output, report = node_check(node, tmp_path, "--arch", "12.0")
    assert status == 0, output
    assert sorted(m["module"] for m in report["modules"]) == sorted(KERNELS)
    assert all(m["loaded"] for m in report["modules"])
    assert report["jit_compiles"] == 0


def test_a_kernel_the_wheel_lacks_fails_the_check_by_name(node: Path, tmp_path: Path) -> None:
    """The sglang-jit profile also names the 1024-byte KV store, which this wheel lacks:
    with SGLANG_DISABLE_JIT=1 the patched load_jit refuses to compile it, and says which."""
    status, output, report = node_check(
        node, tmp_path, "--arch", "12.0", "--profile", "sglang-jit", cwd=REPO
    )
    assert status == 1
    assert "sgl_kernel_jit_kvcache_1024_true (arguments: kvcache, 1024, true)" in output
    assert "3 of 4 modules" in output
    assert report["jit_compiles"] == 1
