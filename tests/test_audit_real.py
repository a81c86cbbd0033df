"""Integration: the gate audit on the real pristine and patched upstream trees."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

GUARD_LINES = [417, 455, 485, 533, 711, 895, 950, 991, 1053, 1207, 1265, 1335, 1444]


def run_audit(root: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    env = dict(os.environ, SM120_CACHE_DIR=str(root / ".cache"))
    out = root / f"audit{len(args)}.json"
    result = subprocess.run(
        [sys.executable, "-m", "sm120_build", "audit-gates", "--json", str(out), *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )
    return result.returncode, json.loads(out.read_text()), result.stdout + result.stderr


@pytest.fixture(scope="module")
def pristine(vendored_project: Path) -> tuple[int, dict[str, Any], str]:
    return run_audit(vendored_project, "--pristine")


def in_scope(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["in_scope"]]


def test_pristine_finds_all_13_guards_at_their_lines(pristine: Any) -> None:
    _, report, _ = pristine
    guards = [f for f in report["findings"] if f["kind"] == "device"]
    assert {f["file"] for f in guards} == {"include/flashinfer/comm/trtllm_allreduce.cuh"}
    assert [f["line"] for f in guards] == GUARD_LINES
    assert all("__CUDA_ARCH__ < 1200" in f["condition"] for f in guards)
    lamport = next(f for f in guards if f["line"] == 711)
    assert lamport["function"] == "lamport_style_one_shot_all_reduce_norm_kernel"


def test_pristine_finds_the_python_gates_of_the_facts_file(pristine: Any) -> None:
    _, report, _ = pristine
    python = {
        (f["upstream"], f["file"], f["line"]) for f in in_scope(report) if f["kind"] == "python"
    }
    assert python == {
        ("flashinfer", "flashinfer/jit/comm.py", 61),  # supported_major_versions=[9, 10]
        ("flashinfer", "flashinfer/aot.py", 526),  # trtllm_comm only with sm100
        ("sglang", "sglang/srt/layers/communicator.py", 95),  # sm90 or sm100
        ("sglang", "sglang/srt/server_args.py", 1691),  # the auto-enable, waived
    }


def test_each_pristine_gate_is_traced_to_the_patch_that_removes_it(pristine: Any) -> None:
    code, report, output = pristine
    expected = {
        "include/flashinfer/comm/trtllm_allreduce.cuh": "0001-",
        "flashinfer/jit/comm.py": "0002-",
        "flashinfer/aot.py": "0006-",
        "sglang/srt/layers/communicator.py": "0001-",
    }
    for finding in in_scope(report):
        if finding["file"] == "sglang/srt/server_args.py":
            assert finding["waiver"] and finding["removed_by"] is None
            continue
        assert finding["removed_by"].startswith(expected[finding["file"]]), finding
    assert report["failing"] == 0 and code == 0, output
    assert "removed by 0001-lift-the-cuda-arch-1200-bound" in output


def test_patched_trees_have_nothing_beyond_the_waivers(vendored_project: Path) -> None:
    code, report, output = run_audit(vendored_project)
    assert code == 0, output
    assert [f for f in report["findings"] if f["kind"] == "device"] == []
    assert [(f["file"], f["waiver"] is not None) for f in in_scope(report)] == [
        ("sglang/srt/server_args.py", True)
    ]
    assert report["stale_waivers"] == []


def test_an_unwaived_gate_fails_the_audit(vendored_project: Path, tmp_path: Path) -> None:
    # A copy of its own: the session's vendored project stays as every other test sees it.
    root = tmp_path / "project"
    shutil.copytree(vendored_project, root, symlinks=True)
    (root / "audit-waivers.toml").write_text("")
    code, report, output = run_audit(root)
    assert code == 1
    assert report["failing"] == 1
    assert "still exclude SM120" in output


def test_scope_all_only_reports(vendored_project: Path) -> None:
    code, report, _ = run_audit(vendored_project, "--scope", "all")
    assert code == 0
    assert len(report["findings"]) > len(in_scope(report))
