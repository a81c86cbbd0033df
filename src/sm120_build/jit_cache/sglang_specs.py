"""Render sglang's own JIT kernels (sglang 0.5.11 and later: sglang/kernels/) into build
recipes, with sglang's own loader. render.py runs it as a script with the Python of sglang's
own environment (sglang_env.py), the patched sglang tree first on PYTHONPATH: sglang's loader
imports the server's utilities, and so most of sglang's dependencies.

It reads {"recipes": {recipe: "module:expression"}, "arch": "12.0f", "workspace": DIR} on
stdin. Each recipe's loader runs as it would on a node: load_jit resolves the kernel's
sources and flags and generates the build.ninja it would compile
(kernels/jit/utils/compile/ninja.py generate); what is left out is the compile, sglang's
cache and the load. The wrappers sglang generates are written to DIR/sglang/<module>/, a
fixed path. It prints the modules, as jit_specs.py does, the tvm-ffi this environment
compiles against (the build compiles against its own, which must be the same release) and
where its packages are (a kernel's headers may come from them: CUTLASS's, from FlashInfer's
and DeepGEMM's packages, kernels/jit/utils/deps.py).

Of sm120_build it imports only sglang_kernels.py, which needs nothing but the standard
library: it runs in another Python.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import shlex
import sys
import sysconfig
from pathlib import Path
from typing import Any

from sm120_build.sglang_kernels import evaluate

_VARIABLE = re.compile(r"^(\w+) = (.*)$")
_BUILD = re.compile(r"^build (\S+): (compile_cxx|compile_cuda) (.+)$")


def parse_sglang_ninja(text: str, directory: Path) -> dict[str, Any]:
    """Sources and flags of the build.ninja sglang's loader generates (ninja.py generate):
    its generated sources are relative to the build directory, `directory` here."""
    variables: dict[str, str] = {}
    compiles: list[tuple[str, str]] = []
    for line in text.splitlines():
        if match := _VARIABLE.match(line):
            variables[match[1]] = match[2]
        elif match := _BUILD.match(line):
            source = re.sub(r"\$(.)", r"\1", match[3])  # ninja's $-escapes (ninja.py _escape)
            compiles.append(
                (match[2], source if source.startswith("/") else f"{directory}/{source}")
            )

    def flags(name: str) -> list[str]:
        return shlex.split(variables.get(name, "").replace("$$", "$"))

    return {
        "cuda_sources": [source for rule, source in compiles if rule == "compile_cuda"],
        "cxx_sources": [source for rule, source in compiles if rule == "compile_cxx"],
        "cuda_flags": flags("cudaflags"),
        "cxx_flags": flags("cxxflags"),
        "link_flags": flags("ldflags"),
        "device_link": False,
    }


class _Loaded:
    """What the loader returns instead of a module: a kernel module whose functions do
    nothing, for the loaders that call one right after loading it."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def render(recipes: dict[str, str], arch: str, workspace: Path) -> list[dict[str, Any]]:
    match = re.fullmatch(r"(\d+)\.(\d+)[af]?", arch)
    if match is None:
        raise SystemExit(f"--arch {arch}: not an arch sglang's loader can target")
    gpu = (int(match[1]), int(match[2]))
    # The loader's target for that GPU, as a node's sglang computes it; and the modules.
    evaluate("sglang.kernels.jit.utils.compile:None", gpu)
    from sglang.kernels.jit.utils.compile import cache, loader, ninja

    written: dict[str, Path] = {}
    # Every build asked for, in order: a loader that writes a module again (the same name)
    # is seen doing so, and its second version compared with the first.
    asked: list[str] = []

    def build(*, spec: Any, build_dir: Path, build_file: str) -> Path:
        name = str(spec.module_name)
        directory = workspace / "sglang" / name
        directory.mkdir(parents=True, exist_ok=True)
        for unit in spec.translation_units():
            if unit.source is not None:
                (directory / unit.filename).write_text(unit.source)
        (directory / "build.ninja").write_text(build_file)
        written[name] = directory
        asked.append(name)
        return directory / f"{name}.so"

    vars(ninja)["build"] = build
    vars(loader).update(
        _load=lambda library: _Loaded(),
        _find_prebuilt=lambda **kwargs: None,
        # Patch 0002's lookup of a prebuilt module: the render asks what would compile.
        _prebuilt_module=lambda module_name: None,
    )
    vars(cache)["commit_build"] = lambda *args, **kwargs: None
    names_of: dict[str, list[str]] = {}  # a loader caches its module: one call, one render
    modules: dict[str, dict[str, Any]] = {}
    for recipe, call in recipes.items():
        if call not in names_of:
            before = len(asked)
            evaluate(call, gpu)
            names_of[call] = list(dict.fromkeys(asked[before:]))
            if not names_of[call]:
                raise SystemExit(f"{call}: sglang's loader wrote no module to compile")
        for name in names_of[call]:
            ninja_text = (written[name] / "build.ninja").read_text()
            module = {
                "name": name,
                "recipe": recipe,
                **parse_sglang_ninja(ninja_text, written[name]),
            }
            previous = modules.get(name)
            if previous is not None and {**previous, "recipe": recipe} != module:
                raise SystemExit(f"JIT module {name} is made two different ways")
            modules.setdefault(name, module)
    return sorted(modules.values(), key=lambda module: str(module["name"]))


def main() -> None:
    request = json.load(sys.stdin)
    from tvm_ffi import libinfo

    json.dump(
        {
            "modules": render(request["recipes"], request["arch"], Path(request["workspace"])),
            "tvm_ffi": {
                "version": importlib.metadata.version("apache-tvm-ffi"),
                "include": libinfo.find_include_path(),
                "dlpack": libinfo.find_dlpack_include_path(),
                "lib_dir": str(Path(libinfo.find_libtvm_ffi()).parent),
            },
            "purelib": sysconfig.get_paths()["purelib"],
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main()
