"""The compile stage end to end, in seconds: a FlashInfer the test writes (modules of one
empty kernel each, made by its own generators) and a sglang 0.5.9-style tree whose loader
calls the real tvm-ffi, rendered, compiled by the real kernel project (scikit-build-core,
CMake, ninja, nvcc), cached, reused, split over shards and planned. The real FlashInfer's
build: tests/test_build_e2e.py."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from sm120_build import pins as pins_module
from sm120_build import sglang_env
from sm120_build.cache import digest
from sm120_build.errors import UserError
from sm120_build.jit_cache import (
    KernelRequest,
    ShardSpec,
    _sglang_python,
    assemble,
    compile_part,
    plan,
)
from sm120_build.jit_cache.arch import Arch
from sm120_build.jit_cache.shards import WHOLE
from sm120_build.layout import Layout
from sm120_build.toolkit import Toolkit, probe
from sm120_build.vendor.state import VendorState, write_state

from .conftest import fresh_root, refusal, write_tree
from .test_render import CORE  # FlashInfer's JitSpec, as the render's tests write it

# The toolkit nvcc-using tools find: CUDA_HOME (the mutation run sets it to the pinned pip
# toolkit), else the system's.
CUDA_HOME = Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.mutation,
    pytest.mark.skipif(not (CUDA_HOME / "bin" / "nvcc").exists(), reason="needs nvcc"),
    pytest.mark.skipif(
        importlib.util.find_spec("torch") is None or importlib.util.find_spec("tvm_ffi") is None,
        reason="the render imports torch, and the kernel project links tvm-ffi",
    ),
]

# flashinfer/jit/cpp_ext.py's generate_ninja_build_for_op, reduced to what it writes for a
# module: the arch flags from FLASHINFER_CUDA_ARCH_LIST, as FlashInfer's own do.
CPP_EXT = """\
import os

def generate_ninja_build_for_op(name, sources, cflags, cuda_cflags, ldflags, includes, dlink):
    archs = os.environ["FLASHINFER_CUDA_ARCH_LIST"].split()
    gencodes = [f"-gencode=arch=compute_{a.replace('.', '')},code=sm_{a.replace('.', '')}"
                for a in archs]
    lines = ["cuda_home = " + os.environ["CUDA_HOME"],
             "cflags = -fPIC -O2 " + " ".join(cflags),
             "cuda_cflags = -O2 -Xcompiler=-fPIC " + " ".join(gencodes + cuda_cflags),
             "ldflags = -shared " + " ".join(ldflags)]
    for source in sources:
        rule = "cuda_compile" if source.endswith(".cu") else "compile"
        lines.append(f"build {source}.o: {rule} {source}")
    lines.append(f"build {name}.so: link x.o")
    return "\\n".join(lines) + "\\n"
"""
# The sources are found under flashinfer/data/, as FlashInfer's JIT finds them.
GENERATORS = """\
from pathlib import Path
from flashinfer.jit.core import JitSpec

CSRC = Path(__file__).parent / "data" / "csrc"

def gen_norm_module():
    return JitSpec("norm", [str(CSRC / "norm.cu")])

def gen_rope_module():
    return JitSpec(
        "rope", [str(CSRC / "rope.cu"), str(CSRC / "rope_host.cpp")], extra_cuda_cflags=["-DROPE=1"]
    )
"""
BUILD_BACKEND = 'def _create_data_dir():\n    ln("csrc", "csrc")\n'
KERNEL = "__global__ void {name}_kernel(float* x) {{ x[threadIdx.x] = {value}; }}\n"

# sglang 0.5.9's jit_kernel/utils.py load_jit, reduced to its call of the real tvm-ffi.
SGLANG_UTILS = """\
import tvm_ffi.cpp

def load_jit(*args):
    name = "sgl_kernel_jit_" + "_".join(str(arg) for arg in args)
    return tvm_ffi.cpp.load_inline(name, cuda_sources="__global__ void store(int* x) { *x = 1; }")
"""
SGLANG_PROBE = """\
from sglang.jit_kernel.utils import load_jit

def module(size):
    return load_jit("probe", size)
"""

ARCHS = [Arch.parse("12.0f")]
FLASHINFER = {
    "norm": "flashinfer.gen:gen_norm_module()",
    "rope": "flashinfer.gen:gen_rope_module()",
}
SGLANG = {"probe": "sglang.jit_kernel.probe:module(2048)"}


def inputs_of(root: Path, label: str) -> str:
    """Vendor inputs of this test's own: builds of the same inputs take turns
    (sources.at_fixed_path), so tests run at once (mutmut's workers) must not share them."""
    return hashlib.sha256(f"{root} {label}".encode()).hexdigest()


def committed(tree: Path, files: dict[str, str], inputs: str) -> None:
    """A vendor tree as `nox -s vendor` leaves it: committed, its state complete."""
    write_tree(tree, files)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tree)]
    if not (tree / ".git").exists():
        subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "vendor"], check=True)
    write_state(tree, VendorState(inputs, "base", "head", complete=True, exact=True))


def flashinfer_files(value: str = "1.0f") -> dict[str, str]:
    return {
        "build_backend.py": BUILD_BACKEND,
        # The texts the wheel ships (cmake.LICENSE_TEXTS).
        "LICENSE": "Apache-2.0\n",
        "3rdparty/spdlog/include/spdlog/fmt/bundled/fmt.license.rst": "MIT\n",
        "flashinfer/__init__.py": "",
        "flashinfer/jit/__init__.py": "",
        "flashinfer/jit/core.py": CORE,
        "flashinfer/jit/cpp_ext.py": CPP_EXT,
        "flashinfer/gen.py": GENERATORS,
        "csrc/norm.cu": KERNEL.format(name="norm", value=value),
        "csrc/rope.cu": KERNEL.format(name="rope", value="2.0f"),
        # __FILE__ is kept in the binary: the build's prefix maps name it portably.
        "csrc/rope_host.cpp": "const char* rope_host() { return __FILE__; }\n",
    }


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    root = fresh_root(tmp_path)
    result = Layout(root=root, cache=root / ".cache")
    committed(result.vendor / "flashinfer", flashinfer_files(), inputs_of(root, "a"))
    committed(
        result.vendor / "sglang",
        {
            "sglang/jit_kernel/utils.py": SGLANG_UTILS,
            "sglang/jit_kernel/probe.py": SGLANG_PROBE,
        },
        inputs_of(root, "c"),
    )
    return result


@pytest.fixture
def pins(layout: Layout) -> pins_module.Pins:
    return pins_module.load(layout.pins_file)


@pytest.fixture(scope="module")
def cuda() -> Toolkit:
    return probe(CUDA_HOME)


def shared_objects(wheel: Path) -> dict[str, str]:
    """module name -> sha256 of its .so in a jit-cache wheel."""
    with zipfile.ZipFile(wheel) as archive:
        return {
            Path(name).stem: hashlib.sha256(archive.read(name)).hexdigest()
            for name in archive.namelist()
            if name.endswith(".so")
        }


def test_an_unknown_recipe_is_refused_before_anything_compiles(
    layout: Layout, pins: pins_module.Pins, cuda: Toolkit
) -> None:
    request = KernelRequest({"gone": "flashinfer.gen:gen_gone_module()"}, ARCHS)
    with pytest.raises(UserError, match="gen_gone_module"):
        compile_part(layout, pins, request, cuda, "t", WHOLE)
    assert not layout.built_modules.exists()


def test_sglang_s_own_environment_is_made_only_for_its_kernels_package(
    layout: Layout, pins: pins_module.Pins
) -> None:
    # 0.5.9's layout (sglang/jit_kernel/): rendered in this environment.
    assert _sglang_python(layout, pins) is None
    # 0.5.11's (sglang/kernels/jit/): in sglang's own environment, here one made before.
    (layout.vendor / "sglang" / "sglang" / "kernels" / "jit").mkdir(parents=True)
    sglang = pins.upstream("sglang")
    _, version = sglang_env.interpreter(pins)
    entry = layout.cache / "derive-env" / digest("derive", sglang.version, version)[:16]
    entry.mkdir(parents=True)
    (entry / "complete").write_text("")
    assert _sglang_python(layout, pins) == entry / "venv" / "bin" / "python"


def test_the_plan_renders_the_modules_and_prints_their_split(
    layout: Layout, pins: pins_module.Pins, cuda: Toolkit, capsys: pytest.CaptureFixture[str]
) -> None:
    request = KernelRequest({**FLASHINFER, **SGLANG}, ARCHS)
    split = plan(layout, pins, request, cuda, 2)
    assert sorted(name for share in split for name in share) == [
        "norm",
        "rope",
        "sgl_kernel_jit_probe_2048",
    ]
    assert len(split) == 2 and all(split)
    rows = capsys.readouterr().out.splitlines()
    # A row per shard, under the table's head, with its share's module count.
    assert rows[0].split()[:2] == ["shard", "modules"]
    assert [row.split()[:2] for row in rows[1:]] == [
        ["1", str(len(split[0]))],
        ["2", str(len(split[1]))],
    ]
    # Planning compiles nothing and caches nothing.
    assert not layout.built_modules.exists()


def test_a_kernel_that_does_not_compile_stops_the_build_with_nvcc_s_words(
    layout: Layout, pins: pins_module.Pins, cuda: Toolkit
) -> None:
    files = flashinfer_files()
    files["csrc/norm.cu"] = "__global__ void norm_kernel() { undeclared_name; }\n"
    committed(layout.vendor / "flashinfer", files, inputs_of(layout.root, "d"))
    request = KernelRequest(FLASHINFER, ARCHS)
    message = refusal(lambda: compile_part(layout, pins, request, cuda, "t", WHOLE))
    head, tail = message.split("\n", 1)
    assert head == "the jit-cache build failed; the end of its output:"
    tail, advice = tail.rsplit("\n\n", 1)
    assert advice == "(--verbose shows all of it as it runs.) Nothing was added to wheelhouse/."
    # The end of the log (at most 60 lines), each line whole.
    lines = tail.split("\n")
    assert 1 < len(lines) <= 60, tail
    assert any(line.endswith('error: identifier "undeclared_name" is undefined') for line in lines)
    # Nothing is cached from a failed build: not the part, not a module.
    assert not list((layout.cache / "artifacts" / "jit-cache").glob("*/record.json"))
    assert not layout.built_modules.exists() or not list(layout.built_modules.iterdir())


def test_a_compiler_s_words_that_are_not_utf_8_are_shown_with_the_bytes_replaced(
    layout: Layout, pins: pins_module.Pins, cuda: Toolkit
) -> None:
    # gcc quotes the line it complains of as its bytes are: here Latin-1.
    tree = layout.vendor / "flashinfer"
    (tree / "csrc/rope_host.cpp").write_bytes(
        b'const char* rope_host() { undeclared_name; return "caf\xe9"; }\n'
    )
    committed(tree, {}, inputs_of(layout.root, "e"))
    request = KernelRequest({"rope": FLASHINFER["rope"]}, ARCHS)
    message = refusal(lambda: compile_part(layout, pins, request, cuda, "t", WHOLE))
    assert "error: \u2018undeclared_name\u2019 was not declared" in message or (
        "error: 'undeclared_name' was not declared" in message
    )
    assert '{ undeclared_name; return "caf\ufffd' in message


def test_a_part_is_compiled_recorded_cached_and_reused(
    layout: Layout, pins: pins_module.Pins, cuda: Toolkit, capsys: pytest.CaptureFixture[str]
) -> None:
    # Python's bytecode of the kernel project's package (a checkout that imported it) is not
    # the wheel's.
    stale = layout.kernel_project / "flashinfer_jit_cache" / "__pycache__" / "stale.pyc"
    stale.parent.mkdir(exist_ok=True)
    stale.write_bytes(b"stale")
    request = KernelRequest({**FLASHINFER, **SGLANG}, ARCHS)
    part = compile_part(layout, pins, request, cuda, "test toolkit", WHOLE)
    built = shared_objects(part.wheel)
    assert sorted(built) == ["norm", "rope", "sgl_kernel_jit_probe_2048"]
    with zipfile.ZipFile(part.wheel) as archive:
        assert "flashinfer_jit_cache/jit_cache/norm/norm.so" in archive.namelist()
        assert not [name for name in archive.namelist() if "__pycache__" in name]
        rope = archive.read("flashinfer_jit_cache/jit_cache/rope/rope.so")
    # The source path in the binary is the portable name, not where this build exported it.
    assert b"\0flashinfer/flashinfer/data/csrc/rope_host.cpp\0" in rope
    assert b"/tmp/sm120-build-" not in rope
    record = part.record
    assert record["modules"] == {
        "norm": "norm",
        "rope": "rope",
        "sgl_kernel_jit_probe_2048": "probe",
    }
    assert (record["index"], record["count"], record["archs"]) == (1, 1, ["12.0f"])
    assert record["toolkit"] == {"cuda": cuda.full_version, "source": "test toolkit"}
    assert record["plan"] == [sorted(built)]
    commands = record["compile_commands"]
    assert isinstance(commands, list) and len(commands) == 4
    # CUDA compiled by the toolkit the build was given (CMake told so), not by whichever nvcc
    # PATH finds.
    cuda_compilers = [c[0] for c in commands if c[c.index("-c") + 1].endswith(".cu")]
    assert cuda_compilers == ["$CUDA_HOME/bin/nvcc"] * 3
    words = " ".join(" ".join(command) for command in commands)
    # The sources are named by what they are, not where this build exported them.
    assert "-c $FLASHINFER/flashinfer/data/csrc/norm.cu" in words and "-DROPE=1" in words
    assert "/tmp/sm120-build-" not in words
    assert "-gencode=arch=compute_120f,code=sm_120f" in words
    # sglang's loader builds plain sm_XY for the GPU's major.minor.
    assert "-gencode=arch=compute_120,code=sm_120 " in words
    assert len(list(layout.built_modules.iterdir())) == 3
    out = capsys.readouterr().err
    assert "compiling 3 module(s), 4 translation units, for sm_120f" in out
    # ninja's progress is shown as it compiles (the rest of the build's output is not).
    assert re.search(r"^\s*\[\d+/\d+\] ", out, re.M), out
    assert "-- Configuring done" not in out
    # Every unit was compiled through sccache (nvcc's through its CUDA launcher, at least
    # one step each), the cache's own, which had none of them yet.
    first = re.search(r"sccache: 0 hits, (\d+) misses", out)
    assert first and int(first[1]) >= 4, out

    # The same inputs: the part's own cache entry, the same wheel.
    again = compile_part(layout, pins, request, cuda, "test toolkit", WHOLE)
    # Named as one machine's build: no shard in the name.
    reused = f"flashinfer-jit-cache {record['version']}: reusing the cached build\n"
    assert reused in capsys.readouterr().err
    assert again.wheel.read_bytes() == part.wheel.read_bytes()
    assert again.record == record
    # The seconds each module took, for `nox -s bench`, kept beside the part.
    (seconds,) = (layout.cache / "artifacts" / "jit-cache").glob("*/compile_seconds.json")
    assert sorted(json.loads(seconds.read_text())) == sorted(built)
    # The shards' cost table splits a sharded build only: one machine's is the same part.
    layout.costs_file.write_text(json.dumps({"modules": {"norm": 99.0}, "per_unit": {}}))
    compile_part(layout, pins, request, cuda, "test toolkit", WHOLE)
    assert reused in capsys.readouterr().err

    # Fewer recipes key another part, whose modules come from the module cache: nothing
    # compiles, and they are the same bytes.
    fewer = KernelRequest(FLASHINFER, ARCHS)
    other = compile_part(layout, pins, fewer, cuda, "test toolkit", WHOLE)
    out = capsys.readouterr().err
    assert "2 of 2 module(s) built before from the same inputs" in out
    assert "making the jit-cache package (no module to compile)" in out
    assert "sccache:" not in out  # nothing to compile, no server started
    assert shared_objects(other.wheel) == {name: built[name] for name in ("norm", "rope")}
    assert other.record["modules"] == {"norm": "norm", "rope": "rope"}
    assert other.record["compile_commands"] == commands[:3]  # norm.cu, rope.cu, rope_host.cpp

    # Another toolkit source is another compiler's output: compiled again, every unit of it
    # (C++ and CUDA) through sccache, which has them all.
    compile_part(layout, pins, request, cuda, "another source", WHOLE)
    out = capsys.readouterr().err
    assert "compiling 3 module(s)" in out
    rebuilt = re.search(r"sccache: (\d+) hits, 0 misses", out)
    assert rebuilt and int(rebuilt[1]) == int(first[1]), out


def test_a_changed_kernel_is_compiled_again(
    layout: Layout, pins: pins_module.Pins, cuda: Toolkit, capsys: pytest.CaptureFixture[str]
) -> None:
    request = KernelRequest(FLASHINFER, ARCHS)
    first = shared_objects(compile_part(layout, pins, request, cuda, "t", WHOLE).wheel)
    committed(layout.vendor / "flashinfer", flashinfer_files("3.0f"), inputs_of(layout.root, "b"))
    capsys.readouterr()
    second = shared_objects(compile_part(layout, pins, request, cuda, "t", WHOLE).wheel)
    out = capsys.readouterr().err
    # The vendor inputs key every module (they are the patched tree): both compile again,
    # and the changed kernel's bytes differ.
    assert "compiling 2 module(s)" in out
    assert second["norm"] != first["norm"]


def test_a_changed_sglang_kernel_is_compiled_again(
    layout: Layout, pins: pins_module.Pins, cuda: Toolkit, capsys: pytest.CaptureFixture[str]
) -> None:
    """sglang's kernels are keyed by sglang's vendor inputs too: its loader's source is in
    the patched sglang, not in FlashInfer's tree."""
    request = KernelRequest(SGLANG, ARCHS)
    first = shared_objects(compile_part(layout, pins, request, cuda, "t", WHOLE).wheel)
    committed(
        layout.vendor / "sglang",
        {"sglang/jit_kernel/utils.py": SGLANG_UTILS.replace("*x = 1", "*x = 2")},
        inputs_of(layout.root, "f"),
    )
    capsys.readouterr()
    second = shared_objects(compile_part(layout, pins, request, cuda, "t", WHOLE).wheel)
    assert "compiling 1 module(s)" in capsys.readouterr().err
    name = "sgl_kernel_jit_probe_2048"
    assert second[name] != first[name]


def test_shards_give_the_whole_build_s_bytes(
    tmp_path: Path, layout: Layout, pins: pins_module.Pins, cuda: Toolkit
) -> None:
    request = KernelRequest(FLASHINFER, ARCHS)
    parts = [
        compile_part(layout, pins, request, cuda, "t", ShardSpec(index, 2)) for index in (1, 2)
    ]
    assert [sorted(part.record["modules"]) for part in parts] in (
        [["norm"], ["rope"]],
        [["rope"], ["norm"]],
    )
    assert parts[0].record["plan"] == parts[1].record["plan"]
    whole_dir, sharded_dir = tmp_path / "whole", tmp_path / "sharded"
    whole_dir.mkdir()
    sharded_dir.mkdir()
    sharded = assemble(layout, pins, parts, None, sharded_dir)
    shutil.rmtree(layout.built_modules)
    whole = assemble(
        layout, pins, [compile_part(layout, pins, request, cuda, "t", WHOLE)], None, whole_dir
    )
    assert shared_objects(sharded) == shared_objects(whole)
    assert sharded.read_bytes() == whole.read_bytes()
