"""The bump's report: the table, the JSON and the exit status.

Exit status: 0 nothing to do by hand; 1 refreshes, reviews or gates remain; 2 nothing can
be written as asked (the pins would not hold together, or unsaved work is in the way of
--write); 3 the candidate could not be evaluated (not on the index, not fetched, malformed).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from ..audit import Report
from ..cache import sha256_of
from ..errors import UserError
from ..fetch import pip_download
from .candidate import Candidate, GateSummary, _index_versions


def table(result: Candidate, hints: dict[str, str] | None = None) -> str:
    """The report of one candidate; `hints`: patch -> its Applied-Upstream header, said
    beside the verdict (a header is a hint, never a reason to drop)."""
    upstream = result.upstream
    files = ", ".join(f"{a.file}, sha256 {a.sha256}" for a in upstream.files)
    lines = [
        f"{upstream.project} {upstream.version}  ({files})",
        f"  {'patch':<62} {'verdict':<26} action",
    ]
    for patch in result.patches:
        lines.append(f"  {patch.patch:<62} {patch.verdict:<26} {patch.action}")
        hint = (hints or {}).get(patch.patch)
        if hint:
            lines.append(f"      its header says Applied-Upstream: {hint} (a hint, not proof)")
        for hunk in patch.hunks:
            if hunk.verdict == "clean" and patch.verdict == "clean":
                continue
            note = f"offset {hunk.offset:+d}" if hunk.verdict == "offset" else hunk.verdict
            detail = f" ({hunk.detail})" if hunk.detail else ""
            lines.append(f"      {hunk.file} {hunk.hunk}: {note}{detail}")
    lines.append("  related pins:")
    lines += [f"    {line}" for line in result.related]
    lines.append("  gate audit (candidate, series applied as far as it goes):")
    lines += [f"    {line}" for line in (result.audit.lines if result.audit else [])]
    return "\n".join(lines)


def as_json(results: list[Candidate], status: tuple[int, str]) -> str:
    return (
        json.dumps(
            {
                "exit_status": status[0],
                "verdict": status[1],
                "candidates": [
                    {
                        "upstream": asdict(r.upstream),
                        "patches": [asdict(p) for p in r.patches],
                        "related": r.related,
                        "requires": {name: str(req) for name, req in r.requires.items()},
                        "audit": asdict(r.audit) if r.audit else None,
                    }
                    for r in results
                ],
            },
            indent=2,
        )
        + "\n"
    )


def audit_summary(report: Report, missing: list[str]) -> GateSummary:
    gates = [f for f in report.findings if f.in_scope and f.waiver is None]
    outside = [f for f in report.findings if not f.in_scope]
    summary = [f"{len(gates)} gate(s) in scope still exclude SM120"]
    summary += [f"GATE {f.upstream}/{f.file}:{f.line} {f.condition[:70]}" for f in gates]
    summary.append(f"{len(outside)} reported outside the audit's scope (not failing)")
    summary += [f"MISSING scoped file(s): {pattern}" for pattern in missing]
    return GateSummary(summary, report.as_json(), missing, len(gates))


def companion_hashes(name: str, version: str, scratch: Path) -> list[str]:
    """sha256 of each wheel of a companion release, downloaded through pip."""
    result = pip_download(scratch, "--only-binary", ":all:", f"{name}=={version}")
    wheels = sorted(scratch.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        available = _index_versions(name)
        raise UserError(
            f"the index has no {name}=={version} (it has {', '.join(available[:8]) or 'none'}), "
            f"and FlashInfer {version} accepts no other cubin. Publish a {name} {version} "
            "wheel to your index (from a machine that reaches one that has it), or bump to a "
            "FlashInfer release whose cubin the index carries. Nothing was written."
        )
    return [sha256_of(wheel) for wheel in wheels]


def verdict(results: list[Candidate], problems: list[str]) -> tuple[int, str]:
    """The bump's exit status and why: 0 every patch clean or upstream (dropped on proof)
    and no gate left; 1 refreshes, reviews or gates remain; 2 it cannot be written."""
    if problems:
        return 2, "; ".join(problems)
    work = [
        f"{p.patch} ({p.verdict}: {p.action})"
        for r in results
        for p in r.patches
        if p.action != "keep" and p.verdict != "upstream"
    ]
    gates = [
        f"{r.upstream.name}: {r.audit.gates} gate(s), {len(r.audit.missing_scope)} missing"
        for r in results
        if r.audit and (r.audit.gates or r.audit.missing_scope)
    ]
    if work or gates:
        return 1, "; ".join(work + gates)
    return 0, "every patch applies or is upstream, and no gate remains"
