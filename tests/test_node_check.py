"""The node check (sm120_build.node.check) run in this process: its verdicts on the installed
distributions' provenance, versions and archs, and on each recipe's module, and its report.

The installed distributions are dist-info directories on sys.path, as pip writes them.
FlashInfer and sglang are small generated packages that offer the one interface the check
calls: FlashInfer's `flashinfer.jit.core.JitSpec` (name, is_aot, build_and_load) and an
sglang kernel module's loader. The real FlashInfer and sglang, with modules built by nvcc,
are checked by the slow node tests (test_build_e2e.py, test_sglang_kernels.py), which run
the installed `sm120-node-check` in a fresh venv.
"""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sm120_build.node.check import driver_cuda, driver_problems, main

# The check reports torch's CUDA and, without --arch, asks torch for the GPU.
pytest.importorskip("torch", reason="the node check needs torch (nox -s tests installs it)")

SERIES = "p1a2b3c4d"
VERSION = f"0.6.3+sm120.{SERIES}"
PATCHES = ["0001-a.patch", "0002-b.patch"]

# The stand-in for FlashInfer's JitSpec: the attributes and the method the check uses.
JIT_CORE = """
import time

class JitSpec:
    def __init__(self, name, is_aot=True, error=None, seconds=0.0):
        self.name, self.is_aot, self.error, self.seconds = name, is_aot, error, seconds

    def build_and_load(self):
        time.sleep(self.seconds)
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


def write_tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def installed(site: Path, name: str, version: str, provenance: dict[str, Any] | None) -> None:
    """A distribution as pip installs it: its dist-info, with the build's provenance."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    files = {"METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"}
    if provenance is not None:
        files["sm120-build.json"] = json.dumps(provenance)
    write_tree(info, files)


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A site directory on sys.path; what the check imports from it and the variables it
    sets are gone afterwards."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    for name in ("FLASHINFER_DISABLE_JIT", "FLASHINFER_CUDA_ARCH_LIST", "SGLANG_DISABLE_JIT"):
        monkeypatch.setenv(name, "")  # so that teardown restores the variable's absence
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    before = set(sys.modules)
    yield site
    for name in set(sys.modules) - before:
        if name.split(".")[0] in ("flashinfer", "sglang"):
            del sys.modules[name]


def node(
    site: Path,
    recipes: dict[str, str] | None = None,
    archs: tuple[str, ...] = ("12.0f",),
    jit_cache_version: str = VERSION,
    python_patches: list[str] = PATCHES,
) -> None:
    """The two FlashInfer distributions of one build, installed in `site`."""
    installed(
        site,
        "flashinfer-jit-cache",
        jit_cache_version,
        {
            "archs": list(archs),
            "patches": PATCHES,
            "toolkit": {"cuda": "13.0"},
            "recipes": recipes or {},
        },
    )
    installed(site, "flashinfer-python", VERSION, {"patches": python_patches})


def run(tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, Any]:
    """main()'s exit status, its output and its JSON report."""
    report = tmp_path / "report.json"
    status = main(["--json", str(report), *args])
    captured = capsys.readouterr()
    findings = json.loads(report.read_text()) if report.exists() else None
    return status, captured.out + captured.err, findings


def test_a_matching_pair_passes_and_reports_what_it_checked(
    site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    node(site)
    status, output, report = run(tmp_path, capsys, "--arch", "12.0")
    assert status == 0, output
    assert report == {
        "device": {"major": 12, "minor": 0, "source": "--arch"},
        "versions": {"flashinfer-jit-cache": VERSION, "flashinfer-python": VERSION},
        "archs": ["12.0f"],
        "jit_compiles": 0,
        "modules": [],
        "problems": [],
    }
    lines = output.splitlines()
    assert lines[:2] == [
        f"CUDA: torch {torch.version.cuda or 'CPU only'}, jit-cache built with 13.0",
        f"node_check: sm_120 (--arch); flashinfer {VERSION}, jit-cache {VERSION} (12.0f)",
    ]
    assert re.fullmatch(
        r"  0 of 0 modules of 0 recipes loaded prebuilt, 0 did not \(0 would JIT-compile\); "
        r"\d+\.\d\d s; slowest: ",
        lines[2],
    )
    assert len(lines) == 3
    # FlashInfer picks its code paths for the GPU checked for, and may not compile.
    assert os.environ["FLASHINFER_DISABLE_JIT"] == "1"
    assert os.environ["FLASHINFER_CUDA_ARCH_LIST"] == "12.0a"


@pytest.mark.parametrize(
    ("archs", "arch", "arch_list"),
    [(("9.0a",), "9.0", "9.0a"), (("8.0",), "8.6", "8.6"), (("10.0a", "12.0f"), "12.1", "12.1a")],
)
def test_flashinfer_is_told_the_arch_of_the_gpu_checked_for(
    site: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    archs: tuple[str, ...],
    arch: str,
    arch_list: str,
) -> None:
    """With the `a` suffix from sm_90 on, as FlashInfer's own arch list spells those GPUs."""
    node(site, archs=archs)
    assert run(tmp_path, capsys, "--arch", arch)[0] == 0
    assert os.environ["FLASHINFER_CUDA_ARCH_LIST"] == arch_list


def test_a_jit_cache_without_code_for_the_gpu_fails(
    site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node(site, archs=("12.0f", "10.0a"))
    status, output, report = run(tmp_path, capsys, "--arch", "9.0")
    problem = "flashinfer-jit-cache has code for 12.0f, 10.0a, none of which runs on sm_90 (--arch)"
    assert status == 1
    assert report["problems"] == [problem]
    assert f"  FAIL {problem}" in output.splitlines()


@pytest.mark.parametrize(
    "jit_cache_version", ["0.6.3+sm120.p00000000", "0.6.3+sm120", "0.6.3+sm120.p1a2b3c4"]
)
def test_wheels_of_another_patch_series_fail(
    site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], jit_cache_version: str
) -> None:
    """A different label, or none (p + 8 hex digits or it is not a label)."""
    node(site, jit_cache_version=jit_cache_version)
    status, _, report = run(tmp_path, capsys, "--arch", "12.0")
    assert status == 1
    assert report["problems"] == [
        "flashinfer-python and flashinfer-jit-cache come from different patch series: "
        f"flashinfer-jit-cache {jit_cache_version}, flashinfer-python {VERSION}"
    ]


def test_wheels_without_any_patch_series_label_fail(
    site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    provenance = {"archs": ["12.0f"], "patches": [], "toolkit": {}, "recipes": {}}
    installed(site, "flashinfer-jit-cache", "0.6.3", provenance)
    installed(site, "flashinfer-python", "0.6.3", {"patches": []})
    status, output, report = run(tmp_path, capsys, "--arch", "12.0")
    assert status == 1
    assert report["problems"] == [
        "flashinfer-python and flashinfer-jit-cache come from different patch series: "
        "flashinfer-jit-cache 0.6.3, flashinfer-python 0.6.3"
    ]
    assert "jit-cache built with ?" in output  # no toolkit recorded


def test_wheels_that_record_different_patches_fail(
    site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node(site, python_patches=PATCHES[:1])
    status, _, report = run(tmp_path, capsys, "--arch", "12.0")
    assert status == 1
    assert report["problems"] == [
        "flashinfer-python and flashinfer-jit-cache record different patches"
    ]


def test_a_missing_distribution_is_named(
    site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    installed(site, "flashinfer-python", VERSION, {"patches": PATCHES})
    status, output, report = run(tmp_path, capsys, "--arch", "12.0")
    assert status == 1 and report is None
    assert output == f"error: flashinfer-jit-cache is not installed in {sys.prefix}\n"


def test_jit_left_enabled_is_refused(
    site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    node(site)
    monkeypatch.setenv("FLASHINFER_DISABLE_JIT", "0")
    status, output, _ = run(tmp_path, capsys, "--arch", "12.0")
    assert status == 1
    assert output.startswith("error: FLASHINFER_DISABLE_JIT is '0': a node check runs with")


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
        "sm12x: FlashInfer does not make it for this GPU (SM12x only)",
        "cutlass: the Python package 'cutlass_dsl_missing' is not installed here, which "
        "FlashInfer needs for it: install it (pip install cutlass_dsl_missing), or the whole "
        "environment sglang 0.5.9 needs",
    ]
    modules = {(m["module"], m["recipe"]): m for m in report["modules"]}
    assert list(modules) == [
        ("a", "pair"),
        ("b", "pair"),
        ("c", "again"),
        ("slow", "slow"),
        ("not_built", "not_built"),
        ("broken", "broken"),
        (None, "sm12x"),
        (None, "cutlass"),
        ("d", "more"),
        ("e", "more"),
        ("f", "more"),
    ]
    loaded = [name for (name, _), m in modules.items() if m["loaded"]]
    assert loaded == ["a", "b", "c", "slow", "d", "e", "f"]
    assert all(m["aot"] == (m["module"] in [*loaded, "broken"]) for m in report["modules"])
    # A load is timed, failed or not; a module that was never loaded has no time.
    timed = [name for (name, _), m in modules.items() if "load_seconds" in m]
    assert timed == [*loaded[:4], "broken", *loaded[4:]]
    assert modules["slow", "slow"]["load_seconds"] >= 0.05
    assert report["jit_compiles"] == 1  # not_built; the two recipes without a module do not count
    summary = next(line for line in output.splitlines() if "modules of" in line)
    assert summary.startswith(
        "  7 of 11 modules of 8 recipes loaded prebuilt, 4 did not (1 would JIT-compile); "
    )
    total, slowest = summary.split("JIT-compile); ")[1].split(" s; slowest: ")
    assert 0.05 <= float(total) < 60
    assert re.fullmatch(r"slow 0\.\d{3} s(, [a-f] 0\.\d{3} s){4}", slowest)
    for problem in report["problems"]:
        assert f"  FAIL {problem}" in output.splitlines()


def test_a_profile_names_the_recipes_instead_of_the_wheel(
    site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--profile reads ./profiles.toml: a node checks a profile the wheel may not carry."""
    (tmp_path / "profiles.toml").write_text(
        textwrap.dedent(
            """
            [modules.trtllm_comm]
            call = "flashinfer.comm:gen_trtllm_comm_module()"
            [modules.elsewhere]
            call = "flashinfer.elsewhere:gen()"
            [profiles.comm]
            modules = ["trtllm_comm"]
            [profiles.wide]
            modules = ["trtllm_comm", "elsewhere"]
            """
        )
    )
    node(site, {"trtllm_comm": "flashinfer.comm:gen_trtllm_comm_module()"})
    status, output, report = run(tmp_path, capsys, "--arch", "12.0", "--profile", "wide")
    assert status == 1
    # No FlashInfer here at all: each recipe says so.
    assert [m["recipe"] for m in report["modules"]] == ["trtllm_comm", "elsewhere"]
    assert all("'flashinfer' is not installed here" in p for p in report["problems"])
    assert len(report["problems"]) == 2
    assert "0 of 2 modules of 2 recipes" in output


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


def test_a_driver_older_than_the_toolkit_is_named() -> None:
    assert driver_problems("13.0", (13, 0)) == []
    assert driver_problems("13.0", (13, 1)) == []
    assert driver_problems("12.8", (13, 0)) == []
    assert driver_problems("13.0.2", (13, 0)) == []  # a driver's version has no patch level
    assert driver_problems("?", (0, 0)) == []  # a jit-cache that records no toolkit
    (problem,) = driver_problems("13.0", (12, 9))
    assert problem == (
        "the jit-cache was built with CUDA 13.0, which this driver (CUDA 12.9) cannot run: "
        "install a driver for CUDA 13.0 (>= 580 for 13.0), or use a jit-cache built with "
        "--cuda-home for your CUDA"
    )
    assert driver_problems("13.0.2", (12, 9)) == [
        "the jit-cache was built with CUDA 13.0.2, which this driver (CUDA 12.9) cannot run: "
        "install a driver for CUDA 13.0.2 (>= 580 for 13.0), or use a jit-cache built with "
        "--cuda-home for your CUDA"
    ]


def test_the_drivers_cuda_version_is_read_as_nvml_gives_it() -> None:
    assert driver_cuda(13000) == (13, 0)
    assert driver_cuda(12090) == (12, 9)
    assert driver_cuda(11080) == (11, 8)
    assert driver_cuda(12095) == (12, 9)  # a third digit, were NVML to give one, is not a minor


def test_main_without_a_gpu_or_arch_says_what_to_pass(
    site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    node(site)
    status, output, _ = run(tmp_path, capsys)
    assert status == 1
    assert output == "error: no CUDA GPU is visible; on a machine without one, pass --arch 12.0\n"


def test_the_report_is_indented_json(
    site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node(site, archs=("12.0f", "12.1a"))
    status, output, report = run(tmp_path, capsys, "--arch", "12.1")
    assert status == 0
    assert f"jit-cache {VERSION} (12.0f, 12.1a)" in output
    assert (tmp_path / "report.json").read_text() == json.dumps(report, indent=2) + "\n"


def test_an_unreadable_provenance_is_named(
    site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node(site)
    (site / f"flashinfer_python-{VERSION}.dist-info" / "sm120-build.json").write_text("{")
    status, output, _ = run(tmp_path, capsys, "--arch", "12.0")
    assert status == 1
    assert output.startswith(
        f"error: flashinfer-python {VERSION}: its sm120-build.json is not valid JSON ("
    )
    assert output.endswith("); reinstall the wheel from the wheelhouse\n")


def test_an_unexpected_error_is_one_line_unless_verbose(
    site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A provenance without the toolkit entry: not a state this tool makes."""
    installed(site, "flashinfer-jit-cache", VERSION, {"archs": ["12.0f"], "patches": PATCHES})
    installed(site, "flashinfer-python", VERSION, {"patches": PATCHES})
    status, output, _ = run(tmp_path, capsys, "--arch", "12.0")
    assert status == 2
    assert output.startswith("error: unexpected KeyError: 'toolkit'\n")
    with pytest.raises(KeyError, match="toolkit"):
        main(["--arch", "12.0", "--verbose"])


def test_install_from_a_directory_that_is_not_a_wheelhouse_installs_nothing(
    site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node(site)
    (tmp_path / "empty").mkdir()
    status, output, report = run(tmp_path, capsys, "--install", str(tmp_path / "empty"))
    assert status == 1 and report is None
    assert output.startswith(f"error: {tmp_path / 'empty'}")


def test_help_names_every_option_and_what_it_does(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert text.startswith(
        "usage: node_check [-h] [--arch MAJOR.MINOR] [--profile NAME] [--json JSON] "
        "[--install DIR] [--verbose] `sm120-node-check` (or `nox -s node_check` from a "
        "checkout): on a serving node, prove that FlashInfer and sglang will not JIT-compile."
    )
    for option, says in {
        "--arch MAJOR.MINOR": "check for this GPU arch instead of the GPU's",
        "--profile NAME": "check this profile of profiles.toml instead of what the wheel was "
        "built from",
        "--json JSON": "also write the findings to this file",
        "--install DIR": "first install DIR's wheels into this Python",
        "--verbose": "show the traceback of an unexpected error",
    }.items():
        assert f"{option} {says}" in text
