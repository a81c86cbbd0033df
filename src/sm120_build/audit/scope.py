"""What the audit vouches for: the files of the allreduce-fusion path, what a finding is,
and the waivers of gates left on purpose."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError
from ..pins import read_toml


@dataclass(frozen=True)
class ScopeEntry:
    """Files on the allreduce-fusion path; optionally only one function, or only statements
    whose source mentions `anchor`."""

    upstream: str
    pattern: str
    function: str | None = None
    anchor: str | None = None


_SCOPE_KEYS = ("upstream", "pattern", "function", "anchor")


def load_scope(path: Path) -> tuple[ScopeEntry, ...]:
    """The stack's audit-scope.toml: the files of its allreduce-fusion path."""
    entries = read_toml(path).get("scope", [])
    if not isinstance(entries, list) or not entries:
        raise UserError(f"{path}: no [[scope]] tables: the audit would vouch for nothing")
    scope = []
    for number, entry in enumerate(entries, start=1):
        if not isinstance(entry, dict) or set(entry) - set(_SCOPE_KEYS):
            raise UserError(f"{path}: scope {number} takes only {', '.join(_SCOPE_KEYS)}")
        if not all(isinstance(entry.get(key), str) for key in ("upstream", "pattern")):
            raise UserError(f"{path}: scope {number} needs upstream and pattern (strings)")
        scope.append(ScopeEntry(**entry))
    return tuple(scope)


@dataclass(frozen=True)
class Finding:
    kind: str  # "device" or "python"
    upstream: str
    file: str
    line: int
    function: str
    condition: str
    detail: str
    statement: str = field(default="", compare=False, repr=False)
    in_scope: bool = False
    waiver: str | None = None
    removed_by: str | None = None


@dataclass(frozen=True)
class Waiver:
    upstream: str
    file: str
    condition: str
    reason: str

    def matches(self, finding: Finding) -> bool:
        return (finding.upstream, finding.file) == (self.upstream, self.file) and (
            self.condition in finding.condition
        )


_WAIVER_KEYS = ("upstream", "file", "condition", "reason")


def load_waivers(path: Path) -> list[Waiver]:
    if not path.is_file():
        return []
    entries = read_toml(path).get("waiver", [])
    if not isinstance(entries, list):
        raise UserError(f"{path}: waivers are [[waiver]] tables; `waiver` is not a list of them")
    waivers = []
    for number, entry in enumerate(entries, start=1):
        if not isinstance(entry, dict):
            raise UserError(
                f"{path}: waiver {number} is {entry!r}, not a table with "
                f"{', '.join(_WAIVER_KEYS)}; write it as a [[waiver]] table"
            )
        missing = [k for k in _WAIVER_KEYS if not isinstance(entry.get(k), str) or not entry[k]]
        if missing:
            raise UserError(f"{path}: waiver {number} lacks {', '.join(missing)} (strings)")
        waivers.append(Waiver(**{k: entry[k] for k in _WAIVER_KEYS}))
    return waivers


def in_scope(finding: Finding, scope: tuple[ScopeEntry, ...]) -> bool:
    for entry in scope:
        if entry.upstream != finding.upstream or not fnmatch.fnmatch(finding.file, entry.pattern):
            continue
        if entry.function and finding.function != entry.function:
            continue
        if entry.anchor and entry.anchor not in finding.statement:
            continue
        return True
    return False


def missing_scope(tree: Path, upstream: str, scope: tuple[ScopeEntry, ...]) -> list[str]:
    """Scope patterns that match no file: a moved or renamed file must not pass silently."""
    return [
        f"{upstream}/{entry.pattern}"
        for entry in scope
        if entry.upstream == upstream and not any(tree.glob(entry.pattern))
    ]
