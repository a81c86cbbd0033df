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
import re
import shlex
import sys
from typing import Any

from ..profiles import specs_of

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


def render(recipes: dict[str, str]) -> list[dict[str, Any]]:
    from flashinfer.jit import cpp_ext

    modules: dict[str, dict[str, Any]] = {}
    for recipe, call in recipes.items():
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
            module = {"name": spec.name, "recipe": recipe, **parse_ninja(ninja)}
            previous = modules.get(spec.name)
            if previous is not None and {**previous, "recipe": recipe} != module:
                raise SystemExit(f"JIT module {spec.name} is made two different ways")
            modules.setdefault(spec.name, module)
    return sorted(modules.values(), key=lambda module: str(module["name"]))


def main() -> None:
    request = json.load(sys.stdin)
    json.dump(render(request["recipes"]), sys.stdout)


if __name__ == "__main__":
    main()
