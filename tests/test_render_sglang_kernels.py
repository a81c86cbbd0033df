"""The render of sglang 0.5.11+'s kernels (sglang/kernels/), against a small sglang the test
writes with the loader's shape (kernels/jit/utils/compile/: loader.load_jit -> ninja.generate
-> ninja.build -> cache.commit_build -> loader._load, the target from kernels/jit/utils/
arch.py): the child (sglang_specs.py) run in process and as the build runs it, and the
build's side (render.render_sglang_kernels) with this Python standing in for sglang's
environment. The render against the real sglang 0.5.23: docs/stacks.md."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sm120_build.errors import UserError
from sm120_build.jit_cache import sglang_specs
from sm120_build.jit_cache.arch import Arch
from sm120_build.jit_cache.render import Module, render_sglang_kernels
from sm120_build.toolkit import Toolkit

from .conftest import sglang_modules_forgotten, write_tree

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("tvm_ffi") is None,
    reason="sglang's loader asks torch for the GPU; the build reads tvm-ffi's paths",
)

ARCH = """\
_CUDA_ARCH = None

def make_jit_cuda_arch(major, minor):
    return f"sm{major}{minor}"

def _init_jit_cuda_arch_once():
    raise RuntimeError("no GPU to ask")

def target():
    _init_jit_cuda_arch_once()
    return _CUDA_ARCH
"""
NINJA = """\
import os
import sysconfig

def generate(spec, target):
    purelib = sysconfig.get_paths()["purelib"]
    number = target[2:]
    flags = (f"-gencode=arch=compute_{number},code=sm_{number} -DNAME={spec.module_name} "
             f"-I{purelib}/flashinfer/data/cutlass/include {spec.flags}")
    # What the loader saw of its environment, carried in the host flags for the test to read.
    seen = " ".join(f"-D{name}={os.environ.get(name, 'unset')}" for name in
                    ("SGLANG_JIT_CACHE_DIR", "CUDA_HOME", "PYTHONHASHSEED", "SM120_STRAY"))
    return "\\n".join([
        f"cudaflags = {flags}",
        f"cxxflags = -fPIC -O3 {seen} -DCWD={os.getcwd()}",
        "ldflags = -shared -ltvm_ffi",
        *(f"build {unit.filename}.o: compile_cuda {unit.filename}"
          for unit in spec.translation_units()),
        "",
    ])

def build(*, spec, build_dir, build_file):
    raise RuntimeError("would compile")
"""
CACHE = 'def commit_build(*args, **kwargs):\n    raise RuntimeError("would commit")\n'
LOADER = """\
from dataclasses import dataclass

from sglang.kernels.jit.utils import arch
from sglang.kernels.jit.utils.compile import cache, ninja

@dataclass
class Unit:
    filename: str
    source: str

@dataclass
class Spec:
    module_name: str
    units: list
    flags: str

    def translation_units(self):
        return self.units

def _prebuilt_module(module_name):  # patch 0002's lookup
    raise RuntimeError("would look for a prebuilt module")

def _find_prebuilt(**kwargs):
    raise RuntimeError("would look in the cache")

def _load(library):
    raise RuntimeError("would load")

_LOADED = {}

def load_jit(*markers, sources=("__global__ void k() {}",), flags=""):
    name = "sgl_kernel_jit_" + "_".join(str(marker) for marker in markers)
    if name not in _LOADED:
        _prebuilt_module(name)
        _find_prebuilt(name=name)
        units = [Unit(f"unit_{i}.cu", text) for i, text in enumerate(sources)]
        spec = Spec(name, units, flags)
        library = ninja.build(
            spec=spec, build_dir="/nowhere", build_file=ninja.generate(spec, arch.target())
        )
        cache.commit_build(library)
        _LOADED[name] = _load(library)
    return _LOADED[name]
"""
STORE = """\
from sglang.kernels.jit.utils.compile.loader import load_jit

def _jit_store_module(size):
    return load_jit("store", size)

def _jit_pair_module(size):
    load_jit("store", size)
    return load_jit("gather", size, sources=("// a\\n", "// b\\n"))

def _jit_nothing_module():
    return "a module from elsewhere"

def _jit_other_store_module(size):  # the same module with another source, uncached
    from sglang.kernels.jit.utils.compile import loader
    loader._LOADED.clear()
    return load_jit("store", size, flags="-DOTHER")
"""
FILES = {
    "sglang/__init__.py": "",
    "sglang/kernels/__init__.py": "",
    "sglang/kernels/jit/__init__.py": "",
    "sglang/kernels/jit/utils/__init__.py": "",
    "sglang/kernels/jit/utils/arch.py": ARCH,
    "sglang/kernels/jit/utils/compile/__init__.py": "from . import cache, loader, ninja\n",
    "sglang/kernels/jit/utils/compile/cache.py": CACHE,
    "sglang/kernels/jit/utils/compile/ninja.py": NINJA,
    "sglang/kernels/jit/utils/compile/loader.py": LOADER,
    "sglang/kernels/ops/__init__.py": "",
    "sglang/kernels/ops/store.py": STORE,
}
STORE_CALL = "sglang.kernels.ops.store:_jit_store_module(64)"
PAIR_CALL = "sglang.kernels.ops.store:_jit_pair_module(64)"


@pytest.fixture
def sglang_tree(tmp_path: Path) -> Path:
    return write_tree(tmp_path / "sglang-tree", FILES)


@pytest.fixture
def in_process(sglang_tree: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The generated sglang importable here, and forgotten afterwards with every module of
    it the render imported (and patched)."""
    monkeypatch.syspath_prepend(str(sglang_tree))
    with sglang_modules_forgotten():
        yield sglang_tree


def test_each_recipe_s_modules_are_rendered_once_with_the_target_of_its_arch(
    in_process: Path, tmp_path: Path
) -> None:
    workspace = tmp_path / "workspace"
    modules = sglang_specs.render(
        {"store": STORE_CALL, "pair": PAIR_CALL, "again": STORE_CALL}, "12.0f", workspace
    )
    assert [(m["name"], m["recipe"]) for m in modules] == [
        ("sgl_kernel_jit_gather_64", "pair"),
        ("sgl_kernel_jit_store_64", "store"),
    ]
    gather, store = modules
    directory = workspace / "sglang" / "sgl_kernel_jit_gather_64"
    assert gather["cuda_sources"] == [f"{directory}/unit_0.cu", f"{directory}/unit_1.cu"]
    assert (directory / "unit_1.cu").read_text() == "// b\n"
    assert (directory / "build.ninja").is_file()
    # The loader's target is the GPU of --arch, its suffix dropped (sglang builds plain sm_XY).
    assert store["cuda_flags"][:2] == [
        "-gencode=arch=compute_120,code=sm_120",
        "-DNAME=sgl_kernel_jit_store_64",
    ]
    assert store["cxx_flags"][:2] == ["-fPIC", "-O3"]
    assert store["link_flags"] == ["-shared", "-ltvm_ffi"]
    assert store["cxx_sources"] == [] and store["device_link"] is False


def test_one_module_made_two_different_ways_is_refused(in_process: Path, tmp_path: Path) -> None:
    other = "sglang.kernels.ops.store:_jit_other_store_module(64)"
    with pytest.raises(SystemExit, match=r"^JIT module sgl_kernel_jit_store_64 is made two"):
        sglang_specs.render({"a": STORE_CALL, "b": other}, "12.0", tmp_path)


def test_a_loader_that_writes_nothing_and_an_arch_that_is_none_are_refused(
    in_process: Path, tmp_path: Path
) -> None:
    nothing = "sglang.kernels.ops.store:_jit_nothing_module()"
    with pytest.raises(SystemExit, match=r"_jit_nothing_module\(\): sglang's loader wrote no"):
        sglang_specs.render({"n": nothing}, "12.0", tmp_path)
    with pytest.raises(SystemExit, match=r"^--arch sm_120: not an arch sglang's loader can"):
        sglang_specs.render({"s": STORE_CALL}, "sm_120", tmp_path)


def test_the_child_answers_with_the_modules_its_tvm_ffi_and_its_packages(
    in_process: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tvm_ffi import libinfo

    request = {"recipes": {"store": STORE_CALL}, "arch": "9.0a", "workspace": str(tmp_path)}
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(request)))
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    sglang_specs.main()
    answer = json.loads(out.getvalue())
    (module,) = answer["modules"]
    assert module["cuda_flags"][0] == "-gencode=arch=compute_90,code=sm_90"
    assert answer["tvm_ffi"]["include"] == libinfo.find_include_path()
    assert answer["tvm_ffi"]["dlpack"] == libinfo.find_dlpack_include_path()
    assert answer["tvm_ffi"]["lib_dir"] == str(Path(libinfo.find_libtvm_ffi()).parent)
    assert Path(answer["purelib"], "tvm_ffi").is_dir()


TOOLKIT = Toolkit(Path("/opt/cuda"), (13, 0), "13.0.88", frozenset({"sm_120"}))


def test_the_build_renders_them_with_sglang_s_python_and_its_own_paths(
    sglang_tree: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sources = tmp_path / "export" / "flashinfer"
    sources.mkdir(parents=True)
    monkeypatch.setenv("SM120_STRAY", "from the shell")  # not in RENDER_ENVIRONMENT

    def render() -> list[Module]:
        return render_sglang_kernels(
            Path(sys.executable),
            sglang_tree,
            {"pair": PAIR_CALL},
            [Arch.parse("12.0f")],
            TOOLKIT,
            sources,
        )

    modules = render()
    workspace = tmp_path / "export" / "workspace"
    assert "rendering 1 sglang kernel recipe(s) with the patched sglang" in capsys.readouterr().err
    # The loader saw its own cache under the workspace, the build's toolkit, a fixed hash
    # seed, none of the shell's other variables, and sglang's tree's directory as its own.
    assert modules[0].cxx_flags[2:] == [
        f"-DSGLANG_JIT_CACHE_DIR={workspace / 'sglang-jit-cache'}",
        "-DCUDA_HOME=/opt/cuda",
        "-DPYTHONHASHSEED=0",
        "-DSM120_STRAY=unset",
        f"-DCWD={sglang_tree.parent}",
    ]
    # A second render in the same workspace (its package link made already) gives the same.
    assert render() == modules
    assert [module.name for module in modules] == [
        "sgl_kernel_jit_gather_64",
        "sgl_kernel_jit_store_64",
    ]
    for module in modules:
        assert module.recipe == "pair"
        # sglang's environment's FlashInfer (CUTLASS) is the exported patched one.
        assert f"-I{sources}/flashinfer/data/cutlass/include" in module.cuda_flags
        assert all(
            Path(source).is_relative_to(tmp_path / "export" / "workspace" / "sglang")
            for source in module.cuda_sources
        )
    # The child sees only its package, not this Python's other packages.
    package = tmp_path / "export" / "workspace" / "sm120-build-package"
    assert [p.name for p in package.iterdir()] == ["sm120_build"]


def test_the_build_refuses_more_than_one_arch_and_names_a_failed_render(
    sglang_tree: Path, tmp_path: Path
) -> None:
    sources = tmp_path / "export" / "flashinfer"
    sources.mkdir(parents=True)
    two = [Arch.parse("12.0f"), Arch.parse("9.0a")]
    with pytest.raises(UserError, match=r"built for one target each.*12\.0f 9\.0a"):
        render_sglang_kernels(Path(sys.executable), sglang_tree, {}, two, TOOLKIT, sources)
    nothing = {"n": "sglang.kernels.ops.store:_jit_nothing_module()"}
    with pytest.raises(UserError) as refused:
        render_sglang_kernels(
            Path(sys.executable), sglang_tree, nothing, [Arch.parse("12.0f")], TOOLKIT, sources
        )
    assert str(refused.value) == (
        "sglang could not render its kernels for --arch 12.0f: "
        "sglang.kernels.ops.store:_jit_nothing_module(): sglang's loader wrote no module to compile"
    )


def test_a_tvm_ffi_release_other_than_the_build_s_is_refused_with_the_pin_to_set(
    sglang_tree: Path, tmp_path: Path
) -> None:
    # sglang's environment reports another apache-tvm-ffi release (a distribution's metadata
    # first on its path); its headers would not be the ones the node loads kernels with.
    info = sglang_tree / "apache_tvm_ffi-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: apache-tvm-ffi\nVersion: 0.0.1\n")
    sources = tmp_path / "export" / "flashinfer"
    sources.mkdir(parents=True)
    with pytest.raises(UserError) as refused:
        render_sglang_kernels(
            Path(sys.executable),
            sglang_tree,
            {"s": STORE_CALL},
            [Arch.parse("12.0f")],
            TOOLKIT,
            sources,
        )
    mine = importlib.metadata.version("apache-tvm-ffi")
    assert str(refused.value) == (
        f"sglang's environment has apache-tvm-ffi 0.0.1, the build {mine}: sglang's kernels "
        "would be compiled against other headers than the node loads them with. Pin "
        "apache-tvm-ffi==0.0.1 in pins.toml's [build] requirements."
    )
