"""The node check (sm120_build.node.check) run in this process: its verdicts on the installed
distributions' provenance, versions and archs, its report, its options and its errors.

The installed distributions are dist-info directories on sys.path, as pip writes them. The
real FlashInfer and sglang, with modules built by nvcc, are checked by the slow node tests
(test_build_e2e.py, test_sglang_kernels.py), which run the installed `sm120-node-check` in a
fresh venv; test_node_check_modules.py checks its verdicts on each module.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sm120_build.node.check import driver_cuda, driver_problems, first_use_lines, main

# The check reports torch's CUDA and, without --arch, asks torch for the GPU.
pytest.importorskip("torch", reason="the node check needs torch (nox -s tests installs it)")

SERIES = "p1a2b3c4d"
VERSION = f"0.6.3+sm120.{SERIES}"
PATCHES = ["0001-a.patch", "0002-b.patch"]


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
    profiles: dict[str, dict[str, str]] | None = None,
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
            "profiles": profiles or {},
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
        "hosts": {},
        "jit_compiles": 0,
        "modules": [],
        "first_use": [
            "what still compiles at first use outside these wheels is recorded per derived "
            "configuration: run with --profile NAME (none recorded)"
        ],
        "problems": [],
        "not_checked": [],
    }
    lines = output.splitlines()
    assert lines[:2] == [
        f"CUDA: torch {torch.version.cuda or 'CPU only'}, jit-cache built with 13.0",
        f"node_check: sm_120 (--arch); flashinfer {VERSION}, jit-cache {VERSION} (12.0f)",
    ]
    assert re.fullmatch(
        r"  0 of 0 modules of 0 recipes loaded prebuilt, 0 did not \(0 would JIT-compile\); "
        r"\d+\.\d\d s",
        lines[2],
    )
    assert lines[3].startswith("  what still compiles at first use") and len(lines) == 4
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


def test_without_a_gpu_it_reports_what_needs_none_then_what_it_could_not_check(
    site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It used to stop at "no CUDA GPU is visible" before reporting anything."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    node(site, recipes={"trtllm_comm": "flashinfer.comm:gen_trtllm_comm_module()"})
    status, output, report = run(tmp_path, capsys)
    assert status == 1
    assert output.splitlines() == [
        f"CUDA: torch {torch.version.cuda or 'CPU only'}, jit-cache built with 13.0",
        f"node_check: no GPU arch; flashinfer {VERSION}, jit-cache {VERSION} (12.0f)",
        "  what still compiles at first use outside these wheels is recorded per derived "
        "configuration: run with --profile NAME (none recorded)",
        "  NOT CHECKED the 1 recipes' modules were not loaded: no CUDA GPU is visible; on a "
        "machine without one, pass --arch 12.0",
    ]
    assert report["device"] is None and report["problems"] == []
    assert report["versions"] == {"flashinfer-jit-cache": VERSION, "flashinfer-python": VERSION}


def test_what_needs_no_gpu_still_fails_without_one(
    site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    node(site, python_patches=PATCHES[:1])
    status, _, report = run(tmp_path, capsys)
    assert status == 1
    assert report["problems"] == [
        "flashinfer-python and flashinfer-jit-cache record different patches"
    ]
    assert len(report["not_checked"]) == 1


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
    provenance = {"archs": ["12.0f"], "patches": PATCHES, "recipes": {}}
    installed(site, "flashinfer-jit-cache", VERSION, provenance)
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
    out = capsys.readouterr().out
    text = " ".join(out.split())
    assert text.startswith(
        "usage: node_check [-h] [--arch MAJOR.MINOR] [--profile NAME] [--json JSON] "
        "[--install DIR] [--trust-key KEY.pub] [--verbose] `sm120-node-check` (or `nox -s "
        "node_check` from a "
        "checkout): on a serving node, prove that FlashInfer and sglang will not JIT-compile."
    )
    # The description's list stays a list (it used to be flattened into one paragraph).
    assert "\n- the versions and patch series of flashinfer-python" in out
    assert "\n- the archs the jit-cache holds code for" in out
    for option, says in {
        "--arch MAJOR.MINOR": "check for this GPU arch instead of the GPU's",
        "--profile NAME": "check this profile, as the installed jit-cache records it, instead "
        "of what the wheel was built from",
        "--json JSON": "also write the findings to this file",
        "--install DIR": "first install DIR's wheels into this Python",
        "--trust-key KEY.pub": "the Ed25519 public key (PEM) our wheels' provenance envelopes "
        "must be signed with",
        "--verbose": "show the traceback of an unexpected error",
    }.items():
        assert f"{option} {says}" in text


def test_install_without_torch_installs_nothing(
    site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`nox -s node_check` from a venv without torch used to install three wheels, then fail
    with ModuleNotFoundError ("This is a bug")."""
    node(site)
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch: ModuleNotFoundError
    status, output, report = run(tmp_path, capsys, "--install", str(tmp_path / "no-such-dir"))
    assert status == 1 and report is None
    assert output == (
        f"error: torch is not installed in {sys.prefix}: the node check runs in the Python "
        "that serves sglang, which holds torch (`python -m nox -s node_check` from that "
        "environment). Nothing was installed.\n"
    )


def test_without_torch_the_arch_is_still_checked(
    site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    node(site, archs=("10.0a",))
    monkeypatch.setitem(sys.modules, "torch", None)
    status, output, report = run(tmp_path, capsys, "--arch", "12.0")
    assert status == 1
    assert report["problems"] == [
        "flashinfer-jit-cache has code for 10.0a, none of which runs on sm_120 (--arch)"
    ]
    assert report["not_checked"] == [
        "the 0 recipes' modules were not loaded: torch is not installed here, and FlashInfer "
        "loads its modules only with it"
    ]
    assert output.startswith("CUDA: torch not installed, jit-cache built with 13.0\n")


RECORDED = {
    "compiled_on_node": {
        "qwen": [
            {"name": "triton a.kv_indices", "defined_at": "a.py:1", "loaded_by": ["b.py:2 plan"]},
            {"name": "triton a.fused_moe", "defined_at": "a.py:9", "loaded_by": []},
            {"name": "torch.compile m.topk", "defined_at": "m.py:3", "loaded_by": ["t.py:4 r"]},
        ],
        "llama": [],
    }
}


def test_what_still_compiles_is_told_per_compiler_for_a_derived_profile() -> None:
    assert first_use_lines(RECORDED, "qwen") == [
        "would compile at first use, Triton: a.kv_indices (from b.py:2 plan)",
        "would compile at first use, Triton: a.fused_moe (from an unknown site)",
        "would compile at first use, torch.compile: m.topk (from t.py:4 r)",
        "not reached by qwen's derivation: DeepGEMM, CuTe DSL, TileLang",
    ]
    assert first_use_lines(RECORDED, "llama") == [
        "not reached by llama's derivation: Triton, DeepGEMM, torch.compile, CuTe DSL, TileLang"
    ]


def test_without_a_derived_profile_the_check_says_how_to_ask_for_one() -> None:
    for profile in (None, "comm"):
        assert first_use_lines(RECORDED, profile) == [
            "what still compiles at first use outside these wheels is recorded per derived "
            "configuration: run with --profile NAME (llama, qwen)"
        ]
    assert first_use_lines({}, None)[0].endswith("--profile NAME (none recorded)")
