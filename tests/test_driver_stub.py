"""The link-time libcuda.so.1 stand-in: every CUresult function of the toolkit's cuda.h by
its link name, in a shared library whose soname the node's real driver answers to. (The
pinned toolkit's own cuda.h: tests/test_modules.py, slow.)"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sm120_build.errors import UserError
from sm120_build.jit_cache.driver_stub import SONAME, driver_functions, driver_stub
from sm120_build.toolkit import Toolkit

# A cuda.h of the forms the real one uses: a #define that renames a function to its
# versioned link name, `extern` and spacing variants, and declarations that are not
# CUresult functions.
CUDA_H = """\
typedef int CUresult;
typedef int CUdevice;
#define cuStreamWriteValue32 cuStreamWriteValue32_v2
CUresult cuDeviceGet(CUdevice *device, int ordinal);
extern CUresult cuStreamWriteValue32(void *stream, unsigned value);
CUresult  cuInit (unsigned flags);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
int cuNotADriverResult(void);
void cuVoid(void);
"""


def toolkit_with(tmp_path: Path, cuda_h: str | None) -> Toolkit:
    home = tmp_path / "cuda"
    (home / "include").mkdir(parents=True)
    if cuda_h is not None:
        (home / "include" / "cuda.h").write_text(cuda_h)
    return Toolkit(home, (13, 0), "13.0.88", frozenset({"sm_120"}))


def dynamic_symbols(library: Path) -> set[str]:
    listed = subprocess.run(
        ["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True
    )
    return {line.split()[-1] for line in listed.stdout.splitlines() if line.strip()}


def test_the_driver_functions_are_cuda_h_s_curesult_functions_by_their_link_names(
    tmp_path: Path,
) -> None:
    assert driver_functions(toolkit_with(tmp_path, CUDA_H)) == [
        "cuDeviceGet",
        "cuInit",
        "cuStreamWriteValue32_v2",
    ]


def test_the_stub_is_a_shared_library_named_for_the_driver_that_defines_each_function(
    tmp_path: Path,
) -> None:
    toolkit = toolkit_with(tmp_path, CUDA_H)
    driver_stub(toolkit, tmp_path / "stub" / "lib")
    directory = driver_stub(toolkit, tmp_path / "stub" / "lib")  # again, over the first
    assert directory == tmp_path / "stub" / "lib"
    source = (directory / "libcuda-stub.c").read_text()
    assert source.startswith(
        "/* Link-time stand-in for the NVIDIA driver: never run (sm120_build/jit_cache/"
        "driver_stub.py). */\nint cuDeviceGet(void) { return 999; }\n"
    )
    library = directory / "libcuda.so"
    dynamic = subprocess.run(
        ["readelf", "-d", str(library)], capture_output=True, text=True, check=True
    ).stdout
    assert f"Library soname: [{SONAME}]" in dynamic
    assert SONAME == "libcuda.so.1"
    defined = dynamic_symbols(library)
    assert {"cuDeviceGet", "cuInit", "cuStreamWriteValue32_v2"} <= defined
    assert "cuStreamWriteValue32" not in defined and "cuNotADriverResult" not in defined


def test_a_toolkit_without_cuda_h_is_refused_naming_the_header(tmp_path: Path) -> None:
    toolkit = toolkit_with(tmp_path, None)
    with pytest.raises(UserError) as refused:
        driver_stub(toolkit, tmp_path / "stub")
    message = str(refused.value)
    assert message.startswith(f"cannot read the driver API from {toolkit.home}/include/cuda.h")
    assert "cuda.h" in message.split("(gcc: ", 1)[1]  # the compiler's own words say what
    assert not (tmp_path / "stub" / "libcuda.so").exists()


def test_a_cuda_h_that_declares_no_driver_function_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"\(gcc: no declarations found\)$"):
        driver_functions(toolkit_with(tmp_path, "typedef int CUresult;\n"))


def test_a_stub_the_compiler_cannot_link_is_refused_with_its_last_words(tmp_path: Path) -> None:
    # The compiler named, not gcc: it preprocesses cuda.h (declaring one more function of
    # its own), and fails to link, saying more than the message keeps.
    compiler = tmp_path / "cc-that-cannot-link"
    compiler.write_text(
        '#!/bin/sh\ncase " $* " in *" -E "*) gcc "$@"; echo "CUresult cuOfTheNamedCompiler(void);"'
        "; exit 0;; esac\n"
        'printf "ld: %01500d" 0 >&2\nexit 1\n'
    )
    compiler.chmod(0o755)
    with pytest.raises(UserError) as refused:
        driver_stub(toolkit_with(tmp_path, CUDA_H), tmp_path / "stub", str(compiler))
    assert str(refused.value) == "cannot build the link-time driver stub: " + "0" * 1000
    source = (tmp_path / "stub" / "libcuda-stub.c").read_text()
    assert "int cuInit(void) { return 999; }\n" in source
    assert "int cuOfTheNamedCompiler(void) { return 999; }\n" in source


def test_a_compiler_s_long_complaint_is_cut_to_its_end(tmp_path: Path) -> None:
    compiler = tmp_path / "cc-that-cannot-read"
    compiler.write_text('#!/bin/sh\nprintf "cpp: %0700d" 0 >&2\nexit 1\n')
    compiler.chmod(0o755)
    with pytest.raises(UserError) as refused:
        driver_functions(toolkit_with(tmp_path, CUDA_H), str(compiler))
    assert str(refused.value).endswith(f"({compiler}: {'0' * 500})")
