"""The render, in process, against a small FlashInfer the tests write: what the child is
given (its environment, its working directory, the recipes on stdin), what comes back as
modules, and each way it is refused. The real FlashInfer's render: tests/test_modules.py
(slow)."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sm120_build.errors import UserError
from sm120_build.jit_cache import jit_specs
from sm120_build.jit_cache.arch import Arch
from sm120_build.jit_cache.render import RENDER_ENVIRONMENT, Module, render_environment
from sm120_build.jit_cache.render import render_modules as render
from sm120_build.toolkit import Toolkit

from .conftest import write_tree

# The render evaluates each recipe with torch in scope (profiles.specs_of), as the build's
# render does with pins.toml's [render] requirements; tests_fast on the other Pythons installs
# no torch.
needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="the render imports torch"
)
TOOLKIT = Toolkit(Path("/opt/cuda"), (13, 0), "13.0.88", frozenset({"sm_120", "sm_121"}))
ARCHS = [Arch.parse("12.0f")]

# flashinfer/jit/cpp_ext.py's generate_ninja_build_for_op, reduced to the ninja file it
# writes; the flags carry what the child saw, so the test can read its environment back.
CPP_EXT = """\
import os

def generate_ninja_build_for_op(name, sources, cflags, cuda_cflags, ldflags, includes, dlink):
    seen = [f"-DARCHS={os.environ['FLASHINFER_CUDA_ARCH_LIST'].replace(' ', '_')}",
            f"-DTVM={os.environ['TVM_FFI_CUDA_ARCH_LIST'].replace(' ', '_')}",
            f"-DSEED={os.environ.get('PYTHONHASHSEED')}", f"-DCWD={os.getcwd()}",
            f"-DSTRAY={os.environ.get('SCHEDULING_MODE', 'none')}",
            f"-DPATHS={len(os.environ['PYTHONPATH'].split(os.pathsep))}",
            f"-DNAME={name}", *(f"-I{include}" for include in includes)]
    lines = ["cuda_home = " + os.environ["CUDA_HOME"],
             "cflags = -O3 " + " ".join(cflags),
             "cuda_cflags = $common_cflags " + " ".join(seen + cuda_cflags),
             "common_cflags = -I$cuda_home/include",
             "ldflags = -shared " + " ".join(ldflags)]
    for source in sources:
        rule = "cuda_compile" if source.endswith(".cu") else "compile"
        lines.append(f"build {source}.o: {rule} {source}")
    lines.append(f"build {name}.so: {'nvcc_link' if dlink else 'link'} x.o")
    return "\\n".join(lines) + "\\n"
"""
CORE = """\
from dataclasses import dataclass, field

@dataclass
class JitSpec:
    name: str
    sources: list
    extra_cflags: list = field(default_factory=list)
    extra_cuda_cflags: list = field(default_factory=list)
    extra_ldflags: list = field(default_factory=list)
    extra_include_dirs: list = field(default_factory=list)
    needs_device_linking: bool = False
"""
RECIPES = """\
from flashinfer.jit.core import JitSpec

SM120 = ["-gencode=arch=compute_120f,code=sm_120f"]

def gen_norm_module():
    return JitSpec("norm", ["norm.cu", "norm_binding.cpp"], ["-DX"], SM120, ["-lcuda"])

def gen_pair():
    return [gen_norm_module(), gen_rope()]

def gen_linked_module():
    return JitSpec("linked", ["l.cu"], [], SM120, needs_device_linking=True)

def gen_sm90_only():
    return JitSpec("sm90", ["h.cu"], [], ["-gencode=arch=compute_90a,code=sm_90a"])

def gen_rope():
    return JitSpec("rope", ["rope.cu"], [], SM120)

def gen_zeta():  # named after sglang's kernels (sgl_kernel_jit_*)
    return JitSpec("zeta", ["zeta.cu"], [], SM120)

def gen_with_includes():
    return JitSpec("inc", ["i.cu"], [], SM120, extra_include_dirs=["/gen/inc"])

def gen_broken():
    raise RuntimeError("this recipe does not exist in this release")

def gen_silent():
    import os
    os._exit(3)
"""


@pytest.fixture
def sources(tmp_path: Path) -> Path:
    """A FlashInfer tree of the layout the render puts first on the child's PYTHONPATH."""
    tree = tmp_path / "src" / "flashinfer-tree"
    package = tree / "flashinfer"
    (package / "jit").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "jit" / "__init__.py").write_text("")
    (package / "jit" / "core.py").write_text(CORE)
    (package / "jit" / "cpp_ext.py").write_text(CPP_EXT)
    (package / "recipes.py").write_text(RECIPES)
    return tree


@needs_torch
def test_each_recipe_s_modules_come_back_as_flashinfer_would_build_them(
    sources: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SCHEDULING_MODE", "1")  # a generator's own variable, from the shell
    modules = render(
        sources,
        {"norm": "flashinfer.recipes:gen_norm_module()", "pair": "flashinfer.recipes:gen_pair()"},
        ARCHS,
        TOOLKIT,
    )
    seen = [
        "-DARCHS=12.0f",
        "-DTVM=12.0",  # sglang's load_jit: the plain major.minor
        "-DSEED=0",
        f"-DCWD={sources.parent}",
        "-DSTRAY=none",
        "-DPATHS=2",  # the patched FlashInfer and this package; no sglang
    ]
    assert "rendering 2 module recipe(s) with the patched FlashInfer" in capfd.readouterr().err
    sm120 = "-gencode=arch=compute_120f,code=sm_120f"
    norm = Module(
        name="norm",
        recipe="norm",
        cuda_sources=["norm.cu"],
        cxx_sources=["norm_binding.cpp"],
        cuda_flags=["-I/opt/cuda/include", *seen, "-DNAME=norm", sm120],
        cxx_flags=["-O3", "-DX"],
        link_flags=["-shared", "-lcuda"],
        device_link=False,
    )
    rope_flags = ["-I/opt/cuda/include", *seen, "-DNAME=rope", sm120]
    rope = Module("rope", "pair", ["rope.cu"], [], rope_flags, ["-O3"], ["-shared"], False)
    assert modules == [norm, rope]  # by name; norm once, from the first recipe that makes it
    assert (norm.units, rope.units) == (2, 1)
    assert norm.gencodes == [sm120]


@needs_torch
def test_sglang_s_tree_is_on_the_child_s_path_when_its_kernels_are_rendered(
    sources: Path, tmp_path: Path
) -> None:
    (module,) = render(
        sources, {"rope": "flashinfer.recipes:gen_rope()"}, ARCHS, TOOLKIT, tmp_path / "sglang"
    )
    assert "-DPATHS=3" in module.cuda_flags


@needs_torch
def test_a_child_that_dies_saying_nothing_is_refused_as_such(sources: Path) -> None:
    with pytest.raises(UserError) as refused:
        render(sources, {"s": "flashinfer.recipes:gen_silent()"}, ARCHS, TOOLKIT)
    assert (
        str(refused.value) == "FlashInfer could not render the modules for --arch 12.0f: no output"
    )


@needs_torch
def test_a_module_that_needs_device_linking_is_refused_by_name(sources: Path) -> None:
    with pytest.raises(UserError) as refused:
        render(sources, {"l": "flashinfer.recipes:gen_linked_module()"}, ARCHS, TOOLKIT)
    assert str(refused.value) == (
        "linked needs nvcc device linking, which this build does not do yet"
    )


@needs_torch
def test_a_module_flashinfer_builds_for_no_requested_arch_is_refused(sources: Path) -> None:
    with pytest.raises(UserError, match=r"builds sm90 only for .*compute_90a.*--arch 12\.0f"):
        render(sources, {"h": "flashinfer.recipes:gen_sm90_only()"}, ARCHS, TOOLKIT)


@needs_torch
def test_a_recipe_flashinfer_cannot_render_is_refused_with_its_last_words(
    sources: Path,
) -> None:
    with pytest.raises(UserError) as refused:
        render(
            sources,
            {"b": "flashinfer.recipes:gen_broken()"},
            [*ARCHS, Arch.parse("12.1a")],
            TOOLKIT,
        )
    assert str(refused.value) == (
        "FlashInfer could not render the modules for --arch 12.0f 12.1a: "
        "RuntimeError: this recipe does not exist in this release"
    )  # no hint to run nox: the render's requirements are there


def test_the_child_s_environment_is_the_shell_s_few_names_and_what_the_render_sets(
    tmp_path: Path,
) -> None:
    shell = {name: f"shell {name}" for name in RENDER_ENVIRONMENT | {"CUDA_HOME", "OTHER"}}
    sources = tmp_path / "flashinfer"
    sglang = tmp_path / "sglang"
    archs = [Arch.parse("12.0f"), Arch.parse("12.1a"), Arch.parse("12.0a")]
    env = render_environment(shell, sources, archs, TOOLKIT, sglang)
    assert {name: value for name, value in env.items() if name != "PYTHONPATH"} == {
        **{name: f"shell {name}" for name in RENDER_ENVIRONMENT},
        "TVM_FFI_CUDA_ARCH_LIST": "12.0 12.1",
        "TVM_FFI_CACHE_DIR": str(tmp_path / "workspace" / "tvm-ffi"),
        "TVM_FFI_GPU_BACKEND": "cuda",
        "FLASHINFER_CUDA_ARCH_LIST": "12.0f 12.1a 12.0a",
        "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "workspace"),
        "CUDA_HOME": "/opt/cuda",
        "PYTHONHASHSEED": "0",
    }
    # The patched trees first, then this package, wherever it is imported from.
    first, *rest = env["PYTHONPATH"].split(os.pathsep)
    assert first == str(sources) and rest[0] == str(sglang) and len(rest) == 2
    assert Path(rest[1], "sm120_build", "jit_cache", "jit_specs.py").is_file()
    without = render_environment(shell, sources, archs, TOOLKIT)
    assert without["PYTHONPATH"].split(os.pathsep) == [str(sources), rest[1]]


@pytest.fixture
def flashinfer_importable(sources: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The test's FlashInfer importable in this process, as the render child imports it; any
    other flashinfer this process had comes back afterwards."""
    monkeypatch.syspath_prepend(str(sources))
    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", "12.0f")
    monkeypatch.setenv("TVM_FFI_CUDA_ARCH_LIST", "12.0")
    monkeypatch.setenv("CUDA_HOME", "/opt/cuda")
    monkeypatch.setenv("PYTHONPATH", str(sources))
    monkeypatch.chdir(sources.parent)
    for name in [n for n in sys.modules if n == "flashinfer" or n.startswith("flashinfer.")]:
        monkeypatch.delitem(sys.modules, name)
    yield
    for name in [n for n in sys.modules if n == "flashinfer" or n.startswith("flashinfer.")]:
        del sys.modules[name]


@needs_torch
@pytest.mark.usefixtures("flashinfer_importable")
def test_the_child_prints_each_module_once_sorted_by_name(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    request = {
        "recipes": {
            "pair": "flashinfer.recipes:gen_pair()",
            "norm": "flashinfer.recipes:gen_norm_module()",
        }
    }
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(request)))
    jit_specs.main()
    printed = json.loads(capsys.readouterr().out)
    assert [(m["name"], m["recipe"]) for m in printed] == [("norm", "pair"), ("rope", "pair")]
    assert printed[0]["cuda_flags"][-1] == "-gencode=arch=compute_120f,code=sm_120f"
    assert printed[0]["cuda_sources"] == ["norm.cu"] and printed[0]["cxx_sources"] == [
        "norm_binding.cpp"
    ]
    assert printed[0]["device_link"] is False


@needs_torch
@pytest.mark.usefixtures("flashinfer_importable")
def test_one_module_made_two_different_ways_stops_the_child(sources: Path) -> None:
    recipes = sources / "flashinfer" / "recipes.py"
    recipes.write_text(
        recipes.read_text()
        + "\ndef gen_other_norm():\n    return JitSpec('norm', ['other.cu'], [], SM120)\n"
    )
    with pytest.raises(SystemExit) as stopped:
        jit_specs.render(
            {
                "a": "flashinfer.recipes:gen_norm_module()",
                "b": "flashinfer.recipes:gen_other_norm()",
            }
        )
    assert str(stopped.value) == "JIT module norm is made two different ways"


@needs_torch
@pytest.mark.usefixtures("flashinfer_importable")
def test_the_child_sorts_modules_by_name_and_passes_each_spec_whole() -> None:
    modules = jit_specs.render(
        {
            "rope": "flashinfer.recipes:gen_rope()",
            "linked": "flashinfer.recipes:gen_linked_module()",
            "inc": "flashinfer.recipes:gen_with_includes()",
        }
    )
    assert [m["name"] for m in modules] == ["inc", "linked", "rope"]
    assert "-I/gen/inc" in modules[0]["cuda_flags"] and "-DNAME=inc" in modules[0]["cuda_flags"]
    assert modules[1]["device_link"] is True and modules[2]["device_link"] is False


@needs_torch
def test_with_sglang_s_own_environment_each_side_renders_its_own_and_they_merge_by_name(
    sources: Path, tmp_path: Path
) -> None:
    from .test_render_sglang_kernels import FILES, STORE_CALL

    sglang = write_tree(tmp_path / "sglang-tree", FILES)
    recipes = {
        "zeta": "flashinfer.recipes:gen_zeta()",
        "store": STORE_CALL,
        "rope": "flashinfer.recipes:gen_rope()",
    }
    modules = render(sources, recipes, ARCHS, TOOLKIT, sglang, Path(sys.executable))
    assert [(m.name, m.recipe) for m in modules] == [
        ("rope", "rope"),
        ("sgl_kernel_jit_store_64", "store"),
        ("zeta", "zeta"),
    ]
    # FlashInfer's were rendered by this Python without sglang on the path; sglang's by
    # sglang's Python (its loader's plain sm_120 for the GPU).
    assert "-DPATHS=2" in modules[0].cuda_flags
    assert "-gencode=arch=compute_120,code=sm_120" in modules[1].cuda_flags
    # Only sglang's kernels: FlashInfer's render is not run at all.
    elsewhere = tmp_path / "no-flashinfer" / "flashinfer"
    (only,) = render(elsewhere, {"store": STORE_CALL}, ARCHS, TOOLKIT, sglang, Path(sys.executable))
    assert only.name == "sgl_kernel_jit_store_64"
