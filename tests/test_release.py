"""Release correctness: the glibc a wheel's binaries need is named and held to a baseline;
the compile step's environment cannot change the bytes behind the cache's back; compile
jobs fit the memory."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sm120_build.errors import UserError
from sm120_build.glibc import check_baseline, describe, newest_glibc
from sm120_build.jit_cache.cmake import MEMORY_PER_JOB, compile_environment, compile_jobs
from sm120_build.toolkit import Toolkit
from sm120_build.wheels import manylinux_tag, platform_audit

from .conftest import zip_wheel


def shared_object(tmp_path: Path, source: str) -> bytes:
    (tmp_path / "f.c").write_text(source)
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O1", "-o", str(tmp_path / "f.so"), str(tmp_path / "f.c")],
        check=True,
    )
    return (tmp_path / "f.so").read_bytes()


@pytest.fixture
def newer_symbol_wheel(tmp_path: Path) -> Path:
    """A wheel whose one .so calls pthread_create, which glibc 2.34 moved into libc
    (pthread_create@GLIBC_2.34): built here, it needs glibc 2.34."""
    data = shared_object(
        tmp_path,
        "#include <pthread.h>\n"
        "static void *run(void *a) { return a; }\n"
        "int start(void) { pthread_t t; return pthread_create(&t, 0, run, 0); }\n",
    )
    return zip_wheel(
        tmp_path / "demo-1.0-py3-none-linux_x86_64.whl",
        {
            "demo/f.so": data,
            "demo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n",
            "demo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nTag: py3-none-linux_x86_64\n",
        },
    )


def test_the_symbol_that_sets_the_tag_is_named(newer_symbol_wheel: Path) -> None:
    version, needing = newest_glibc(newer_symbol_wheel)
    assert version == (2, 34) and "pthread_create (f.so)" in needing
    described = describe("manylinux_2_34_x86_64", newer_symbol_wheel)
    assert described.endswith("glibc 2.34, needed by pthread_create (f.so)")


@pytest.mark.slow
def test_auditwheel_agrees_on_the_tag(newer_symbol_wheel: Path) -> None:
    assert manylinux_tag(newer_symbol_wheel) == "manylinux_2_34_x86_64"


def test_a_wheel_above_the_promised_baseline_is_refused(newer_symbol_wheel: Path) -> None:
    tag = "manylinux_2_34_x86_64"
    with pytest.raises(
        UserError,
        match=r"is tagged manylinux_2_34_x86_64, above the promised glibc 2\.28: glibc 2\.34 "
        r"for pthread_create",
    ):
        check_baseline(newer_symbol_wheel, tag, {}, "2.28")
    check_baseline(newer_symbol_wheel, tag, {}, "2.34")  # at the baseline: fine


@pytest.fixture
def newer_libstdcxx_wheel(tmp_path: Path) -> Path:
    """A wheel whose .so needs nothing newer of glibc than any, but GLIBCXX_3.4.29
    (std::string::reserve() without an argument, GCC 11's libstdc++)."""
    (tmp_path / "f.cpp").write_text(
        "#include <string>\n"
        'extern "C" unsigned long grow(std::string* s) { s->reserve(); return s->capacity(); }\n'
    )
    subprocess.run(
        ["g++", "-shared", "-fPIC", "-O1", "-o", str(tmp_path / "f.so"), str(tmp_path / "f.cpp")],
        check=True,
    )
    return zip_wheel(
        tmp_path / "demo-1.0-py3-none-linux_x86_64.whl",
        {
            "demo/f.so": (tmp_path / "f.so").read_bytes(),
            "demo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n",
            "demo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nTag: py3-none-linux_x86_64\n",
        },
    )


@pytest.mark.slow
def test_a_newer_libstdcxx_alone_breaks_the_baseline(newer_libstdcxx_wheel: Path) -> None:
    """Its only newer need is GLIBCXX_3.4.29: auditwheel tags it manylinux_2_34, and the
    baseline used to look at GLIBC_ symbols only and let it pass."""
    found = platform_audit(newer_libstdcxx_wheel)
    assert found.tag == "manylinux_2_34_x86_64"
    with pytest.raises(UserError) as refused:
        check_baseline(newer_libstdcxx_wheel, found.tag, found.versioned_symbols, "2.28")
    assert str(refused.value) == (
        "demo-1.0-py3-none-linux_x86_64.whl is tagged manylinux_2_34_x86_64, above the "
        "promised glibc 2.28: no glibc symbol above it; newest of the other libraries: "
        "libstdc++.so.6 GLIBCXX_3.4.29. Build where glibc is at most 2.28 (a manylinux_2_28 "
        "image, ci/docker/), or promise less."
    )


@pytest.mark.slow
def test_a_wheel_that_links_only_the_driver_keeps_its_manylinux_tag(tmp_path: Path) -> None:
    """pcie_ipc_comm needs libcuda.so.1, which no manylinux policy lists: auditwheel says
    linux_x86_64, but the driver is on every node these kernels run on."""
    (tmp_path / "f.c").write_text(
        "int cuDeviceGet(int *, int);\nint f(void) { int d; return cuDeviceGet(&d, 0); }\n"
    )
    (tmp_path / "stub.c").write_text("int cuDeviceGet(void) { return 0; }\n")
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-Wl,-soname,libcuda.so.1",
            "-o",
            str(tmp_path / "libcuda.so"),
            str(tmp_path / "stub.c"),
        ],
        check=True,
    )
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-o",
            str(tmp_path / "f.so"),
            str(tmp_path / "f.c"),
            f"-L{tmp_path}",
            "-lcuda",
        ],
        check=True,
    )
    wheel = zip_wheel(
        tmp_path / "demo-1.0-py3-none-linux_x86_64.whl",
        {
            "demo/f.so": (tmp_path / "f.so").read_bytes(),
            "demo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n",
            "demo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nTag: py3-none-linux_x86_64\n",
        },
    )
    assert platform_audit(wheel).tag.startswith("manylinux_2_")


CUDA = Toolkit(Path("/opt/cuda"), (13, 0), "13.0.88", frozenset({"sm_120"}))


def test_the_compile_step_never_sees_flags_that_would_change_its_bytes() -> None:
    """NVCC_APPEND_FLAGS and the rest changed the binaries while no cache key saw them: a
    module built in one shell was reused in another."""
    shell = {
        "PATH": "/usr/bin",
        "NVCC_APPEND_FLAGS": "-DSOMETHING_ELSE",
        "NVCC_PREPEND_FLAGS": "-O0",
        "CXXFLAGS": "-O0",
        "CUDAFLAGS": "-G",
        "LDFLAGS": "-Wl,-z,lazy",
        "CUDAHOSTCXX": "/usr/bin/clang++",
        "CMAKE_ARGS": "-DCMAKE_CUDA_FLAGS=-G",
        "SKBUILD_CMAKE_ARGS": "-DX=1",
        "CMAKE_BUILD_PARALLEL_LEVEL": "3",
    }
    env = compile_environment(shell, CUDA)
    assert env["PATH"] == "/usr/bin" and env["CUDACXX"] == "/opt/cuda/bin/nvcc"
    for name in shell.keys() - {"PATH", "CMAKE_BUILD_PARALLEL_LEVEL"}:
        assert name not in env, name
    assert env["CMAKE_BUILD_PARALLEL_LEVEL"] == "3"  # parallelism changes no byte: kept


def test_compile_jobs_fit_the_memory() -> None:
    assert compile_jobs(16, 16 * MEMORY_PER_JOB) == 16
    assert compile_jobs(4, 16 << 30) == 2  # 16 GiB available: two CUTLASS units at once
    assert compile_jobs(4, (16 << 30) - 1) == 1  # a 16 GB runner has less available: one
    assert compile_jobs(8, 1 << 30) == 1


# What reached the render child or the compiler from the shell, with no cache key that saw
# it: each changes what FlashInfer renders or what gcc compiles.
SHELL = {
    "PATH": "/usr/bin",
    "HOME": "/root",
    "SCHEDULING_MODE": "1",
    "GENERATE_CU_TRTLLM": "true",
    "NVSHMEM_HOME": "/opt/nvshmem",
    "NVSHMEM_DIR": "/opt/nvshmem",
    "FLASHINFER_EXTRA_CUDAFLAGS": "-G",
    "TVM_FFI_CUDA_ARCH_LIST": "8.0",
    "CPATH": "/evil/include",
    "C_INCLUDE_PATH": "/evil/include",
    "CPLUS_INCLUDE_PATH": "/evil/include",
    "LIBRARY_PATH": "/evil/lib",
    "GCC_EXEC_PREFIX": "/evil/gcc",
    "COMPILER_PATH": "/evil/bin",
}


@pytest.mark.parametrize("name", sorted(set(SHELL) - {"PATH", "HOME"}))
def test_the_render_child_sees_none_of_the_shells_build_variables(name: str) -> None:
    from sm120_build.jit_cache.arch import Arch
    from sm120_build.jit_cache.render import render_environment

    env = render_environment(SHELL, Path("/tmp/src/flashinfer"), [Arch.parse("12.0f")], CUDA)
    assert (env["PATH"], env["HOME"]) == ("/usr/bin", "/root")
    assert env.get(name) != SHELL[name], name


@pytest.mark.parametrize(
    "name",
    [
        "CPATH",
        "C_INCLUDE_PATH",
        "CPLUS_INCLUDE_PATH",
        "LIBRARY_PATH",
        "GCC_EXEC_PREFIX",
        "COMPILER_PATH",
    ],
)
def test_the_compiler_sees_none_of_gccs_search_path_variables(name: str) -> None:
    assert name not in compile_environment(SHELL, CUDA)
