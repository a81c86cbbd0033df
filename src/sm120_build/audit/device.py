"""Device code, audited by compiling: each trtllm_comm translation unit goes through nvcc's
real device-pass preprocessor for a reference arch upstream supports (sm_100a) and for
sm_120a, with the module's own flags; lines that survive for the reference but vanish or
change for the target are gates, however they are spelled."""

from __future__ import annotations

import os
import re
import subprocess
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from ..errors import UserError
from ..jit_cache.cmake import tvm_ffi_include_dirs
from ..toolkit import Toolkit
from .scope import Finding

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


def has_device_code(tree: Path) -> bool:
    return all((tree / source).is_file() for source in TRTLLM_COMM_SOURCES)
