"""Module selection (profiles.toml), FlashInfer ninja parsing, the CMake module list, arch
coverage, the node check's rules and the base-wheel overlay, on small generated inputs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sm120_build.errors import UserError
from sm120_build.jit_cache.arch import Arch, check_modules_cover_archs
from sm120_build.jit_cache.cmake import modules_cmake
from sm120_build.jit_cache.jit_specs import parse_ninja, parse_tvm_ffi_ninja
from sm120_build.jit_cache.overlay import overlay_base
from sm120_build.jit_cache.render import Module, render_modules
from sm120_build.node.check import device_arch, patch_series, provenance, runs_on
from sm120_build.profiles import load
from sm120_build.toolkit import Toolkit

from .conftest import REPO, zip_wheel

# The shape of the ninja file FlashInfer 0.6.3's generate_ninja_build_for_op writes.
NINJA = """ninja_required_version = 1.3
name = demo
cuda_home = /opt/cuda
cxx = c++
nvcc = $cuda_home/bin/nvcc

common_cflags = -DPy_LIMITED_API=0x03090000 $
    -D_GLIBCXX_USE_CXX11_ABI=1 $
    -I/gen/extra $
    -isystem /py/include $
    -isystem $cuda_home/include $
    -isystem /src/include
cflags = $common_cflags $
    -fPIC $
    -O3
post_cflags =
cuda_cflags = $common_cflags $
    --compiler-options=-fPIC $
    -gencode=arch=compute_120f,code=sm_120f $
    -DX="a b"
cuda_post_cflags =
ldflags = -shared $
    -L$cuda_home/lib64 $
    -L$cuda_home/lib64/stubs $
    -lcudart $
    -lcuda $
    -lnvrtc

rule compile
  command = $cxx -MMD -MF $out.d $cflags -c $in -o $out $post_cflags

rule cuda_compile
  command = $nvcc $cuda_cflags -c $in -o $out $cuda_post_cflags

rule link
  command = $cxx $in $ldflags -o $out

build /jit/demo/a.cuda.o: cuda_compile /src/csrc/a.cu
build /jit/demo/b.o: compile /src/csrc/b.cpp

build /jit/demo/demo.so: link /jit/demo/a.cuda.o /jit/demo/b.o
default /jit/demo/demo.so
"""


def demo_module(**changes: object) -> Module:
    fields: dict[str, object] = {"name": "demo", "recipe": "demo", **parse_ninja(NINJA)}
    fields.update(changes)
    return Module(**fields)  # type: ignore[arg-type]


def test_ninja_parse_expands_variables_and_keeps_quoted_words() -> None:
    parsed = parse_ninja(NINJA)
    assert parsed["cuda_sources"] == ["/src/csrc/a.cu"]
    assert parsed["cxx_sources"] == ["/src/csrc/b.cpp"]
    assert parsed["cuda_flags"][:4] == [
        "-DPy_LIMITED_API=0x03090000",
        "-D_GLIBCXX_USE_CXX11_ABI=1",
        "-I/gen/extra",
        "-isystem",
    ]
    assert "/opt/cuda/include" in parsed["cuda_flags"]
    assert parsed["cuda_flags"][-1] == "-DX=a b"
    assert parsed["cxx_flags"][-2:] == ["-fPIC", "-O3"]
    assert parsed["link_flags"][1] == "-L/opt/cuda/lib64"
    assert parsed["device_link"] is False
    assert parse_ninja(NINJA.replace(": link ", ": nvcc_link "))["device_link"] is True


def test_tvm_ffi_s_own_ninja_file_is_read_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """What tvm-ffi's load_inline writes for sglang 0.5.9's kernels, written by tvm-ffi's
    own generator: C++ and CUDA sources, their flags, and ':' in paths, which it escapes."""
    extension = pytest.importorskip("tvm_ffi.cpp.extension")
    monkeypatch.setenv("TVM_FFI_CUDA_ARCH_LIST", "12.0")
    sources = ["/src/a:b/host.cpp", "/src/dev.cu"]
    ninja = extension._generate_ninja_build(
        "demo", ["-DHOST=1"], ["-DDEVICE=1"], ["-lextra"], ["/inc:lude"], sources, backend="cuda"
    )
    assert "$:" in ninja  # the escape this test is about
    parsed = parse_tvm_ffi_ninja(ninja)
    assert parsed["cxx_sources"] == ["/src/a:b/host.cpp"]
    assert parsed["cuda_sources"] == ["/src/dev.cu"]
    assert parsed["cxx_flags"][:4] == ["-std=c++17", "-fPIC", "-O2", "-DHOST=1"]
    assert parsed["cxx_flags"][-1] == "-I/inc:lude"
    assert "-DDEVICE=1" in parsed["cuda_flags"] and parsed["cuda_flags"][-1] == "-I/inc:lude"
    assert "-gencode=arch=compute_120,code=sm_120" in parsed["cuda_flags"]
    assert parsed["link_flags"][0] == "-shared" and parsed["link_flags"][-1] == "-lextra"
    assert parsed["device_link"] is False
    # A module of C++ alone: tvm-ffi writes no cuda_cflags line.
    host_only = parse_tvm_ffi_ninja(
        extension._generate_ninja_build("host", [], [], [], [], ["/src/host.cpp"])
    )
    assert (host_only["cuda_sources"], host_only["cuda_flags"]) == ([], [])
    assert host_only["cxx_sources"] == ["/src/host.cpp"]


def test_modules_cmake_splits_includes_and_drops_what_cmake_links_itself() -> None:
    toolkit = Toolkit(Path("/opt/cuda"), (13, 0), "13.0.88", frozenset({"sm_120"}))
    text = modules_cmake([demo_module()], toolkit, Path("/build/driver-stub"))
    values: dict[str, list[str]] = {}
    for line in text.splitlines():
        if re.fullmatch(r"  [A-Z_]+", line):
            key = line.strip()
            values[key] = []
        elif line.startswith('    "'):
            values[key].append(line.strip()[1:-1])
    assert values["INCLUDES"] == ["/gen/extra"]
    assert values["SYSTEM_INCLUDES"] == ["/py/include", "/opt/cuda/include", "/src/include"]
    # The toolkit's stubs are the generated driver stub's; cudart is static.
    assert values["LINK_DIRS"] == ["/opt/cuda/lib64", "/build/driver-stub"]
    assert values["LIBRARIES"] == ["cuda", "nvrtc"]
    assert "-isystem" not in values["CUDA_FLAGS"]
    assert values["CUDA_FLAGS"][-1] == "-DX=a b"
    assert values["CXX_FLAGS"] == [
        "-DPy_LIMITED_API=0x03090000",
        "-D_GLIBCXX_USE_CXX11_ABI=1",
        "-fPIC",
        "-O3",
    ]
    assert "LINK_FLAGS" not in values
    # CMake's own quoting: a $ or ; in a flag stays literal.
    odd = modules_cmake(
        [demo_module(cuda_flags=["-DA=$x;y"], cxx_flags=[])], toolkit, Path("/stub")
    )
    assert '"-DA=\\$x\\;y"' in odd


def test_modules_cmake_refuses_different_cxx_and_cuda_includes() -> None:
    toolkit = Toolkit(Path("/opt/cuda"), (13, 0), "13.0.88", frozenset({"sm_120"}))
    module = demo_module(cxx_flags=["-isystem", "/elsewhere"])
    with pytest.raises(
        UserError, match=r"demo: FlashInfer gives C\+\+ and CUDA different includes"
    ):
        modules_cmake([module], toolkit, Path("/stub"))


def gencode(arch: str) -> str:
    return Arch.parse(arch).gencode


def test_a_module_that_filters_out_a_requested_arch_is_refused() -> None:
    archs = [Arch.parse("8.0"), Arch.parse("12.0f")]
    filtered = demo_module(name="trtllm_comm", cuda_flags=[gencode("12.0f")])
    with pytest.raises(UserError, match=r"builds trtllm_comm only for .*filters out 8.0"):
        check_modules_cover_archs([filtered], archs)
    # Every requested arch present: fine. A module that names its own arch: FlashInfer's choice.
    follows = demo_module(cuda_flags=[gencode("8.0"), gencode("12.0f")])
    own = demo_module(name="fp4_quantization_121", cuda_flags=[gencode("12.1a")])
    check_modules_cover_archs([follows, own], archs)
    # 12.0a+12.1a requested, a module built for 12.0a alone: same major, its own pick.
    check_modules_cover_archs(
        [demo_module(name="fp4_quantization_120", cuda_flags=[gencode("12.0a")])],
        [Arch.parse("12.0a"), Arch.parse("12.1a")],
    )
    # A module FlashInfer builds for an arch of another major only (aot.py's FA3 sink
    # variants are sm_90a whatever the list): no requested GPU could run it.
    sm90_only = demo_module(name="sink_sm90", cuda_flags=[gencode("9.0a")])
    with pytest.raises(UserError, match=r"builds sink_sm90 only for .*sm_90a, which none of"):
        check_modules_cover_archs([sm90_only], [Arch.parse("12.0f")])
    check_modules_cover_archs([sm90_only], [Arch.parse("9.0a")])


def test_profiles_select_default_profile_modules_and_both() -> None:
    profiles = load(REPO / "profiles.toml")
    assert list(profiles.select(None, [])) == ["trtllm_comm"]
    assert list(profiles.select(None, ["norm"])) == ["norm"]
    assert list(profiles.select("comm", ["norm", "trtllm_comm"])) == ["trtllm_comm", "norm"]
    full = profiles.select("sglang-sm120", [])
    assert {"fused_moe_120", "fp4_gemm_cutlass_sm120", "attention", "trtllm_comm"} <= set(full)
    assert {"attention_mla_ragged", "quantization"} <= set(full)
    assert not {"gemm_sm120", "rope", "attention_sink"} & set(full)  # unreached on SM12x
    with pytest.raises(
        UserError,
        match=r"no profile 'nope'.*known: comm, deepseek-v3-nvfp4, deepseek-v3-nvfp4-mtp, "
        r"glm-4.6-nvfp4, glm-4.6-nvfp4-mtp, llama-3.1-8b-instruct, qwen3-30b-a3b-fp8, served, "
        r"sglang-jit, sglang-sm120, verify-sm90, verify-sm90-d64",
    ):
        profiles.select("nope", [])
    with pytest.raises(UserError, match=r"no module recipe 'nrom'"):
        profiles.select(None, ["nrom"])


@pytest.mark.parametrize(
    "profiles_file",
    [REPO / "profiles.toml", *sorted(REPO.glob("stacks/*/profiles.toml"))],
    ids=lambda path: path.parent.name,
)
def test_every_recipe_cites_where_it_is_defined_and_loaded(profiles_file: Path) -> None:
    profiles = load(profiles_file)
    for recipe in profiles.recipes.values():
        assert re.fullmatch(r"(flashinfer|sglang)/\S+\.py:\d+", recipe.defined_at), recipe.name
        assert recipe.loaded_by and all(re.match(r"\S+\.py:\d+ ", x) for x in recipe.loaded_by)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[modules.a]\ncall = "no colon"\n[profiles.comm]\nmodules = ["a"]\n', "needs call"),
        ('[modules.a]\ncall = "m:f()"\n[profiles.comm]\nmodules = ["b"]\n', "unknown modules"),
        ('[modules.a]\ncall = "m:f()"\n[profiles.other]\nmodules = ["a"]\n', "default profile"),
        ('[modules.a]\ncall = "m:f()"\n[profiles.comm]\nmodules = []\n', "non-empty"),
    ],
)
def test_malformed_profiles_are_refused(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "profiles.toml").write_text(text)
    with pytest.raises(UserError, match=message):
        load(tmp_path / "profiles.toml")


def test_which_archs_run_on_which_gpu() -> None:
    assert runs_on("12.0f", 12, 0) and runs_on("12.0f", 12, 1)
    assert runs_on("12.0a", 12, 0) and not runs_on("12.0a", 12, 1)
    assert not runs_on("12.1a", 12, 0) and not runs_on("12.0f", 10, 0)
    assert runs_on("9.0a", 9, 0) and not runs_on("9.0a", 12, 0)
    assert runs_on("8.0", 8, 6) and not runs_on("8.6", 8, 0)


def test_patch_series_label() -> None:
    assert patch_series("0.6.3+cu130.sm120f.p1a2b3c4d") == "p1a2b3c4d"
    assert patch_series("0.6.3+sm120.p1a2b3c4d") == "p1a2b3c4d"
    assert patch_series("0.6.3+cu130") is None and patch_series("0.6.3") is None


def test_runs_on_refuses_what_is_not_an_arch() -> None:
    assert not runs_on("sm_120a", 12, 0) and not runs_on("12.0b", 12, 0)
    assert not runs_on("12.10", 12, 1)  # one minor digit, as CUDA spells archs


def test_node_tools_take_the_builds_arch_spellings() -> None:
    assert device_arch("12.0", None) == ((12, 0), "--arch")
    assert device_arch("12.0f", None) == ((12, 0), "--arch")
    assert device_arch("12.1a", None) == ((12, 1), "--arch")
    for wrong in ("sm_120", "120", "12.0x", "12.0af"):
        with pytest.raises(UserError, match=r"expected MAJOR\.MINOR, e\.g\. 12\.0"):
            device_arch(wrong, None)


def test_without_arch_the_node_tools_need_a_gpu() -> None:
    assert device_arch(None, None) == (
        None,
        "torch is not installed here, so no GPU could be asked for its arch",
    )
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    assert device_arch(None, torch) == (
        None,
        "no CUDA GPU is visible; on a machine without one, pass --arch 12.0",
    )


def test_provenance_is_read_from_the_installed_distribution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = tmp_path / "built_here-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: built-here\nVersion: 1.0\n")
    (info / "sm120-build.json").write_text('{"archs": ["12.0f"]}')
    monkeypatch.syspath_prepend(str(tmp_path))
    assert provenance("built-here") == {"archs": ["12.0f"]}


def test_provenance_names_what_is_missing() -> None:
    with pytest.raises(UserError, match=r"^no-such-distribution is not installed in /"):
        provenance("no-such-distribution")
    with pytest.raises(UserError, match=r"^pytest \S+ was not built by sm120-build"):
        provenance("pytest")


def jit_cache_wheel(path: Path, version: str, modules: dict[str, bytes]) -> Path:
    return zip_wheel(
        path / f"flashinfer_jit_cache-{version}-py3-none-linux_x86_64.whl",
        {
            "flashinfer_jit_cache/__init__.py": version.encode(),
            **{f"flashinfer_jit_cache/jit_cache/{n}/{n}.so": data for n, data in modules.items()},
            f"flashinfer_jit_cache-{version}.dist-info/WHEEL": b"Wheel-Version: 1.0",
        },
    )


def test_overlay_keeps_the_base_modules_we_did_not_build(tmp_path: Path) -> None:
    (tmp_path / "ours").mkdir()
    (tmp_path / "base").mkdir()
    ours = jit_cache_wheel(tmp_path / "ours", "0.6.3+cu130.sm120f.p1a2b3c4d", {"norm": b"ours"})
    base = jit_cache_wheel(tmp_path / "base", "0.6.3+cu130", {"norm": b"base", "rope": b"base"})
    merged, taken = overlay_base(ours, base, tmp_path)
    assert taken == ["rope"]
    with zipfile.ZipFile(merged) as archive:
        assert archive.read("flashinfer_jit_cache/jit_cache/norm/norm.so") == b"ours"
        assert archive.read("flashinfer_jit_cache/jit_cache/rope/rope.so") == b"base"
        assert archive.read("flashinfer_jit_cache/__init__.py") == b"0.6.3+cu130.sm120f.p1a2b3c4d"
        assert not any(
            n.startswith("flashinfer_jit_cache-0.6.3+cu130.dist") for n in archive.namelist()
        )


def test_overlay_refuses_a_base_of_another_release(tmp_path: Path) -> None:
    (tmp_path / "ours").mkdir()
    (tmp_path / "base").mkdir()
    ours = jit_cache_wheel(tmp_path / "ours", "0.6.3+cu130.sm120f.p1a2b3c4d", {"norm": b"x"})
    base = jit_cache_wheel(tmp_path / "base", "0.6.4+cu130", {"rope": b"y"})
    with pytest.raises(UserError, match=r"not a flashinfer-jit-cache 0.6.3 wheel"):
        overlay_base(ours, base, tmp_path)


def test_render_without_flashinfer_says_what_to_run(tmp_path: Path) -> None:
    toolkit = Toolkit(Path("/opt/cuda"), (13, 0), "13.0.88", frozenset({"sm_120"}))
    (tmp_path / "flashinfer-tree").mkdir()
    with pytest.raises(
        UserError,
        match=r"could not render .*ModuleNotFoundError.*; run through `nox -s build_wheels`, "
        r"which installs pins\.toml's \[render\] requirements$",
    ):
        render_modules(
            tmp_path / "flashinfer-tree",
            {"norm": "flashinfer.jit.norm:gen_norm_module()"},
            [Arch.parse("12.0f")],
            toolkit,
        )


def test_flashinfers_data_links_are_read_from_its_build_backend(tmp_path: Path) -> None:
    """FlashInfer 0.7 links 3rdparty/cccl too; a fixed list would miss it."""
    from sm120_build.jit_cache.sources import data_links

    (tmp_path / "build_backend.py").write_text(
        "def _create_data_dir(use_symlinks=True):\n"
        "    def ln(source, target):\n        pass\n"
        '    ln("3rdparty/cutlass", "cutlass")\n    ln("3rdparty/cccl", "cccl")\n'
        '    ln("csrc", "csrc")\n'
        'def other():\n    ln("x", "y")\n'
    )
    assert data_links(tmp_path) == {
        "cutlass": "3rdparty/cutlass",
        "cccl": "3rdparty/cccl",
        "csrc": "csrc",
    }
    (tmp_path / "build_backend.py").write_text("def _create_data_dir():\n    pass\n")
    with pytest.raises(UserError, match="FlashInfer changed how it lays out flashinfer/data/"):
        data_links(tmp_path)


@pytest.mark.slow
def test_the_driver_stub_holds_the_link_names_of_cuda_h(tmp_path: Path) -> None:
    """cuStreamWriteValue32 links as cuStreamWriteValue32_v2 (cuda.h's #define), as the
    real driver exports it; the stub's soname is the driver's."""
    from sm120_build.jit_cache.driver_stub import driver_functions, driver_stub
    from sm120_build.toolkit import pip_toolkit

    from .conftest import PINS_TOOLKIT

    toolkit = pip_toolkit(PINS_TOOLKIT, tmp_path / "cache")
    names = driver_functions(toolkit)
    assert "cuDeviceGet" in names and "cuStreamWriteValue32_v2" in names
    assert "cuStreamWriteValue32" not in names
    stub = driver_stub(toolkit, tmp_path / "stub") / "libcuda.so"
    dynamic = subprocess.run(["readelf", "-d", str(stub)], capture_output=True, text=True).stdout
    assert "Library soname: [libcuda.so.1]" in dynamic


def test_a_long_silent_compile_says_it_is_still_at_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """ninja prints a unit's line when it ends: the first [1/4] came minutes after the
    compile began, with nothing before it."""
    from sm120_build.jit_cache import cmake

    monkeypatch.setattr(cmake, "HEARTBEAT", 0.4)
    command = [
        sys.executable,
        "-c",
        "import time; time.sleep(1.3); print('[1/1] Building CUDA object x.o', flush=True)",
    ]
    assert cmake._run_showing_progress(command, dict(os.environ), tmp_path / "log") == 0
    err = capsys.readouterr().err
    assert re.search(r"sm120-build: still compiling, \d+ s so far\n", err)
    assert err.endswith("[1/1] Building CUDA object x.o\n")
    assert (tmp_path / "log").read_text() == "[1/1] Building CUDA object x.o\n"
