"""The bump's report, in process: the table an operator reads, the JSON a pipeline reads,
the gate summary and the exit status, each checked whole."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from sm120_build.audit import Report
from sm120_build.audit.scope import Finding
from sm120_build.bump.candidate import Candidate, GateSummary
from sm120_build.bump.classify import HunkVerdict, PatchVerdict
from sm120_build.bump.report import as_json, audit_summary, companion_hashes, table, verdict
from sm120_build.pins import Artifact, Upstream

from .conftest import wheel_in

FLASHINFER = Upstream(
    name="flashinfer",
    project="flashinfer-python",
    version="0.6.4",
    sdist="flashinfer_python-0.6.4.tar.gz",
    sha256="ab" * 32,
    git_url="https://example.invalid/flashinfer.git",
    git_tag="v0.6.4",
    git_commit="0123abcd",
)
SGLANG = Upstream(
    name="sglang",
    project="sglang",
    version="0.5.23",
    sdist="",
    sha256="",
    git_url="https://example.invalid/sglang.git",
    git_tag="v0.5.23",
    git_commit="",
    wheels=(
        Artifact("sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl", "11" * 32),
        Artifact("sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl", "22" * 32),
    ),
)
OFFSET = HunkVerdict("csrc/a.cu", "@@ -10,3 +10,4 @@", "offset", offset=-4)
CLEAN = HunkVerdict("csrc/a.cu", "@@ -40,3 +40,4 @@", "clean")
CONFLICT = HunkVerdict(
    "flashinfer/jit/comm.py", "@@ -7,2 +7,2 @@", "conflict", detail="'x = 1' is at comm.py:9"
)
FUZZ = HunkVerdict("csrc/b.cu", "@@ -1,2 +1,2 @@", "fuzz", detail="lands in gen_sm89()")


def finding(line: int, *, in_scope: bool, waiver: str | None = None) -> Finding:
    return Finding(
        kind="device",
        upstream="flashinfer",
        file="include/comm.cuh",
        line=line,
        function="allreduce",
        condition="__CUDA_ARCH__ >= 900 && __CUDA_ARCH__ < 1200 (and the rest of it)" + "!" * 20,
        detail="",
        in_scope=in_scope,
        waiver=waiver,
    )


def test_the_table_shows_each_patch_its_hints_and_every_hunk_that_is_not_plainly_clean() -> None:
    candidate = Candidate(
        FLASHINFER,
        [
            PatchVerdict("0001-clean.patch", "clean", "keep", [CLEAN]),
            PatchVerdict("0002-moved.patch", "offset", "keep", [OFFSET, CLEAN]),
            PatchVerdict("0003-gone.patch", "conflict", "refresh", [CONFLICT, FUZZ]),
        ],
        related=["companion flashinfer-cubin (pinned 0.6.3): moves to 0.6.4"],
        audit=GateSummary(["0 gate(s) in scope still exclude SM120"], {}, []),
    )
    hints = {"0003-gone.patch": "https://example.invalid/1", "0001-clean.patch": ""}
    patch_column = f"{'patch':<62}"
    assert table(candidate, hints).splitlines() == [
        f"flashinfer-python 0.6.4  (flashinfer_python-0.6.4.tar.gz, sha256 {'ab' * 32})",
        f"  {patch_column} {'verdict':<26} action",
        f"  {'0001-clean.patch':<62} {'clean':<26} keep",
        f"  {'0002-moved.patch':<62} {'offset':<26} keep",
        "      csrc/a.cu @@ -10,3 +10,4 @@: offset -4",
        "      csrc/a.cu @@ -40,3 +40,4 @@: clean",
        f"  {'0003-gone.patch':<62} {'conflict':<26} refresh",
        "      its header says Applied-Upstream: https://example.invalid/1 (a hint, not proof)",
        "      flashinfer/jit/comm.py @@ -7,2 +7,2 @@: conflict ('x = 1' is at comm.py:9)",
        "      csrc/b.cu @@ -1,2 +1,2 @@: fuzz (lands in gen_sm89())",
        "  related pins:",
        "    companion flashinfer-cubin (pinned 0.6.3): moves to 0.6.4",
        "  gate audit (candidate, series applied as far as it goes):",
        "    0 gate(s) in scope still exclude SM120",
    ]


def test_the_table_of_a_wheel_only_upstream_names_each_wheel_and_no_audit_line_if_none_ran() -> (
    None
):
    lines = table(
        Candidate(SGLANG, [PatchVerdict("0001.patch", "offset", "keep", [])])
    ).splitlines()
    assert lines[0] == (
        f"sglang 0.5.23  (sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl, sha256 {'11' * 32}, "
        f"sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl, sha256 {'22' * 32})"
    )
    assert lines[1:] == [
        f"  {'patch':<62} {'verdict':<26} action",
        f"  {'0001.patch':<62} {'offset':<26} keep",
        "  related pins:",
        "  gate audit (candidate, series applied as far as it goes):",
    ]


def test_the_json_carries_the_status_and_every_candidate_whole() -> None:
    gates = GateSummary(["1 gate(s)"], {"failing": 1}, ["csrc/gone/*.cu"], gates=1)
    candidate = Candidate(
        SGLANG,
        [PatchVerdict("0001.patch", "conflict", "refresh", [CONFLICT])],
        related=["sglang-kernel moves"],
        audit=gates,
        requires={"flashinfer-python": Requirement("flashinfer_python[cu13]==0.7.2")},
    )
    text = as_json([candidate, Candidate(FLASHINFER)], (1, "0001.patch"))
    assert text.startswith('{\n  "exit_status": 1,\n  "verdict": "0001.patch",\n')
    document = json.loads(text)
    assert document["exit_status"] == 1 and document["verdict"] == "0001.patch"
    first, second = document["candidates"]
    assert first["upstream"]["version"] == "0.5.23"
    assert [w["file"] for w in first["upstream"]["wheels"]] == [a.file for a in SGLANG.wheels]
    assert first["patches"] == [
        {
            "patch": "0001.patch",
            "verdict": "conflict",
            "action": "refresh",
            "hunks": [
                {
                    "file": "flashinfer/jit/comm.py",
                    "hunk": "@@ -7,2 +7,2 @@",
                    "verdict": "conflict",
                    "offset": 0,
                    "detail": "'x = 1' is at comm.py:9",
                }
            ],
        }
    ]
    assert first["related"] == ["sglang-kernel moves"]
    assert first["requires"] == {"flashinfer-python": "flashinfer_python[cu13]==0.7.2"}
    assert first["audit"] == {
        "lines": ["1 gate(s)"],
        "report": {"failing": 1},
        "missing_scope": ["csrc/gone/*.cu"],
        "gates": 1,
    }
    assert second["audit"] is None and second["patches"] == [] and second["requires"] == {}
    assert as_json([], (0, "ok")).endswith("}\n")


def test_the_gate_summary_counts_scoped_unwaived_gates_and_names_each() -> None:
    findings = [
        finding(10, in_scope=True),
        finding(20, in_scope=True, waiver="runs on the host only"),
        finding(30, in_scope=False),
        finding(40, in_scope=False),
        finding(50, in_scope=False),
    ]
    report = Report(findings, [], ["csrc/gone/*.cu"])
    summary = audit_summary(report, ["csrc/gone/*.cu"])
    condition = findings[0].condition[:70]
    assert summary.lines == [
        "1 gate(s) in scope still exclude SM120",
        f"GATE flashinfer/include/comm.cuh:10 {condition}",
        "3 reported outside the audit's scope (not failing)",
        "MISSING scoped file(s): csrc/gone/*.cu",
    ]
    assert len(condition) == 70
    assert summary.gates == 1
    assert summary.missing_scope == ["csrc/gone/*.cu"]
    assert summary.report == report.as_json()


def test_the_verdict_names_each_piece_of_work_that_remains() -> None:
    keep = PatchVerdict("0001.patch", "offset", "keep", [])
    dropped = PatchVerdict("0002.patch", "upstream", "drop", [])
    review = PatchVerdict("0003.patch", "upstream in another form", "review", [])
    refresh = PatchVerdict("0004.patch", "conflict", "refresh", [])
    assert verdict([Candidate(FLASHINFER, [keep, dropped])], []) == (
        0,
        "every patch applies or is upstream, and no gate remains",
    )
    gated = GateSummary([], {}, ["csrc/gone/*.cu"], gates=2)
    assert verdict(
        [Candidate(FLASHINFER, [review, refresh]), Candidate(SGLANG, audit=gated)], []
    ) == (
        1,
        "0003.patch (upstream in another form: review); 0004.patch (conflict: refresh); "
        "sglang: 2 gate(s), 1 missing",
    )
    missing_only = GateSummary([], {}, ["csrc/gone/*.cu"], gates=0)
    assert verdict([Candidate(SGLANG, audit=missing_only)], []) == (
        1,
        "sglang: 0 gate(s), 1 missing",
    )
    clear = GateSummary([], {}, [], gates=0)
    assert verdict([Candidate(SGLANG, audit=clear)], [])[0] == 0
    assert verdict([Candidate(FLASHINFER, [refresh])], ["pins split", "cubin gone"]) == (
        2,
        "pins split; cubin gone",
    )


def test_a_companion_s_hashes_are_those_of_each_of_its_wheels_pip_finds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    links = tmp_path / "links"
    wanted = wheel_in(links, "flashinfer_cubin", "0.6.4")
    wheel_in(links, "flashinfer_cubin", "0.6.5")  # another release: not taken
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    out = tmp_path / "out"
    out.mkdir()
    assert companion_hashes("flashinfer-cubin", "0.6.4", out) == [
        hashlib.sha256(wanted.read_bytes()).hexdigest()
    ]
    assert [p.name for p in out.iterdir()] == [wanted.name]
