"""sglang 0.5.11+'s kernels as the build reads them: the build.ninja sglang's loader writes
(kernels/jit/utils/compile/ninja.py generate), and the include directories of sglang's own
environment that the build copies beside its sources. The render against the real sglang
0.5.23: docs/stacks.md (it needs sglang's environment, 11 GB, which CI does not make)."""

from __future__ import annotations

from pathlib import Path

from sm120_build.jit_cache.render import _copied
from sm120_build.jit_cache.sglang_specs import parse_sglang_ninja

from .conftest import refusal

# What ninja.py generate() writes for a header-only kernel with one generated wrapper and one
# source of the tree, a space and a '$' in its paths (escaped as it escapes them).
CUDAFLAGS = (
    "-Xcompiler -fPIC -gencode=arch=compute_120f,code=sm_120f -DSGL_CUDA_ARCH=1200 "
    "'-I/opt/a b/include' -DPRICE=$$5"
)
NINJA = f"""\
ninja_required_version = 1.3
cxx = c++
nvcc = '/opt/cuda 13/bin/nvcc'
cxxflags = -fPIC -std=c++20 -O3 '-I/env/tvm_ffi/include' '-I/opt/a b/include'
cudaflags = {CUDAFLAGS}
ldflags = -shared -L/env/tvm_ffi/lib -ltvm_ffi -L/opt/cuda/lib64 -lcudart

rule compile_cxx
  depfile = $out.d
  command = $cxx -MD -MF "$out.d" $cxxflags -c "$in" -o "$out"

rule compile_cuda
  depfile = $out.d
  command = $nvcc -MD -MF "$out.d" $cudaflags -c "$in" -o "$out"

rule link
  command = $cxx $in $ldflags -o "$out"

build cuda_0.o: compile_cuda cuda.cu
build host_1.o: compile_cxx /src/sglang$ tree/csrc/host$:part.cpp
build extra_2.o: compile_cuda /src/price$$list.cu

build sgl_kernel_jit_x.so: link cuda_0.o host_1.o extra_2.o

default sgl_kernel_jit_x.so
"""


def test_the_loader_s_build_file_is_read_whole() -> None:
    assert parse_sglang_ninja(NINJA, Path("/work/x")) == {
        "cuda_sources": ["/work/x/cuda.cu", "/src/price$list.cu"],
        "cxx_sources": ["/src/sglang tree/csrc/host:part.cpp"],
        "cuda_flags": [
            "-Xcompiler",
            "-fPIC",
            "-gencode=arch=compute_120f,code=sm_120f",
            "-DSGL_CUDA_ARCH=1200",
            "-I/opt/a b/include",
            "-DPRICE=$5",
        ],
        "cxx_flags": ["-fPIC", "-std=c++20", "-O3", "-I/env/tvm_ffi/include", "-I/opt/a b/include"],
        "link_flags": [
            "-shared",
            "-L/env/tvm_ffi/lib",
            "-ltvm_ffi",
            "-L/opt/cuda/lib64",
            "-lcudart",
        ],
        "device_link": False,
    }


def test_an_include_directory_of_sglang_s_environment_is_copied_beside_the_sources(
    tmp_path: Path,
) -> None:
    purelib = tmp_path / "env" / "site-packages"
    (purelib / "deep_gemm" / "include" / "deep_gemm").mkdir(parents=True)
    (purelib / "deep_gemm" / "include" / "deep_gemm" / "gemm.cuh").write_text("// gemm\n")
    into = tmp_path / "workspace" / "sglang-env"
    flag = f"-I{purelib}/deep_gemm/include"
    assert _copied(flag, str(purelib), into) == f"-I{into}/deep_gemm/include"
    assert (into / "deep_gemm" / "include" / "deep_gemm" / "gemm.cuh").read_text() == "// gemm\n"
    assert _copied(flag, str(purelib), into) == f"-I{into}/deep_gemm/include"  # copied once
    assert _copied("-I/opt/cuda/include", str(purelib), into) == "-I/opt/cuda/include"
    assert refusal(_copied, f"-L{purelib}/deep_gemm/lib", str(purelib), into) == (
        f"sglang's kernel flag '-L{purelib}/deep_gemm/lib' names sglang's environment in a way "
        "the build cannot carry (only include directories are copied)"
    )
