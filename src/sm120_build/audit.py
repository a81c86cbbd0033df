"""Find every arch gate that still excludes SM120, before and after the patches.

Device code is audited by compiling, not by grep: each trtllm_comm translation unit goes
through nvcc's real device-pass preprocessor for a reference arch upstream supports
(sm_100a) and for sm_120a, with the module's own flags. Source lines of the project's own
files that survive for sm_100a but vanish or change for sm_120a are gates, however they are
spelled (a macro whose definition depends on __CUDA_ARCH__ included).

Python is audited through its AST: capability gates that admit majors 9 and 10 but not 12.
"""

from __future__ import annotations

import ast
import fnmatch
import os
import re
import subprocess
import sysconfig
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from .build import tvm_ffi_include_dirs
from .errors import UserError
from .gitrepo import export_tree, git
from .patches import series_names
from .pins import read_toml
from .toolkit import Toolkit
from .vendor import read_state

# The audit preprocesses trtllm_comm's translation units (flashinfer/jit/comm.py) the way
# FlashInfer's JIT compiles them (flashinfer/jit/core.py gen_jit_spec, cpp_ext.py; CUDA >= 12.8,
# non-debug), for a reference arch and the target, to find code the target loses. Only the
# preprocessor sees these; the build takes its flags from FlashInfer itself (jit_specs.py).
TRTLLM_COMM_SOURCES = (
    "csrc/trtllm_allreduce.cu",
    "csrc/trtllm_allreduce_fusion.cu",
    "csrc/trtllm_moe_allreduce_fusion.cu",
)
TRTLLM_COMM_DEFINES = (
    "FLASHINFER_ENABLE_F16",
    "FLASHINFER_ENABLE_BF16",
    "FLASHINFER_ENABLE_FP8_E4M3",
    "FLASHINFER_ENABLE_FP8_E5M2",
    "FLASHINFER_ENABLE_FP8_E8M0",
    "FLASHINFER_ENABLE_FP4_E2M1",
    "NDEBUG",
    "Py_LIMITED_API=0x03090000",
    "_GLIBCXX_USE_CXX11_ABI=1",
)
TRTLLM_COMM_CUDA_FLAGS = (
    "-O3",
    "--threads=1",
    "-use_fast_math",
    "--expt-relaxed-constexpr",
    "-static-global-template-stub=false",
)


def include_dirs(tree: Path, toolkit: Toolkit) -> list[str]:
    """The include path of FlashInfer's JIT build, in its order, for a flashinfer tree."""
    return [
        sysconfig.get_path("include"),
        str(toolkit.home / "include"),
        str(toolkit.home / "include" / "cccl"),
        *tvm_ffi_include_dirs(),
        str(tree / "include"),
        str(tree / "csrc"),
        str(tree / "3rdparty" / "cutlass" / "include"),
        str(tree / "3rdparty" / "cutlass" / "tools" / "util" / "include"),
        str(tree / "3rdparty" / "spdlog" / "include"),
    ]


REFERENCE_ARCH = "100a"  # an arch upstream's trtllm_comm supports
TARGET_ARCH = "120a"


@dataclass(frozen=True)
class ScopeEntry:
    """Files on the allreduce-fusion path; optionally only one function, or only statements
    whose source mentions `anchor`."""

    upstream: str
    pattern: str
    function: str | None = None
    anchor: str | None = None


SCOPE = (
    ScopeEntry("flashinfer", "csrc/trtllm_allreduce.cu"),
    ScopeEntry("flashinfer", "csrc/trtllm_allreduce_fusion.cu"),
    ScopeEntry("flashinfer", "csrc/trtllm_moe_allreduce_fusion.cu"),
    ScopeEntry("flashinfer", "include/flashinfer/*"),  # what those translation units include
    ScopeEntry("flashinfer", "flashinfer/comm/*.py"),
    ScopeEntry("flashinfer", "flashinfer/jit/comm.py"),
    ScopeEntry("flashinfer", "flashinfer/aot.py", anchor="gen_trtllm_comm_module"),
    ScopeEntry("sglang", "sglang/srt/layers/communicator.py"),
    ScopeEntry("sglang", "sglang/srt/layers/flashinfer_comm_fusion.py"),
    ScopeEntry("sglang", "sglang/srt/layers/layernorm.py"),
    ScopeEntry(
        "sglang",
        "sglang/srt/model_executor/model_runner.py",
        function="_should_run_flashinfer_autotune",
    ),
    ScopeEntry("sglang", "sglang/srt/server_args.py", anchor="enable_flashinfer_allreduce_fusion"),
)


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


def in_scope(finding: Finding) -> bool:
    for entry in SCOPE:
        if entry.upstream != finding.upstream or not fnmatch.fnmatch(finding.file, entry.pattern):
            continue
        if entry.function and finding.function != entry.function:
            continue
        if entry.anchor and entry.anchor not in finding.statement:
            continue
        return True
    return False


# --- device code ---------------------------------------------------------------------------

_LINEMARKER = re.compile(r'^# (\d+) "([^"]+)"')
_DIRECTIVE = re.compile(r"^\s*#\s*(if|ifdef|ifndef|elif|else|endif)\b(.*)$")


def preprocess(tree: Path, source: str, arch: str, toolkit: Toolkit) -> str:
    """nvcc's device-pass preprocessor output for one translation unit and arch."""
    command = [
        str(toolkit.nvcc),
        "-E",
        "-std=c++17",
        f"-gencode=arch=compute_{arch},code=sm_{arch}",
        *TRTLLM_COMM_CUDA_FLAGS,
        *(f"-D{d}" for d in TRTLLM_COMM_DEFINES),
        *(arg for path in include_dirs(tree, toolkit) for arg in ("-isystem", path)),
        str(tree / source),
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise UserError(f"nvcc -E {source} for sm_{arch} failed:\n{result.stderr[-3000:]}")
    return result.stdout


def source_lines(preprocessed: str, tree: Path) -> dict[tuple[str, int], str]:
    """(file relative to tree, line) -> preprocessed text, for the tree's own files only."""
    lines: dict[tuple[str, int], str] = {}
    root = str(tree.resolve()) + os.sep
    current: str | None = None
    number = 0
    for text in preprocessed.splitlines():
        marker = _LINEMARKER.match(text)
        if marker:
            path = os.path.normpath(marker.group(2))
            current = path[len(root) :] if path.startswith(root) else None
            number = int(marker.group(1))
            continue
        if current is not None and text.strip():
            lines[(current, number)] = " ".join(text.split())
        number += 1
    return lines


def enclosing_condition(lines: list[str], index: int) -> tuple[int, str]:
    """The #if/#elif/#else above lines[index] (0-based) at nesting depth 0: (line, text)."""
    depth = 0
    for i in range(index - 1, -1, -1):
        match = _DIRECTIVE.match(lines[i])
        if not match:
            continue
        keyword = match.group(1)
        if keyword == "endif":
            depth += 1
        elif keyword in ("if", "ifdef", "ifndef"):
            if depth == 0:
                return i + 1, lines[i].strip()
            depth -= 1
        elif depth == 0:  # elif / else of the enclosing block
            opening = enclosing_condition(lines, i)
            return i + 1, f"{lines[i].strip()} (of {opening[1]})"
    return 0, "(no enclosing #if: the line's macro expansion differs)"


_CALLED = re.compile(r"([A-Za-z_]\w*)\s*\(")
_NOT_A_NAME = {
    "__launch_bounds__",
    "if",
    "for",
    "while",
    "switch",
    "return",
    "sizeof",
    "constexpr",
    "defined",
    "decltype",
    "static_assert",
    "alignas",
    "__attribute__",
}


def enclosing_function(lines: list[str], index: int) -> str:
    """The function or kernel whose body holds lines[index]: the nearest signature above."""
    for i in range(index - 1, -1, -1):
        text = lines[i]
        indent = len(text) - len(text.lstrip())
        stripped = text.strip()
        if indent > 2 or not stripped or stripped[0] in "#/}*" or stripped.endswith(";"):
            continue
        signature = stripped
        for follow in lines[i + 1 : i + 6]:
            if "{" in signature or ";" in signature:
                break
            signature += " " + follow.strip()
        if "{" not in signature or signature.index("{") < signature.find("("):
            continue
        names = [
            n for n in _CALLED.findall(signature[: signature.index("{")]) if n not in _NOT_A_NAME
        ]
        if names:
            return str(names[0])
    return "(file scope)"


def device_findings(tree: Path, upstream: str, toolkit: Toolkit) -> list[Finding]:
    findings: dict[tuple[str, int], Finding] = {}
    for source in TRTLLM_COMM_SOURCES:
        reference = source_lines(preprocess(tree, source, REFERENCE_ARCH, toolkit), tree)
        target = source_lines(preprocess(tree, source, TARGET_ARCH, toolkit), tree)
        lost = sorted(key for key, text in reference.items() if target.get(key) != text)
        for file, group in _regions(lost):
            text = (tree / file).read_text(errors="replace").splitlines()
            first, last = group[0], group[-1]
            directive_line, condition = enclosing_condition(text, first - 1)
            changed = all((file, n) in target for n in group)
            key = (file, directive_line or first)
            if key in findings:
                continue
            findings[key] = Finding(
                kind="device",
                upstream=upstream,
                file=file,
                line=directive_line or first,
                function=enclosing_function(text, first - 1),
                condition=condition,
                detail=(
                    f"lines {first}-{last} "
                    f"{'change' if changed else 'vanish'} for sm_{TARGET_ARCH} "
                    f"(kept for sm_{REFERENCE_ARCH})"
                ),
            )
    return sorted(findings.values(), key=lambda f: (f.file, f.line))


def _regions(keys: list[tuple[str, int]]) -> Iterator[tuple[str, list[int]]]:
    """Group (file, line) keys into runs of nearby lines (gaps of blank lines allowed)."""
    group: list[int] = []
    current = ""
    for file, line in keys:
        if file != current or (group and line - group[-1] > 3):
            if group:
                yield current, group
            group, current = [], file
        group.append(line)
    if group:
        yield current, group


# --- Python ----------------------------------------------------------------------------------

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
            name = _call_name(sub) or (sub.id if isinstance(sub, ast.Name) else None)
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


def python_files(tree: Path, upstream: str, whole_tree: bool) -> list[Path]:
    if whole_tree:
        return sorted(p for p in tree.rglob("*.py") if ".git" not in p.parts)
    return sorted(
        {
            path
            for entry in SCOPE
            if entry.upstream == upstream and entry.pattern.endswith(".py")
            for path in tree.glob(entry.pattern)
        }
    )


# --- the report ------------------------------------------------------------------------------


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


def classify(findings: list[Finding], waivers: list[Waiver]) -> Report:
    classified = []
    used: set[Waiver] = set()
    for finding in findings:
        waiver = next((w for w in waivers if w.matches(finding)), None)
        if waiver:
            used.add(waiver)
        classified.append(
            replace(finding, in_scope=in_scope(finding), waiver=waiver.reason if waiver else None)
        )
    return Report(findings=classified, stale_waivers=[w for w in waivers if w not in used])


# --- running it on the trees -----------------------------------------------------------------


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


def missing_scope(tree: Path, upstream: str) -> list[str]:
    """Scope patterns that match no file: a moved or renamed file must not pass silently."""
    return [
        f"{upstream}/{entry.pattern}"
        for entry in SCOPE
        if entry.upstream == upstream and not any(tree.glob(entry.pattern))
    ]


def has_device_code(tree: Path) -> bool:
    return all((tree / source).is_file() for source in TRTLLM_COMM_SOURCES)


def audit_tree(
    tree: Path, upstream: str, toolkit: Toolkit | None, whole_tree: bool
) -> list[Finding]:
    findings = python_findings(tree, upstream, python_files(tree, upstream, whole_tree))
    if toolkit is not None:
        findings += device_findings(tree, upstream, toolkit)
    return findings


def audit(
    vendor_root: Path,
    patches_root: Path,
    waivers: list[Waiver],
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
            missing += missing_scope(audited, tree.name)
            found = audit_tree(
                audited.resolve(),
                tree.name,
                toolkit if has_device_code(audited) else None,
                whole_tree,
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
    return replace(classify(findings, waivers), missing_scope=missing)
