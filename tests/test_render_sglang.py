"""The render of sglang's own kernels (jit_cache/jit_specs.py) asks sglang's loader what it
would compile, with the real tvm-ffi writing the build.ninja it parses. The sglang here is a
small generated tree whose loader looks for a prebuilt module first, as patch 0003's does:
a flashinfer-jit-cache installed where the build runs must not answer that lookup."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO

UTILS = """
import tvm_ffi.cpp

def is_arch_support_pdl():
    return True

def load_jit(*args):
    name = "sgl_kernel_jit_" + "_".join(str(arg) for arg in args)
    try:  # patch 0003: a module built ahead of time into flashinfer-jit-cache comes first
        from flashinfer_jit_cache import get_jit_cache_dir
    except ImportError:
        pass
    else:
        return get_jit_cache_dir()
    return tvm_ffi.cpp.load_inline(name, cuda_sources="__global__ void kernel() {}")
"""
PROBE = """
from sglang.jit_kernel.utils import load_jit

def module(size):
    return load_jit("probe", size)

def cached():
    return "a module the loader kept from before"
"""


def render(tmp_path: Path, recipes: dict[str, str]) -> subprocess.CompletedProcess[str]:
    sglang, installed = tmp_path / "sglang-tree", tmp_path / "site"
    for path, text in {
        sglang / "sglang/jit_kernel/utils.py": UTILS,
        sglang / "sglang/jit_kernel/probe.py": PROBE,
        # A jit-cache installed in the build's Python, holding the kernel already.
        installed / "flashinfer_jit_cache/__init__.py": "def get_jit_cache_dir(): return '/x'\n",
    }.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": os.pathsep.join([str(sglang), str(installed), str(REPO / "src")]),
        "TVM_FFI_CUDA_ARCH_LIST": "9.0",
        "TVM_FFI_CACHE_DIR": str(tmp_path / "tvm-ffi"),
        "TVM_FFI_GPU_BACKEND": "cuda",
        "CUDA_HOME": str(tmp_path / "no-cuda"),
    }
    return subprocess.run(
        [sys.executable, "-m", "sm120_build.jit_cache.jit_specs"],
        input=json.dumps({"recipes": recipes}),
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )


def test_an_installed_jit_cache_does_not_hide_sglangs_kernels(tmp_path: Path) -> None:
    pytest.importorskip("tvm_ffi", reason="apache-tvm-ffi renders sglang's kernels")
    result = render(tmp_path, {"sglang_probe": "sglang.jit_kernel.probe:module(2048)"})
    assert result.returncode == 0, result.stderr
    (module,) = json.loads(result.stdout)
    assert module["name"] == "sgl_kernel_jit_probe_2048"
    assert module["recipe"] == "sglang_probe"
    (source,) = module["cuda_sources"]
    assert source.endswith(".cu") and "-gencode=arch=compute_90,code=sm_90" in " ".join(
        module["cuda_flags"]
    )


def test_a_recipe_whose_loader_compiles_nothing_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("tvm_ffi", reason="apache-tvm-ffi renders sglang's kernels")
    result = render(tmp_path, {"sglang_cached": "sglang.jit_kernel.probe:cached()"})
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "sglang.jit_kernel.probe:cached(): sglang's loader wrote no module to compile"
    )
