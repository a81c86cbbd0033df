"""The audit's report: findings classified by scope and waiver, as a table or JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from .scope import Finding, ScopeEntry, Waiver, in_scope


@dataclass
class Report:
    findings: list[Finding]
    stale_waivers: list[Waiver]
    missing_scope: list[str] = field(default_factory=list)

    @property
    def failing(self) -> list[Finding]:
        """In scope, not waived, and not removed by any patch of the series."""
        return [
            f for f in self.findings if f.in_scope and f.waiver is None and f.removed_by is None
        ]

    def as_json(self) -> dict[str, object]:
        return {
            "findings": [
                {k: v for k, v in asdict(f).items() if k != "statement"} for f in self.findings
            ],
            "stale_waivers": [asdict(w) for w in self.stale_waivers],
            "missing_scope": self.missing_scope,
            "failing": len(self.failing),
        }

    def table(self) -> str:
        rows = [("scope", "file:line", "function", "condition", "status")]
        for f in self.findings:
            if f.removed_by:
                status = f"removed by {f.removed_by}"
            elif f.waiver:
                status = f"waived: {_clip(f.waiver, 60)}"
            else:
                status = "GATE" if f.in_scope else "reported (out of scope)"
            rows.append(
                (
                    "in" if f.in_scope else "out",
                    f"{f.upstream}/{f.file}:{f.line}",
                    f.function,
                    _clip(f.condition, 70),
                    status,
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = [
            "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[4]
            for r in rows
        ]
        for waiver in self.stale_waivers:
            lines.append(
                f"stale waiver (matches nothing): {waiver.upstream}/{waiver.file}: "
                f"{waiver.condition}"
            )
        for pattern in self.missing_scope:
            lines.append(f"MISSING: no file matches the scoped {pattern}; the audit cannot vouch")
        lines.append(
            f"{len(self.findings)} findings; {len(self.failing)} in scope neither "
            "removed by a patch nor waived"
        )
        return "\n".join(lines)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def classify(
    findings: list[Finding], waivers: list[Waiver], scope: tuple[ScopeEntry, ...]
) -> Report:
    classified = []
    used: set[Waiver] = set()
    for finding in findings:
        waiver = next((w for w in waivers if w.matches(finding)), None)
        if waiver:
            used.add(waiver)
        classified.append(
            replace(
                finding,
                in_scope=in_scope(finding, scope),
                waiver=waiver.reason if waiver else None,
            )
        )
    return Report(findings=classified, stale_waivers=[w for w in waivers if w not in used])
