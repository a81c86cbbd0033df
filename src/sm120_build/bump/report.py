"""The bump's report (table, JSON, exit status) and --write: new pins, and patches dropped
only on proof."""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path

from packaging.version import Version

from ..audit import Report
from ..cache import sha256_of
from ..errors import UserError
from ..fetch import pip_download
from ..patches import parse_dep3
from ..pins import Pins
from .candidate import Candidate, GateSummary, _index_versions


def table(result: Candidate) -> str:
    upstream = result.upstream
    lines = [
        f"{upstream.project} {upstream.version}  ({upstream.sdist}, sha256 {upstream.sha256})",
        f"  {'patch':<62} {'verdict':<26} action",
    ]
    for patch in result.patches:
        lines.append(f"  {patch.patch:<62} {patch.verdict:<26} {patch.action}")
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


def _move_companion(text: str, name: str, version: str, hashes: list[str]) -> str:
    table = re.search(rf"^\[companions\.{re.escape(name)}\]\n(.*?)(?=^\[|\Z)", text, re.M | re.S)
    if table is None:
        return text
    block = re.sub(r'^version = "[^"]*"', f'version = "{version}"', table.group(1), flags=re.M)
    listed = ", ".join(f'"{digest}"' for digest in hashes)
    block = re.sub(r"^sha256 = \[[^\]]*\]", f"sha256 = [{listed}]", block, flags=re.M)
    return text[: table.start(1)] + block + text[table.end(1) :]


def _applied_upstream_in(patch: Path, version: str) -> bool:
    """Whether the patch's DEP-3 Applied-Upstream names a release at or below `version`."""
    field = parse_dep3(patch.read_text()).get("Applied-Upstream", "")
    match = re.search(r"\d+(?:\.\d+)+(?:\.post\d+)?", field)
    return match is not None and Version(match.group(0)) <= Version(version)


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


def write(
    results: list[Candidate], pins: Pins, pins_file: Path, patches_root: Path, scratch: Path
) -> list[str]:
    """Apply the candidates: new pins (the flashinfer-cubin companion moves with FlashInfer);
    patches proven upstream (every hunk reverse-applies, or Applied-Upstream names a release
    at or below the candidate) dropped from their series with a comment; patches upstream
    in another form kept, marked for review. Everything is worked out before anything is
    written. Returns what was done, for the user."""
    text = pins_file.read_text()
    done = []
    series_texts: dict[Path, str] = {}
    dropped: list[Path] = []
    for result in results:
        if result.upstream.name == "flashinfer" and "flashinfer-cubin" in pins.companions:
            version = result.upstream.version
            hashes = companion_hashes("flashinfer-cubin", version, scratch / "cubin")
            text = _move_companion(text, "flashinfer-cubin", version, hashes)
            done.append(f"pins.toml: flashinfer-cubin -> {version}")
        upstream = result.upstream
        table_match = re.search(
            rf"^\[upstream\.{re.escape(upstream.name)}\]\n(.*?)(?=^\[|\Z)", text, re.M | re.S
        )
        if table_match is None:
            raise UserError(f"{pins_file} has no [upstream.{upstream.name}] table to update")
        block = table_match.group(1)
        for key in ("version", "sdist", "sha256", "git_tag", "git_commit"):
            block = re.sub(
                rf'^{key} = "[^"]*"', f'{key} = "{getattr(upstream, key)}"', block, flags=re.M
            )
        text = text[: table_match.start(1)] + block + text[table_match.end(1) :]
        done.append(f"pins.toml: {upstream.name} -> {upstream.project} {upstream.version}")
        series = patches_root / upstream.name / "series"
        lines = series.read_text().splitlines()
        for patch in result.patches:
            path = patches_root / upstream.name / patch.patch
            proven = patch.verdict == "upstream" or (
                patch.action == "review" and _applied_upstream_in(path, upstream.version)
            )
            mine = [
                n
                for n, line in enumerate(lines)
                if line.split("#", 1)[0].split()[:1] == [patch.patch]
            ]
            if proven:
                for n in mine:
                    lines[n] = (
                        f"# {patch.patch}: dropped, {patch.verdict} in {upstream.project} "
                        f"{upstream.version} (nox -s bump)"
                    )
                dropped.append(path)
                done.append(f"patches/{upstream.name}: dropped {patch.patch} ({patch.verdict})")
            elif patch.action == "review":
                for n in reversed(mine):
                    lines.insert(
                        n,
                        f"# REVIEW {patch.patch}: upstream in another form in {upstream.project} "
                        f"{upstream.version} (nox -s bump); kept until it is proven equivalent",
                    )
                done.append(f"patches/{upstream.name}: kept {patch.patch} for review")
        series_texts[series] = "".join(f"{line}\n" for line in lines)
    pins_file.write_text(text)
    for series, series_text in series_texts.items():
        series.write_text(series_text)
    for path in dropped:
        path.unlink(missing_ok=True)
    return done
