"""The kernel build's parts that decide what is compiled, recorded and shipped, in process:
the host compilers in the cache key, the license texts, the module's paths made portable,
the compile commands and seconds read back from CMake's and ninja's files, and the
environment the compile runs in. The whole build: tests/test_build_e2e.py (slow)."""

from __future__ import annotations

import json
import os
import sys
import sysconfig
from pathlib import Path

import pytest

from sm120_build.errors import UserError
from sm120_build.jit_cache import cmake
from sm120_build.jit_cache.render import Module
from sm120_build.toolkit import Toolkit

from .conftest import refusal

TOOLKIT = Toolkit(Path("/opt/cuda"), (13, 0), "13.0.88", frozenset({"sm_120"}))


def program(path: Path, stdout: str, stderr: str = "") -> Path:
    """A compiler that says who it is to --version, and nothing to anything else."""
    path.write_text(
        f"#!/bin/sh\n[ \"$*\" = --version ] || exit 1\nprintf '{stdout}'\nprintf '{stderr}' >&2\n"
    )
    path.chmod(0o755)
    return path


def test_the_host_compilers_are_cxx_and_gcc_by_their_first_version_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cxx = program(tmp_path / "clang++", "clang version 19.1.0\\nTarget: x86_64\\n")
    monkeypatch.setenv("CXX", str(cxx))
    identities = cmake.host_compilers()
    assert identities[0] == f"{cxx}: clang version 19.1.0"
    assert identities[1].startswith("gcc: gcc") and len(identities) == 2
    quiet = program(tmp_path / "quiet++", "", "  quiet c++ 1.0  \\n")
    monkeypatch.setenv("CXX", str(quiet))
    assert cmake.host_compilers()[0] == f"{quiet}: quiet c++ 1.0"


def test_without_cxx_the_host_compiler_is_c_plus_plus_and_a_missing_one_says_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CXX", "")
    assert cmake.host_compilers()[0].startswith("c++: ")
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    with pytest.raises(UserError) as refused:
        cmake.host_compilers()
    assert str(refused.value) == (
        f"{tmp_path}/no-such-c++: No such file or directory; install a C++ compiler"
    )


def test_the_wheel_ships_flashinfer_s_fmt_s_and_tvm_ffi_s_license_texts(tmp_path: Path) -> None:
    sources = tmp_path / "flashinfer"
    fmt = sources / "3rdparty/spdlog/include/spdlog/fmt/bundled/fmt.license.rst"
    fmt.parent.mkdir(parents=True)
    fmt.write_text("fmt's license\n")
    (sources / "LICENSE").write_text("FlashInfer's license\n")
    licenses = tmp_path / "licenses"
    licenses.mkdir()
    cmake.add_license_texts(sources, licenses)
    assert (licenses / "FlashInfer-LICENSE.txt").read_text() == "FlashInfer's license\n"
    assert (licenses / "fmt-LICENSE.rst").read_text() == "fmt's license\n"
    assert "Apache License" in (licenses / "tvm-ffi-LICENSE.txt").read_text()
    assert (licenses / "tvm-ffi-NOTICE.txt").read_text().strip()
    assert sorted(p.name for p in licenses.iterdir()) == [
        "FlashInfer-LICENSE.txt",
        "fmt-LICENSE.rst",
        "tvm-ffi-LICENSE.txt",
        "tvm-ffi-NOTICE.txt",
    ]
    (sources / "LICENSE").unlink()
    with pytest.raises(UserError) as refused:
        cmake.add_license_texts(sources, licenses)
    assert str(refused.value) == "the flashinfer sources lack LICENSE, whose text the wheel ships"


def test_include_flags_split_into_dirs_system_dirs_and_the_rest_in_order() -> None:
    flags = ["-I/a", "-O3", "-I", "/b", "-isystem", "/c", "-DX", "-isystem", "/d", "-I/e"]
    assert cmake._split_includes(flags) == (["/a", "/b", "/e"], ["/c", "/d"], ["-O3", "-DX"])


def test_cmake_quoting_keeps_backslashes_quotes_dollars_and_semicolons_literal() -> None:
    assert cmake._cmake_quote('a\\b"c$d;e') == '"a\\\\b\\"c\\$d\\;e"'
    assert cmake._cmake_quote("plain") == '"plain"'


def test_machine_paths_are_replaced_longest_first_in_every_part_of_a_module(
    tmp_path: Path,
) -> None:
    sources = tmp_path / "exported" / "flashinfer"
    sglang = tmp_path / "exported" / "sglang"
    paths = cmake.machine_paths(sources, TOOLKIT, sglang)
    include = sysconfig.get_path("include")
    tvm_ffi = cmake.tvm_ffi_include_dirs()
    assert paths == {
        str(sources): "$FLASHINFER",
        str(sources.parent / "workspace"): "$FLASHINFER_GENERATED",
        "/opt/cuda": "$CUDA_HOME",
        include: "$PYTHON_INCLUDE",
        **{path: "$TVM_FFI" for path in tvm_ffi},
        str(sglang): "$SGLANG",
    }
    without_sglang = {path: name for path, name in paths.items() if name != "$SGLANG"}
    assert cmake.machine_paths(sources, TOOLKIT, None) == without_sglang
    module = Module(
        name="norm",
        recipe="norm",
        cuda_sources=[f"{sources}/csrc/norm.cu"],
        cxx_sources=[f"{sources.parent}/workspace/gen/norm.cpp"],
        cuda_flags=[f"-I{sources}/include", "-I/opt/cuda/include", f"-isystem{include}"],
        cxx_flags=[f"-I{tvm_ffi[0]}", f"-I{sglang}/jit"],
        link_flags=["-L/opt/cuda/lib64", "-lcudart"],
        device_link=False,
    )
    assert cmake.portable(module, paths) == Module(
        name="norm",
        recipe="norm",
        cuda_sources=["$FLASHINFER/csrc/norm.cu"],
        cxx_sources=["$FLASHINFER_GENERATED/gen/norm.cpp"],
        cuda_flags=["-I$FLASHINFER/include", "-I$CUDA_HOME/include", "-isystem$PYTHON_INCLUDE"],
        cxx_flags=["-I$TVM_FFI", "-I$SGLANG/jit"],
        link_flags=["-L$CUDA_HOME/lib64", "-lcudart"],
        device_link=False,
    )
    # Longest first: a path inside another is named by the inner one's name.
    assert cmake._symbolic(["/a/b/c", "/a/x", "-I/a/b"], {"/a": "$A", "/a/b": "$B"}) == [
        "$B/c",
        "$A/x",
        "-I$B",
    ]


def test_the_recorded_commands_are_compile_commands_json_sorted_with_paths_named(
    tmp_path: Path,
) -> None:
    sources = tmp_path / "flashinfer"
    sglang = tmp_path / "sglang"
    build = tmp_path / "build"
    build.mkdir()
    entries = [
        {
            "file": f"{sources}/csrc/b.cu",
            "output": "b.o",
            "command": f"/opt/cuda/bin/nvcc -I{sources}/include -o {build}/b.o '-DX=a b'",
        },
        {"file": f"{sources}/csrc/a.cu", "output": "a2.o", "command": f"c++ -I{sglang} -o a2.o"},
        {"file": f"{sources}/csrc/a.cu", "output": "a1.o", "command": "c++ -c a.cu -o a1.o"},
    ]
    (build / "compile_commands.json").write_text(json.dumps(entries))
    assert cmake._recorded_commands(build, sources, TOOLKIT, sglang) == [
        ["c++", "-c", "a.cu", "-o", "a1.o"],
        ["c++", "-I$SGLANG", "-o", "a2.o"],
        ["$CUDA_HOME/bin/nvcc", "-I$FLASHINFER/include", "-o", "$BUILD/b.o", "-DX=a b"],
    ]


def test_compile_seconds_sum_each_module_s_units_from_ninja_s_log(tmp_path: Path) -> None:
    (tmp_path / ".ninja_log").write_text(
        "# ninja log v5\n"
        "0\t1500\t1\tCMakeFiles/norm.dir/csrc/norm.cu.o\tabc\n"
        "100\t600\t1\tCMakeFiles/norm.dir/csrc/binding.cpp.o\tdef\n"
        "0\t2250\t1\tCMakeFiles/rope.dir/rope.cu.o\tghi\n"
        "2300\t2400\t1\tnorm.so\tjkl\n"  # the link: not a compile
        "0\t9000\t1\tCMakeFiles/odd.dir/x.o\n"  # four fields: not ninja's line
        "0\t500\t1\tCMakeFiles/rope.dir/my unit.cu.o\tmno\n"  # a space in a path
    )
    assert cmake._compile_seconds(tmp_path) == {"norm": 2.0, "rope": 2.75}


def test_the_compile_environment_scrubs_every_flag_hook_and_keeps_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shell = {name: "x" for name in cmake._SCRUBBED}
    shell.update(CMAKE_GENERATOR="Unix Makefiles", SKBUILD_BUILD_DIR="/b", HOME="/root")
    env = cmake.compile_environment(shell, TOOLKIT)
    jobs = cmake.compile_jobs(os.cpu_count() or 1, cmake._available_memory())
    assert env == {
        "HOME": "/root",
        "CUDA_HOME": "/opt/cuda",
        "CUDACXX": "/opt/cuda/bin/nvcc",
        "CMAKE_BUILD_PARALLEL_LEVEL": str(jobs),
    }
    assert 1 <= jobs <= (os.cpu_count() or 1)


def test_the_memory_available_is_the_kernel_s_memavailable_in_bytes() -> None:
    meminfo = Path("/proc/meminfo").read_text()
    (kilobytes,) = [int(line.split()[1]) for line in meminfo.splitlines() if "MemAvailable" in line]
    # The two reads are moments apart: within 5 %.
    assert abs(cmake._available_memory() - kilobytes * 1024) < kilobytes * 1024 * 0.05


def test_the_module_list_cmake_reads_is_written_whole(tmp_path: Path) -> None:
    """Every section of a flashinfer_module() call, quoted, duplicates dropped, and what
    CMake links by itself (cudart, -shared, tvm-ffi's library) left out."""
    tvm_ffi = f"-L{cmake.tvm_ffi_library_dir()}"
    module = Module(
        name="norm",
        recipe="norm",
        cuda_sources=["/src/norm.cu"],
        cxx_sources=["/src/binding.cpp"],
        cuda_flags=["-I/inc", "-isystem", "/sys", "-O3"],
        cxx_flags=["-I/inc", "-isystem", "/sys", "-fPIC"],
        link_flags=[
            "-shared",
            "-lcudart",
            tvm_ffi,
            "-ltvm_ffi",
            "-L/opt/cuda/lib64/stubs",
            "-L/opt/cuda/lib64",
            "-L/opt/cuda/lib64",
            "-lcuda",
            "-lnvrtc",
            "-lcuda",
            "-Wl,--no-undefined",
        ],
        device_link=False,
    )
    assert cmake.modules_cmake([module], TOOLKIT, tmp_path / "stub") == (
        "# Rendered by sm120_build from the patched FlashInfer's JIT specs.\n"
        "\n"
        "flashinfer_module(\n"
        "  NAME norm\n"
        '  CUDA_SOURCES\n    "/src/norm.cu"\n'
        '  CXX_SOURCES\n    "/src/binding.cpp"\n'
        '  INCLUDES\n    "/inc"\n'
        '  SYSTEM_INCLUDES\n    "/sys"\n'
        '  CUDA_FLAGS\n    "-O3"\n'
        '  CXX_FLAGS\n    "-fPIC"\n'
        f'  LINK_DIRS\n    "{tmp_path / "stub"}"\n    "/opt/cuda/lib64"\n'
        '  LIBRARIES\n    "cuda"\n    "nvrtc"\n'
        '  LINK_FLAGS\n    "-Wl,--no-undefined"\n'
        ")\n"
    )


def test_the_build_s_output_is_kept_whole_in_its_log_and_only_progress_is_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = 'echo "-- noise $MARK"; echo "[1/2] Building CUDA object a.o"; echo "an error" >&2'
    command = ["/bin/sh", "-c", f"{script}; exit 3"]
    env = {"PATH": "/usr/bin:/bin", "MARK": "from the build's environment"}
    assert cmake._run_showing_progress(command, env, tmp_path / "log") == 3
    assert (tmp_path / "log").read_text() == (
        "-- noise from the build's environment\n[1/2] Building CUDA object a.o\nan error\n"
    )
    assert capsys.readouterr().err == "[1/2] Building CUDA object a.o\n"


def test_tvm_ffi_s_library_dir_is_where_its_shared_library_is() -> None:
    pytest.importorskip("tvm_ffi", reason="the build's tvm-ffi (pins.toml [build])")
    assert (Path(cmake.tvm_ffi_library_dir()) / "libtvm_ffi.so").is_file()


def test_without_tvm_ffi_the_build_says_to_run_through_nox(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tvm_ffi", None)  # what `import tvm_ffi` raises on
    assert refusal(cmake.tvm_ffi_include_dirs) == (
        "apache-tvm-ffi is not installed in this environment; run the build through "
        "`nox -s build_wheels`, which installs the pinned build requirements"
    )
