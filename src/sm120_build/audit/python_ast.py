"""Python, audited through its AST: capability gates that admit majors 9 and 10 but not 12
(supported_major_versions lists, is_sm90/is_sm100 combinations without is_sm120,
comparisons on get_device_capability() results, aliases included, aot.py's arch flags)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

from .scope import Finding, ScopeEntry

_SM_PREDICATE = re.compile(r"^_?is_sm(\d+)(?:_supported)?$")
_HAS_SM = re.compile(r"^has_sm(\d+)\w*$")
_CAPABILITY_CALLS = {"get_device_capability", "get_compute_capability"}


def _sm_major(number: str) -> int:
    return int(number) // 10


def _int_constants(nodes: list[ast.expr]) -> set[int]:
    return {e.value for e in nodes if isinstance(e, ast.Constant) and isinstance(e.value, int)}


def _call_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        func = node.func
        return func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
    return None


class _Module(ast.NodeVisitor):
    def __init__(self, upstream: str, file: str, source: str) -> None:
        self.upstream, self.file, self.source = upstream, file, source
        self.predicates: dict[str, set[int]] = {}  # local name -> majors it tests for
        self.capability_major: set[str] = set()  # names bound to a capability's major
        self.capability_tuple: set[str] = set()  # names bound to a (major, minor) tuple
        self.stack: list[ast.AST] = []
        self.findings: list[Finding] = []

    # -- what names mean
    def predicate_majors(self, node: ast.AST) -> set[int]:
        """Majors an expression's capability predicates test for (calls, aliases, flags)."""
        majors: set[int] = set()
        for sub in ast.walk(node):
            # A call, a name, or an attribute: sglang 0.5.23 asks `get_platform().is_sm90`.
            name = (
                _call_name(sub)
                or (sub.id if isinstance(sub, ast.Name) else None)
                or (sub.attr if isinstance(sub, ast.Attribute) else None)
            )
            if name is None:
                continue
            match = _SM_PREDICATE.match(name)
            if match:
                majors.add(_sm_major(match.group(1)))
            majors |= self.predicates.get(name, set())
        return majors

    def is_capability(self, node: ast.AST) -> bool:
        return _call_name(node) in _CAPABILITY_CALLS or (
            isinstance(node, ast.Name) and node.id in self.capability_tuple
        )

    def is_major(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.capability_major
        return (
            isinstance(node, ast.Subscript)
            and self.is_capability(node.value)
            and isinstance(node.slice, ast.Constant)
            and node.slice.value == 0
        )

    # -- binding
    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            match = _SM_PREDICATE.match(alias.name)
            if match and alias.asname:
                self.predicates[alias.asname] = {_sm_major(match.group(1))}

    def visit_Assign(self, node: ast.Assign) -> None:
        majors = self.predicate_majors(node.value)
        for target in node.targets:
            if isinstance(target, ast.Name):
                if majors:  # an alias or a cached result of capability predicates
                    self.predicates[target.id] = majors
                if self.is_capability(node.value):
                    self.capability_tuple.add(target.id)
                elif self.is_major(node.value):
                    self.capability_major.add(target.id)
            elif (
                isinstance(target, ast.Tuple)
                and self.is_capability(node.value)
                and target.elts
                and isinstance(target.elts[0], ast.Name)
            ):
                self.capability_major.add(target.elts[0].id)
        self.generic_visit(node)

    # -- context
    def generic_visit(self, node: ast.AST) -> None:
        self.stack.append(node)
        super().generic_visit(node)
        self.stack.pop()

    def report(self, node: ast.expr, detail: str, statement: ast.AST | None = None) -> None:
        function = next(
            (
                n.name
                for n in reversed(self.stack)
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
            ),
            "(module)",
        )
        if statement is None:
            statement = next((n for n in reversed(self.stack) if isinstance(n, ast.stmt)), node)
        self.findings.append(
            Finding(
                kind="python",
                upstream=self.upstream,
                file=self.file,
                line=node.lineno,
                function=function,
                condition=" ".join(
                    (ast.get_source_segment(self.source, node) or ast.unparse(node)).split()
                ),
                detail=detail,
                statement=ast.get_source_segment(self.source, statement) or "",
            )
        )

    # -- gates
    def visit_keyword(self, node: ast.keyword) -> None:
        if node.arg == "supported_major_versions" and isinstance(
            node.value, ast.List | ast.Tuple | ast.Set
        ):
            majors = _int_constants(node.value.elts)
            if majors & {9, 10} and 12 not in majors:
                self.report(node.value, f"arch filter admits majors {sorted(majors)}, not 12")
        self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        if isinstance(node.op, ast.Or):
            majors = set().union(*(self.predicate_majors(v) for v in node.values))
            if majors & {9, 10} and 12 not in majors and len(node.values) > 1:
                self.report(node, f"capability check admits SM{sorted(majors)}, not SM12x")
            equal = self.equality_majors(node)
            if equal and equal & {9, 10} and 12 not in equal:
                self.report(node, f"capability major must be one of {sorted(equal)}")
        self.generic_visit(node)

    def equality_majors(self, node: ast.BoolOp) -> set[int] | None:
        majors: set[int] = set()
        for value in node.values:
            if not (
                isinstance(value, ast.Compare)
                and len(value.ops) == 1
                and isinstance(value.ops[0], ast.Eq)
                and self.is_major(value.left)
                and isinstance(value.comparators[0], ast.Constant)
                and isinstance(value.comparators[0].value, int)
            ):
                return None
            majors.add(value.comparators[0].value)
        return majors

    def visit_Compare(self, node: ast.Compare) -> None:
        left, op, right = node.left, node.ops[0], node.comparators[0]
        if self.is_major(left) and len(node.ops) == 1:
            if isinstance(op, ast.In | ast.NotIn) and isinstance(
                right, ast.Tuple | ast.List | ast.Set
            ):
                majors = _int_constants(right.elts)
                if isinstance(op, ast.In) and majors & {9, 10} and 12 not in majors:
                    self.report(node, f"capability major must be one of {sorted(majors)}")
            elif isinstance(right, ast.Constant) and isinstance(right.value, int):
                bound = right.value
                if (isinstance(op, ast.Lt) and 9 < bound <= 12) or (
                    isinstance(op, ast.LtE) and 9 <= bound < 12
                ):
                    self.report(node, f"capability major bounded below 12 ({ast.unparse(node)})")
        self.generic_visit(node)

    def visit_If(self, node: ast.If) -> None:
        flags = {
            n.id for n in ast.walk(node.test) if isinstance(n, ast.Name) and _HAS_SM.match(n.id)
        }
        majors = {_sm_major(match.group(1)) for n in flags if (match := _HAS_SM.match(n))}
        if majors & {9, 10} and 12 not in majors:
            self.report(node.test, f"arch list gate admits {sorted(flags)}, not sm12x", node)
        self.generic_visit(node)


def python_findings(tree: Path, upstream: str, files: Iterable[Path]) -> list[Finding]:
    findings: list[Finding] = []
    for path in files:
        source = path.read_text(errors="replace")
        try:
            module = ast.parse(source)
        except SyntaxError:
            continue
        visitor = _Module(upstream, str(path.relative_to(tree)), source)
        visitor.visit(module)
        findings += visitor.findings
    return findings


def python_files(
    tree: Path, upstream: str, whole_tree: bool, scope: tuple[ScopeEntry, ...]
) -> list[Path]:
    if whole_tree:
        return sorted(p for p in tree.rglob("*.py") if ".git" not in p.parts)
    return sorted(
        {
            path
            for entry in scope
            if entry.upstream == upstream and entry.pattern.endswith(".py")
            for path in tree.glob(entry.pattern)
        }
    )
