"""Find every arch gate that still excludes SM120, before and after the patches.

Device code is audited by compiling, not by grep: each trtllm_comm translation unit goes
through nvcc's real device-pass preprocessor for a reference arch upstream supports
(sm_100a) and for sm_120a, with the module's own flags. Source lines of the project's own
files that survive for sm_100a but vanish or change for sm_120a are gates, however they are
spelled (a macro whose definition depends on __CUDA_ARCH__ included).

Python is audited through its AST: capability gates that admit majors 9 and 10 but not 12.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import replace
from pathlib import Path

from ..errors import UserError
from ..gitrepo import export_tree, git
from ..patches import series_names
from ..toolkit import Toolkit
from ..vendor import read_state
from .device import device_findings, has_device_code
from .python_ast import python_files, python_findings
from .report import Report, classify
from .scope import Finding, ScopeEntry, Waiver, load_scope, load_waivers, missing_scope

__all__ = [
    "Finding",
    "Report",
    "ScopeEntry",
    "Waiver",
    "audit",
    "audit_tree",
    "classify",
    "has_device_code",
    "load_scope",
    "load_waivers",
    "missing_scope",
]


def removing_patch(
    tree: Path, base: str, patch_commits: list[tuple[str, str]], finding: Finding
) -> str | None:
    """The first patch whose commit's cumulative diff from `base` touches the line.

    patch_commits: (vendor commit, patch file name) for each commit above `base`, in order.
    """
    for commit, patch in patch_commits:
        diff = git(tree, "diff", "-U0", base, commit, "--", finding.file).stdout
        for start, count in re.findall(r"^@@ -(\d+)(?:,(\d+))? ", diff, re.MULTILINE):
            first, length = int(start), int(count or 1)
            if first <= finding.line < first + max(length, 1):
                return patch
    return None


def audit_tree(
    tree: Path,
    upstream: str,
    toolkit: Toolkit | None,
    whole_tree: bool,
    scope: tuple[ScopeEntry, ...],
) -> list[Finding]:
    findings = python_findings(tree, upstream, python_files(tree, upstream, whole_tree, scope))
    if toolkit is not None:
        findings += device_findings(tree, upstream, toolkit)
    return findings


def audit(
    vendor_root: Path,
    patches_root: Path,
    waivers: list[Waiver],
    scope: tuple[ScopeEntry, ...],
    toolkit: Toolkit,
    *,
    pristine: bool,
    whole_tree: bool,
) -> Report:
    """Audit vendor/<name> (or, with pristine, its unpatched base) for every upstream."""
    findings: list[Finding] = []
    missing: list[str] = []
    with tempfile.TemporaryDirectory(prefix="audit-") as scratch:
        for tree in sorted(p for p in vendor_root.iterdir() if (p / ".git").is_dir()):
            state = read_state(tree)
            if state is None:
                raise UserError(f"{tree} was not made by this tool; run `nox -s vendor`")
            audited = tree
            if pristine:
                audited = Path(scratch) / tree.name
                export_tree(tree, audited, state.base)
            missing += missing_scope(audited, tree.name, scope)
            found = audit_tree(
                audited.resolve(),
                tree.name,
                toolkit if has_device_code(audited) else None,
                whole_tree,
                scope,
            )
            if pristine:
                commits = git(tree, "rev-list", "--reverse", f"{state.base}..HEAD").stdout.split()
                series = series_names(patches_root / tree.name)
                patch_commits = list(zip(commits, series, strict=False))
                found = [
                    replace(f, removed_by=removing_patch(tree, state.base, patch_commits, f))
                    for f in found
                ]
            findings += found
    return replace(classify(findings, waivers, scope), missing_scope=missing)
