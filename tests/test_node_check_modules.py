"""The node check's verdicts on each module, in this process: FlashInfer's (loaded prebuilt,
would JIT-compile, does not load, not made for this GPU, a missing Python package) and
sglang's own kernels (loaded with JIT off, nvcc hidden and an empty tvm-ffi cache).

FlashInfer and sglang here are small generated packages that offer the one interface the
check calls: FlashInfer's `flashinfer.jit.core.JitSpec` (name, is_aot, build_and_load) and
an sglang kernel module's loader. The real ones are checked by the slow node tests.
"""

from __future__ import annotations

import os
import re
import sys
import textwrap
from pathlib import Path

import pytest

from .test_node_check import node, run, site, write_tree

__all__ = ["site"]  # the fixture, used by name

# The check reports torch's CUDA and, without --arch, asks torch for the GPU.
pytest.importorskip("torch", reason="the node check needs torch (nox -s tests installs it)")


# The stand-in for FlashInfer's JitSpec: the attributes and the method the check uses.
JIT_CORE = """
import logging
import time

# FlashInfer 0.7's JIT logger is a logger of its own, not one logging.getLogger gives.
logger = logging.Logger("flashinfer.jit")

class JitSpec:
    def __init__(self, name, is_aot=True, error=None, seconds=0.0, warning=None):
        self.name, self.is_aot, self.error, self.seconds = name, is_aot, error, seconds
        self.warning = warning

    def build_and_load(self):
        time.sleep(self.seconds)
        if self.warning:
            logger.warning(self.warning)
        if self.error:
            raise RuntimeError(self.error)
        return object()
"""
GENERATORS = """
from flashinfer.jit.core import JitSpec

def gen_module(*names):
    return [JitSpec(name) for name in names]

def only_sm12x():
    raise RuntimeError("SM12x only")

def needs_cutlass():
    import cutlass_dsl_missing
"""
# sglang's loader (jit_kernel/utils.py) and a kernel module whose loader shows what it saw.
SGLANG_UTILS = """
def is_arch_support_pdl():
    raise AssertionError("the check answers this from the GPU it checks for")
"""
SGLANG_PROBE = """
import os
from pathlib import Path

from sglang.jit_kernel import utils

seen = []

def load(compile=False):
    seen.append({
        "SGLANG_DISABLE_JIT": os.environ.get("SGLANG_DISABLE_JIT"),
        "TVM_FFI_CACHE_DIR": os.environ.get("TVM_FFI_CACHE_DIR"),
        "PATH": os.environ["PATH"],
        "pdl": utils.is_arch_support_pdl(),
    })
    if compile:
        for name in ("sgl_kernel_jit_probe", "sgl_kernel_jit_probe_2"):
            Path(os.environ["TVM_FFI_CACHE_DIR"], name).mkdir()
    return object()

def nothing():
    return None

def broken():
    raise RuntimeError("nvcc is not on PATH")
"""


def test_every_flashinfer_module_is_loaded_and_each_failure_named(
    site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_tree(
        site,
        {
            "flashinfer/__init__.py": "",
            "flashinfer/jit/__init__.py": "",
            "flashinfer/jit/core.py": JIT_CORE,
            "flashinfer/generators.py": GENERATORS,
        },
    )
    recipes = {
        # Two recipes that make the same module: it is loaded once, for the first.
        "pair": "flashinfer.generators:gen_module('a', 'b')",
        "again": "flashinfer.generators:gen_module('b', 'c')",
        "slow": "flashinfer.generators:[JitSpec('slow', seconds=0.05)]",
        "not_built": "flashinfer.generators:JitSpec('not_built', is_aot=False)",
        "broken": "flashinfer.generators:JitSpec('broken', error='undefined symbol: x')",
        # A module that links the driver, checked for --arch where there is no driver:
        # FlashInfer 0.7 says why in a warning, then fails for want of JIT.
        "driver": "flashinfer.generators:JitSpec('driver', error='JIT compilation is "
        "disabled', warning='Failed to load AOT artifact /x/driver.so: libcuda.so.1: cannot "
        "open shared object file')",
        "unloadable": "flashinfer.generators:JitSpec('unloadable', error='JIT compilation is "
        "disabled', warning='Failed to load AOT artifact /x/unloadable.so: undefined symbol: "
        "y. Trying another provider or falling back to JIT build.')",
        "sm12x": "flashinfer.generators:only_sm12x()",
        "cutlass": "flashinfer.generators:needs_cutlass()",
        "more": "flashinfer.generators:gen_module('d', 'e', 'f')",
    }
    node(site, recipes)
    status, output, report = run(tmp_path, capsys, "--arch", "12.0")
    assert status == 1
    assert report["problems"] == [
        "not_built (not_built) would be JIT-compiled: no prebuilt .so",
        "broken (broken) does not load: undefined symbol: x",
        "unloadable (unloadable) does not load: Failed to load AOT artifact /x/unloadable.so: "
        "undefined symbol: y. Trying another provider or falling back to JIT build.",
        "sm12x: FlashInfer does not make it for this GPU (SM12x only)",
        "cutlass: the Python package 'cutlass_dsl_missing' is not installed here, which "
        "FlashInfer needs for it: install it (pip install cutlass_dsl_missing), or the whole "
        "environment the pinned sglang needs",
    ]
    modules = {(m["module"], m["recipe"]): m for m in report["modules"]}
    assert list(modules) == [
        ("a", "pair"),
        ("b", "pair"),
        ("c", "again"),
        ("slow", "slow"),
        ("not_built", "not_built"),
        ("broken", "broken"),
        ("driver", "driver"),
        ("unloadable", "unloadable"),
        (None, "sm12x"),
        (None, "cutlass"),
        ("d", "more"),
        ("e", "more"),
        ("f", "more"),
    ]
    loaded = [name for (name, _), m in modules.items() if m["loaded"]]
    assert loaded == ["a", "b", "c", "slow", "d", "e", "f"]
    assert all(
        m["aot"] == (m["module"] in [*loaded, "broken", "driver", "unloadable"])
        for m in report["modules"]
    )
    assert [m["module"] for m in report["modules"] if m.get("needs_driver")] == ["driver"]
    # A load is timed, failed or not; a module that was never loaded has no time.
    timed = [name for (name, _), m in modules.items() if "load_seconds" in m]
    assert timed == [*loaded[:4], "broken", "driver", "unloadable", *loaded[4:]]
    assert modules["slow", "slow"]["load_seconds"] >= 0.05
    assert report["jit_compiles"] == 1  # not_built; the two recipes without a module do not count
    summary = next(line for line in output.splitlines() if "modules of" in line)
    assert summary.startswith(
        "  7 of 13 modules of 10 recipes loaded prebuilt, 6 did not (1 would JIT-compile); "
    )
    assert (
        "  driver: prebuilt, and FlashInfer takes it; not loaded here, for it links the NVIDIA "
        "driver (libcuda.so.1), which this machine has not"
    ) in output.splitlines()
    total, slowest = summary.split("JIT-compile); ")[1].split(" s; slowest: ")
    assert 0.05 <= float(total) < 60
    assert re.fullmatch(r"slow 0\.\d{3} s(, [a-f] 0\.\d{3} s){4}", slowest)
    for problem in report["problems"]:
        assert f"  FAIL {problem}" in output.splitlines()


def test_a_profile_is_read_from_what_the_jit_cache_records(
    site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--profile NAME takes the recipes of that profile as the installed jit-cache records
    them; a profiles.toml in the working directory is never read (it used to be, and its
    recipes evaluated: code run by whoever could write there)."""
    marker = tmp_path / "planted-recipe-ran"
    (tmp_path / "profiles.toml").write_text(
        textwrap.dedent(
            f"""
            [modules.planted]
            call = "os:system('touch {marker}')"
            [profiles.comm]
            modules = ["planted"]
            [profiles.wide]
            modules = ["planted"]
            """
        )
    )
    comm = {"trtllm_comm": "flashinfer.comm:gen_trtllm_comm_module()"}
    wide = {**comm, "elsewhere": "flashinfer.elsewhere:gen()"}
    node(site, comm, profiles={"comm": comm, "wide": wide})
    status, output, report = run(tmp_path, capsys, "--arch", "12.0", "--profile", "wide")
    assert status == 1
    # No FlashInfer here at all: each recipe says so.
    assert [m["recipe"] for m in report["modules"]] == ["trtllm_comm", "elsewhere"]
    assert all("'flashinfer' is not installed here" in p for p in report["problems"])
    assert len(report["problems"]) == 2
    assert "0 of 2 modules of 2 recipes" in output
    (tmp_path / "report.json").unlink()
    status, output, report = run(tmp_path, capsys, "--arch", "12.0", "--profile", "served")
    assert status == 1 and report is None
    assert output == (
        "error: --profile served: the installed flashinfer-jit-cache records no such profile "
        "(it records: comm, wide)\n"
    )
    assert not marker.exists()


def test_sglangs_kernels_load_with_jit_off_nvcc_hidden_and_an_empty_cache(
    site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    write_tree(
        site,
        {
            "sglang/__init__.py": "raise AssertionError('the check does not import sglang')",
            "sglang/srt/utils/__init__.py": "raise AssertionError('nor the server utilities')",
            "sglang/jit_kernel/utils.py": SGLANG_UTILS,
            "sglang/jit_kernel/probe.py": SGLANG_PROBE,
        },
    )
    # A toolkit on PATH, an empty entry (the working directory, which holds an nvcc too) and
    # a directory without nvcc: the loader sees the last two.
    toolkit, plain = tmp_path / "cuda" / "bin", tmp_path / "bin"
    write_tree(toolkit, {"nvcc": ""})
    write_tree(tmp_path, {"nvcc": "", "bin/tool": ""})
    path = os.pathsep.join([str(toolkit), "", str(plain)])
    monkeypatch.setenv("PATH", path)
    monkeypatch.setenv("TVM_FFI_CACHE_DIR", str(tmp_path / "node-cache"))
    recipes = {
        "sglang_ok": "sglang.jit_kernel.probe:load()",
        "sglang_compiles": "sglang.jit_kernel.probe:load(compile=True)",
        "sglang_none": "sglang.jit_kernel.probe:nothing()",
        "sglang_broken": "sglang.jit_kernel.probe:broken()",
    }
    node(site, recipes, archs=("9.0a",))
    status, _, report = run(tmp_path, capsys, "--arch", "9.0")
    assert status == 1
    assert report["problems"] == [
        "sglang_compiles: sglang compiled sgl_kernel_jit_probe, sgl_kernel_jit_probe_2 with "
        "tvm-ffi",
        "sglang_none: sglang's loader gave no module",
        "sglang_broken: sglang's kernel does not load prebuilt: nvcc is not on PATH",
    ]
    results = {m["recipe"]: m for m in report["modules"]}
    assert list(results) == list(recipes)
    assert all(results[r]["module"] == r for r in recipes)
    assert [r for r in recipes if results[r]["loaded"]] == ["sglang_ok"]
    assert [r for r in recipes if results[r]["aot"]] == ["sglang_ok"]
    assert [r for r in recipes if "load_seconds" in results[r]] == ["sglang_ok", "sglang_compiles"]
    assert all(0 <= results[r]["load_seconds"] < 60 for r in ("sglang_ok", "sglang_compiles"))
    assert report["jit_compiles"] == 3  # every sglang kernel that did not load
    seen = sys.modules["sglang.jit_kernel.probe"].seen
    assert len(seen) == 2
    for call in seen:
        assert call["SGLANG_DISABLE_JIT"] == "1"
        assert call["PATH"] == os.pathsep.join(["", str(plain)])
        assert call["TVM_FFI_CACHE_DIR"] != str(tmp_path / "node-cache")
        assert call["pdl"] is True  # sm_90 has PDL
    assert seen[0]["TVM_FFI_CACHE_DIR"] != seen[1]["TVM_FFI_CACHE_DIR"]  # a fresh one each
    assert not Path(seen[1]["TVM_FFI_CACHE_DIR"]).exists()  # and removed
    # The node's own settings are back.
    assert os.environ["PATH"] == path
    assert os.environ["TVM_FFI_CACHE_DIR"] == str(tmp_path / "node-cache")


def test_an_unset_tvm_ffi_cache_and_path_are_left_unset(
    site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    write_tree(
        site,
        {
            "sglang/jit_kernel/utils.py": SGLANG_UTILS,
            "sglang/jit_kernel/probe.py": SGLANG_PROBE,
        },
    )
    for name in ("TVM_FFI_CACHE_DIR", "PATH"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    node(site, {"sglang_ok": "sglang.jit_kernel.probe:load()"}, archs=("8.0",))
    assert run(tmp_path, capsys, "--arch", "8.6")[0] == 0
    assert "TVM_FFI_CACHE_DIR" not in os.environ and "PATH" not in os.environ
    (seen,) = sys.modules["sglang.jit_kernel.probe"].seen
    assert seen["PATH"] == ""  # an unset PATH holds no nvcc
    assert seen["pdl"] is False  # no PDL before sm_90


# FlashInfer 0.7's provider lookup (flashinfer/jit/env.py), as far as the check reads it:
# the providers it accepted when it was imported, the warning it logs for one it ignored,
# and its own arch arithmetic.
JIT_ENV_07 = """
import logging
import os

logger = logging.getLogger("flashinfer.jit")


class Provider:
    def __init__(self, distribution, version, archs):
        self.distribution, self.version, self.cuda_architectures = distribution, version, archs


FLASHINFER_AOT_PROVIDERS = ()
if os.environ["FAKE_PROVIDER"] == "ignored":
    logger.warning(
        "Ignoring incompatible flashinfer-jit-cache package (kernels will be JIT-compiled "
        "instead): flashinfer-jit-cache version (0.7.3) does not match flashinfer version"
    )
elif os.environ["FAKE_PROVIDER"] != "absent":
    FLASHINFER_AOT_PROVIDERS = (
        Provider("flashinfer-jit-cache", "0.7.2+x", frozenset(os.environ["FAKE_PROVIDER"].split())),
    )


def _target_cuda_architectures():
    major, minor = os.environ["FLASHINFER_CUDA_ARCH_LIST"].rstrip("af").split(".")
    return frozenset({f"sm{major}{minor}a"})


def _provider_target_compatibility_score(archs, target):
    return (1, 0) if any(a.rstrip("af") == target.rstrip("af") for a in archs) else None
"""


@pytest.mark.parametrize(
    ("provider", "problem"),
    [
        ("sm120f", None),
        (
            "ignored",
            "FlashInfer ignored a prebuilt-kernel package and would JIT-compile instead: "
            "Ignoring incompatible flashinfer-jit-cache package (kernels will be JIT-compiled "
            "instead): flashinfer-jit-cache version (0.7.3) does not match flashinfer version",
        ),
        (
            "absent",
            "FlashInfer accepted no provider from flashinfer-jit-cache: every module would be "
            "JIT-compiled",
        ),
        (
            "sm90a sm100a",
            "flashinfer-jit-cache 0.7.2+x provides code for sm100a, sm90a, which FlashInfer "
            "does not run on sm120a: every module would be JIT-compiled",
        ),
    ],
)
def test_flashinfer_07s_silent_fallback_fails_the_check_by_name(
    site: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    provider: str,
    problem: str | None,
) -> None:
    """FlashInfer 0.7 ignores a mismatched shim or provider, and one whose archs do not
    cover the GPU, with a warning in the log, then JIT-compiles: the check must not pass."""
    write_tree(
        site,
        {
            "flashinfer/__init__.py": "",
            "flashinfer/jit/__init__.py": "",
            "flashinfer/jit/core.py": JIT_CORE,
            "flashinfer/jit/env.py": JIT_ENV_07,
            "flashinfer/generators.py": GENERATORS,
        },
    )
    monkeypatch.setenv("FAKE_PROVIDER", provider)
    node(site, {"comm": "flashinfer.generators:gen_module('trtllm_comm')"})
    status, _, report = run(tmp_path, capsys, "--arch", "12.0")
    assert report["problems"] == ([problem] if problem else [])
    assert status == (1 if problem else 0)


def test_a_flashinfer_that_refuses_to_import_fails_the_check_once(
    site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Patch 0007 makes `import flashinfer` raise when the jit-cache comes from another patch
    series: the check names that once, as its one problem, and loads nothing."""
    refusal = "flashinfer-jit-cache and flashinfer were built from different patch series"
    write_tree(
        site,
        {
            "flashinfer/__init__.py": "from .jit import env",
            "flashinfer/jit/__init__.py": "",
            "flashinfer/jit/core.py": JIT_CORE,
            "flashinfer/jit/env.py": f"raise RuntimeError({refusal!r})",
            "flashinfer/generators.py": GENERATORS,
        },
    )
    node(site, {"a": "flashinfer.generators:gen_module('a')", "b": "flashinfer.generators:x"})
    status, output, report = run(tmp_path, capsys, "--arch", "12.0")
    assert status == 1
    assert report["problems"] == [f"FlashInfer does not import, so no module loads: {refusal}"]
    assert [(m["recipe"], m["loaded"]) for m in report["modules"]] == [("a", False), ("b", False)]
    assert "  0 of 2 modules of 2 recipes loaded prebuilt, 2 did not (0 would JIT-compile); " in (
        output
    )


# sglang 0.5.11 and later: the kernels' loader under sglang/kernels/jit/, which imports the
# server's utilities, so sglang is imported as installed; it names a module for the GPU it
# detects (kernels/jit/utils/arch.py), here by the capability torch reports.
SGLANG_ARCH = """
import torch

_CUDA_ARCH = None

def _init_jit_cuda_arch_once():
    global _CUDA_ARCH
    _CUDA_ARCH = make_jit_cuda_arch(*torch.cuda.get_device_capability(0))

def make_jit_cuda_arch(major, minor):
    return f"{major}.{minor}{'f' if (major, minor) == (12, 0) else 'a'}"

def get_jit_cuda_arch():
    _init_jit_cuda_arch_once()
    return _CUDA_ARCH
"""
SGLANG_KERNEL = """
import os
import torch

from sglang.kernels.jit.utils import arch

seen = []

def load(name):
    seen.append({
        "target": arch.get_jit_cuda_arch(),
        "gpu": torch.cuda.get_device_capability(0),
        **{key: os.environ.get(key) for key in (
            "SGLANG_CRASH_ON_JIT_COMPILE", "SGLANG_JIT_CACHE_DIR", "CUDA_HOME", "CUDA_PATH"
        )},
    })
    if name == "missing":
        raise RuntimeError("JIT module 'sgl_kernel_jit_missing' has no usable cached build")
    return object()
"""


def test_sglang_0511_kernels_load_with_sglang_as_installed_and_its_crash_switch_on(
    site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    write_tree(
        site,
        {
            "sglang/__init__.py": "",
            "sglang/kernels/__init__.py": "",
            "sglang/kernels/jit/__init__.py": "",
            "sglang/kernels/jit/utils/__init__.py": "",
            "sglang/kernels/jit/utils/arch.py": SGLANG_ARCH,
            "sglang/kernels/ops.py": SGLANG_KERNEL,
        },
    )
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    recipes = {
        "sglang_ok": "sglang.kernels.ops:load('ok')",
        "sglang_missing": "sglang.kernels.ops:load('missing')",
    }
    node(site, recipes, archs=("12.0f",))
    import torch

    probe = torch.cuda.get_device_capability
    status, _, report = run(tmp_path, capsys, "--arch", "12.0")
    assert torch.cuda.get_device_capability is probe  # the stand-in lasted the loads only
    assert status == 1
    assert report["problems"] == [
        "sglang_missing: sglang's kernel does not load prebuilt: JIT module "
        "'sgl_kernel_jit_missing' has no usable cached build"
    ]
    assert [m["recipe"] for m in report["modules"] if m["loaded"]] == ["sglang_ok"]
    seen = sys.modules["sglang.kernels.ops"].seen
    assert len(seen) == 2
    for load in seen:
        # No GPU here: sglang is told of one of --arch, and its loader targets what it would
        # pick for it.
        assert (load["target"], tuple(load["gpu"])) == ("12.0f", (12, 0))
        assert load["SGLANG_CRASH_ON_JIT_COMPILE"] == "1"
        cache = Path(load["SGLANG_JIT_CACHE_DIR"])
        assert load["CUDA_HOME"] == load["CUDA_PATH"] == str(cache / "no-cuda")
    assert os.environ["CUDA_HOME"] == str(tmp_path / "cuda")  # given back
    assert "SGLANG_JIT_CACHE_DIR" not in os.environ
