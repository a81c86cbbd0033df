"""The render of sglang's own kernels (jit_cache/jit_specs.py) asks sglang's loader what it
would compile, with the real tvm-ffi writing the build.ninja it parses. The sglang here is a
small generated tree whose loader looks for a prebuilt module first, as patch 0003's does:
a flashinfer-jit-cache installed where the build runs must not answer that lookup."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import REPO, sglang_modules_forgotten, write_tree

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


@pytest.fixture
def in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The render's child code run in this process (where mutation testing reaches it): the
    generated sglang importable, tvm-ffi's build and load restored afterwards, and every
    sglang module imported meanwhile forgotten."""
    extension = pytest.importorskip("tvm_ffi.cpp.extension")
    sglang = write_tree(
        tmp_path / "sglang-tree",
        {
            "sglang/jit_kernel/utils.py": UTILS,
            "sglang/jit_kernel/probe.py": PROBE
            + "\nimport sglang.jit_kernel.utils as utils\n\ndef pair(size):\n"
            + "    pdl = utils.is_arch_support_pdl()\n"
            + "    return [load_jit('probe', size, pdl), load_jit('other', size, pdl)]\n",
        },
    )
    monkeypatch.syspath_prepend(str(sglang))
    for name in ("build_ninja", "load_module"):
        monkeypatch.setattr(extension, name, getattr(extension, name))
    monkeypatch.setitem(
        sys.modules, "flashinfer_jit_cache", sys.modules.get("flashinfer_jit_cache")
    )
    monkeypatch.setenv("TVM_FFI_CUDA_ARCH_LIST", "8.0 12.0")
    monkeypatch.setenv("TVM_FFI_CACHE_DIR", str(tmp_path / "tvm-ffi"))
    monkeypatch.setenv("TVM_FFI_GPU_BACKEND", "cuda")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    with sglang_modules_forgotten():
        yield tmp_path


def test_the_loader_s_build_files_are_read_in_process_for_the_first_arch(in_process: Path) -> None:
    from sm120_build.jit_cache.jit_specs import render

    modules = render({"pair": "sglang.jit_kernel.probe:pair(64)"})
    # The loader's PDL test answers for the first arch of TVM_FFI_CUDA_ARCH_LIST (8.0: no).
    assert [module["name"] for module in modules] == [
        "sgl_kernel_jit_other_64_False",
        "sgl_kernel_jit_probe_64_False",
    ]
    for module in modules:
        assert module["recipe"] == "pair"
        (source,) = module["cuda_sources"]
        assert Path(source).read_text().endswith("__global__ void kernel() {}\n")
        assert Path(source).is_relative_to(in_process / "tvm-ffi")
        assert module["cxx_sources"] == []
        assert "-gencode=arch=compute_120,code=sm_120" in module["cuda_flags"]
        assert "-shared" in module["link_flags"] and module["device_link"] is False
    # Nothing was compiled or loaded.
    assert not list(in_process.rglob("*.so"))


def test_an_installed_jit_cache_is_hidden_from_the_in_process_render(in_process: Path) -> None:
    from sm120_build.jit_cache.jit_specs import sglang_kernels

    sys.modules["flashinfer_jit_cache"] = types.SimpleNamespace(  # type: ignore[assignment]
        get_jit_cache_dir=lambda: "/x"
    )
    ((name, _),) = sglang_kernels("sglang.jit_kernel.probe:module(8)")
    assert name == "sgl_kernel_jit_probe_8"
    with pytest.raises(
        SystemExit,
        match=r"^sglang\.jit_kernel\.probe:cached\(\): sglang's loader wrote no module to compile$",
    ):
        sglang_kernels("sglang.jit_kernel.probe:cached()")
