"""Render FlashInfer JIT modules into build recipes, with FlashInfer's own code.

Run as `python -m sm120_build.jit_cache.jit_specs` by render.render_modules, in a child
process whose PYTHONPATH puts the patched FlashInfer sources first and whose environment
sets FLASHINFER_CUDA_ARCH_LIST, CUDA_HOME and FLASHINFER_WORKSPACE_BASE. It reads
{"recipes": {recipe: "module:expression"}} on stdin and prints, per JIT module, what
FlashInfer's JIT would run: the ninja file FlashInfer writes for the module
(flashinfer/jit/cpp_ext.py generate_ninja_build_for_op) is parsed, so the sources, flags,
include paths and link flags are FlashInfer's, not a copy of them.

Imports of flashinfer and torch are deferred to main(): this module is also imported by the
build for `parse_ninja`, where neither is needed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any

from ..profiles import specs_of
from ..sglang_kernels import evaluate, is_sglang_call

_VARIABLE = re.compile(r"^(\w+) = (.*)$")
_BUILD = re.compile(r"^build (\S+): (\w+) (.+)$")


def parse_ninja(text: str) -> dict[str, Any]:
    """Variables, compile steps and the link step of one FlashInfer ninja file."""
    text = text.replace("$\n    ", "")  # join FlashInfer's continuation lines
    variables: dict[str, str] = {}
    compiles: list[tuple[str, str]] = []  # (rule, source)
    link_rule = ""
    for line in text.splitlines():
        if match := _VARIABLE.match(line):
            variables[match.group(1)] = match.group(2)
        elif match := _BUILD.match(line):
            rule, inputs = match.group(2), match.group(3)
            if rule in ("compile", "cuda_compile"):
                compiles.append((rule, inputs))
            else:
                link_rule = rule

    def expand(name: str) -> list[str]:
        value = variables.get(name, "")
        value = value.replace("$common_cflags", variables.get("common_cflags", ""))
        value = value.replace("$cuda_home", variables["cuda_home"])
        return shlex.split(value)

    return {
        "cuda_sources": [source for rule, source in compiles if rule == "cuda_compile"],
        "cxx_sources": [source for rule, source in compiles if rule == "compile"],
        "cuda_flags": expand("cuda_cflags"),
        "cxx_flags": expand("cflags"),
        "link_flags": expand("ldflags"),
        "device_link": link_rule == "nvcc_link",
    }


def parse_tvm_ffi_ninja(text: str) -> dict[str, Any]:
    """Sources and flags of the build.ninja tvm-ffi writes for a load_inline module
    (tvm_ffi/cpp/extension.py _generate_ninja_build)."""
    variables: dict[str, str] = {}
    compiles: list[tuple[str, str]] = []
    # tvm-ffi escapes ':' as ninja's '$:' in the include paths it writes into the flags and
    # in the sources; ninja passes ':' on.
    for line in text.replace("$:", ":").splitlines():
        if match := _VARIABLE.match(line):
            variables[match.group(1)] = match.group(2)
        elif (match := _BUILD.match(line)) and match.group(2) in ("compile", "compile_cuda"):
            compiles.append((match.group(2), match.group(3)))
    return {
        "cuda_sources": [source for rule, source in compiles if rule == "compile_cuda"],
        "cxx_sources": [source for rule, source in compiles if rule == "compile"],
        # cxxflags and ldflags are always written; cuda_cflags only for CUDA sources.
        "cuda_flags": shlex.split(variables.get("cuda_cflags", "")),
        "cxx_flags": shlex.split(variables["cxxflags"]),
        "link_flags": shlex.split(variables["ldflags"]),
        "device_link": False,
    }


def sglang_kernels(call: str) -> list[tuple[str, dict[str, Any]]]:
    """(module name, sources and flags) of each kernel module a sglang recipe loads:
    sglang's own loader runs, and tvm-ffi writes the sources and build.ninja it would
    compile; the compile and the load are what is left out."""
    from tvm_ffi.cpp import extension

    written: list[Path] = []
    vars(extension).update(
        build_ninja=lambda build_dir: written.append(Path(build_dir)),
        load_module=lambda *args, **kwargs: None,  # nothing was built to load
    )
    # Patch 0003 has the loader return a prebuilt module from flashinfer-jit-cache when the
    # importable Python has one, and then it writes nothing: a jit-cache installed where the
    # build runs would drop its kernels from the next one. The render asks what sglang would
    # compile, so that lookup finds no jit-cache (None in sys.modules: ImportError).
    sys.modules["flashinfer_jit_cache"] = None  # type: ignore[assignment]
    major, minor = os.environ["TVM_FFI_CUDA_ARCH_LIST"].split()[0].split(".")
    evaluate(call, (int(major), int(minor)))
    if not written:
        raise SystemExit(f"{call}: sglang's loader wrote no module to compile")
    kernels = []
    for build_dir in written:
        ninja = (build_dir / "build.ninja").read_text()
        (name,) = re.findall(r"^build (\S+)\.so: link ", ninja, re.M)
        kernels.append((name, parse_tvm_ffi_ninja(ninja)))
    return kernels


def render(recipes: dict[str, str]) -> list[dict[str, Any]]:
    modules: dict[str, dict[str, Any]] = {}
    for recipe, call in recipes.items():
        for name, parts in _modules_of(call):
            module = {"name": name, "recipe": recipe, **parts}
            previous = modules.get(name)
            if previous is not None and {**previous, "recipe": recipe} != module:
                raise SystemExit(f"JIT module {name} is made two different ways")
            modules.setdefault(name, module)
    return sorted(modules.values(), key=lambda module: str(module["name"]))


def _modules_of(call: str) -> list[tuple[str, dict[str, Any]]]:
    if is_sglang_call(call):
        return sglang_kernels(call)
    from flashinfer.jit import cpp_ext

    modules = []
    for spec in specs_of(call):
        ninja = cpp_ext.generate_ninja_build_for_op(
            spec.name,
            spec.sources,
            spec.extra_cflags,
            spec.extra_cuda_cflags,
            spec.extra_ldflags,
            spec.extra_include_dirs,
            spec.needs_device_linking,
        )
        modules.append((spec.name, parse_ninja(ninja)))
    return modules


def main() -> None:
    request = json.load(sys.stdin)
    json.dump(render(request["recipes"]), sys.stdout)


if __name__ == "__main__":
    main()
