"""`sm120-node-check` (or `nox -s node_check` from a checkout): on a serving node, prove that
FlashInfer and sglang will not JIT-compile.

Runs where torch and the wheelhouse's wheels are installed; it installs nothing unless
--install DIR asks it to. For every module of
the profile (by default the recipes the installed jit-cache wheel records it was built
from), it asks the installed FlashInfer for the module, as the serving path would, and
loads it with FLASHINFER_DISABLE_JIT=1. It fails, naming the cause, when

- a module would be JIT-compiled (no prebuilt .so), or fails to load;
- the jit-cache wheel carries no code for this GPU's arch (its provenance's arch list
  against torch.cuda.get_device_capability(), or --arch MAJOR.MINOR without a GPU);
- flashinfer-python and flashinfer-jit-cache come from different patch series.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .. import sglang_kernels
from ..errors import UserError, exit_status
from ..layout import PROVENANCE_FILE
from ..profiles import load as load_profiles
from ..profiles import specs_of
from .install import add_node_options, disable_jit, install_checked

_SERIES = re.compile(r"^p[0-9a-f]{8}$")


def provenance(distribution: str) -> dict[str, Any]:
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise UserError(f"{distribution} is not installed in {sys.prefix}") from None
    text = dist.read_text(PROVENANCE_FILE)
    if text is None:
        raise UserError(
            f"{distribution} {dist.version} was not built by sm120-build (no {PROVENANCE_FILE})"
        )
    try:
        data: dict[str, Any] = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(
            f"{distribution} {dist.version}: its {PROVENANCE_FILE} is not valid JSON ({exc}); "
            "reinstall the wheel from the wheelhouse"
        ) from None
    return data


def patch_series(version: str) -> str | None:
    """The patch-series label (p<8 hex>) in a version's local part, if it has one."""
    local = version.partition("+")[2]
    return next((part for part in local.split(".") if _SERIES.match(part)), None)


def runs_on(arch: str, major: int, minor: int) -> bool:
    """Whether machine code built for `arch` (12.0a, 12.0f, 9.0) runs on sm_<major><minor>.
    a: that exact arch; f: the family (same major, this minor or a later one); plain: the
    same major, this minor or later. No PTX is shipped, so nothing runs across majors."""
    match = re.fullmatch(r"(\d+)\.(\d)([af]?)", arch)
    if match is None:
        return False
    built_major, built_minor, suffix = int(match.group(1)), int(match.group(2)), match.group(3)
    if built_major != major:
        return False
    return built_minor == minor if suffix == "a" else built_minor <= minor


def cuda_versions(toolkit: dict[str, Any] | None, gpu: bool) -> list[str]:
    """Say which CUDA each part is for: the node's torch, the jit-cache's toolkit, and (with
    a GPU) the driver; a driver too old for the toolkit cannot run the modules at all."""
    import torch

    built = str((toolkit or {}).get("cuda", "?"))
    line = f"CUDA: torch {torch.version.cuda or 'CPU only'}, jit-cache built with {built}"
    problems = []
    if gpu and torch.cuda.is_available():
        import pynvml  # nvidia-ml-py, which FlashInfer requires

        pynvml.nvmlInit()
        driver = driver_cuda(pynvml.nvmlSystemGetCudaDriverVersion())
        line += f", driver supports {driver[0]}.{driver[1]}"
        problems += driver_problems(built, driver)
    print(line)
    return problems


def driver_cuda(raw: int) -> tuple[int, int]:
    """NVML's CUDA version of the driver (13000 for 13.0, 12090 for 12.9) as (major, minor)."""
    return raw // 1000, raw % 1000 // 10


def driver_problems(built: str, driver: tuple[int, int]) -> list[str]:
    """A driver supports the CUDA of its own version and every earlier one; "?" (a jit-cache
    that records no toolkit) asks for nothing."""
    wanted = tuple(int(part) for part in built.split(".")[:2]) if built != "?" else (0, 0)
    if driver >= wanted:
        return []
    return [
        f"the jit-cache was built with CUDA {built}, which this driver (CUDA "
        f"{driver[0]}.{driver[1]}) cannot run: install a driver for CUDA {built} "
        "(>= 580 for 13.0), or use a jit-cache built with --cuda-home for your CUDA"
    ]


def device_arch(requested: str | None) -> tuple[int, int, str]:
    """(major, minor, how it was found): --arch, else the first visible GPU."""
    if requested is not None:
        # The build's spellings too: a node checks for the GPU, whatever the suffix built.
        match = re.fullmatch(r"(\d+)\.(\d)[af]?", requested)
        if match is None:
            raise UserError(f"--arch {requested!r}: expected MAJOR.MINOR, e.g. 12.0 (or 12.0f)")
        return int(match.group(1)), int(match.group(2)), "--arch"
    import torch

    if not torch.cuda.is_available():
        raise UserError("no CUDA GPU is visible; on a machine without one, pass --arch 12.0")
    major, minor = torch.cuda.get_device_capability(0)
    return major, minor, torch.cuda.get_device_name(0)


def check_sglang_kernel(recipe: str, call: str, major: int) -> tuple[dict[str, Any], list[str]]:
    """Load one of sglang's own JIT kernels as the serving path does (its loader, through
    the installed sglang's load_jit), with SGLANG_DISABLE_JIT=1, no nvcc on PATH and an
    empty tvm-ffi cache: it loads from the jit-cache wheel, or the check names it."""
    result: dict[str, Any] = {"module": recipe, "recipe": recipe, "aot": False, "loaded": False}
    with tempfile.TemporaryDirectory(prefix="tvm-ffi-cache-") as empty:
        saved = {name: os.environ.get(name) for name in ("PATH", "TVM_FFI_CACHE_DIR")}
        os.environ.update(
            SGLANG_DISABLE_JIT="1",
            TVM_FFI_CACHE_DIR=empty,
            PATH=os.pathsep.join(
                d for d in os.environ.get("PATH", "").split(os.pathsep) if not _has_nvcc(d)
            ),
        )
        started = time.perf_counter()
        try:
            module = sglang_kernels.evaluate(call, major)
        except Exception as exc:  # report every kernel, then fail once
            return result, [f"{recipe}: sglang's kernel does not load prebuilt: {exc}"]
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        compiled = sorted(p.name for p in Path(empty).iterdir())
    if module is None:
        return result, [f"{recipe}: sglang's loader gave no module"]
    result.update(aot=not compiled, load_seconds=time.perf_counter() - started)
    if compiled:
        return result, [f"{recipe}: sglang compiled {', '.join(compiled)} with tvm-ffi"]
    result["loaded"] = True
    return result, []


def _has_nvcc(directory: str) -> bool:
    return bool(directory) and (Path(directory) / "nvcc").exists()


def check(recipes: dict[str, str], major: int) -> tuple[list[dict[str, Any]], list[str]]:
    """Load every module the recipes name; return (per-module results, problems)."""
    results: list[dict[str, Any]] = []
    problems: list[str] = []
    for recipe, call in recipes.items():
        if sglang_kernels.is_sglang_call(call):
            kernel, found = check_sglang_kernel(recipe, call, major)
            results.append(kernel)
            problems += found
            continue
        try:
            specs = specs_of(call)
        except ModuleNotFoundError as exc:
            problems.append(
                f"{recipe}: the Python package {exc.name!r} is not installed here, which "
                f"FlashInfer needs for it: install it (pip install {exc.name}), or the whole "
                "environment sglang 0.5.9 needs"
            )
            results.append({"module": None, "recipe": recipe, "aot": False, "loaded": False})
            continue
        except Exception as exc:  # e.g. an SM12x-only generator on another GPU
            problems.append(f"{recipe}: FlashInfer does not make it for this GPU ({exc})")
            results.append({"module": None, "recipe": recipe, "aot": False, "loaded": False})
            continue
        for spec in specs:
            if any(r["module"] == spec.name for r in results):
                continue  # FlashInfer's generators repeat some modules (as build.py dedupes)
            result: dict[str, Any] = {
                "module": spec.name,
                "recipe": recipe,
                "aot": spec.is_aot,
                "loaded": False,
            }
            if not spec.is_aot:
                problems.append(f"{spec.name} ({recipe}) would be JIT-compiled: no prebuilt .so")
            else:
                started = time.perf_counter()
                try:
                    spec.build_and_load()
                    result["loaded"] = True
                except Exception as exc:  # report every module, then fail once
                    problems.append(f"{spec.name} ({recipe}) does not load: {exc}")
                result["load_seconds"] = time.perf_counter() - started
            results.append(result)
    return results, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="node_check", description=__doc__)
    parser.add_argument(
        "--arch", metavar="MAJOR.MINOR", help="check for this GPU arch instead of the GPU's"
    )
    parser.add_argument(
        "--profile",
        metavar="NAME",
        help="check this profile of profiles.toml instead of what the wheel was built from",
    )
    parser.add_argument("--json", type=Path, help="also write the findings to this file")
    add_node_options(parser)
    args = parser.parse_args(argv)
    return exit_status(lambda: _run(args), args.verbose)


def _run(args: argparse.Namespace) -> int:
    if args.install is not None:
        install_checked(args.install)
    disable_jit()
    problems: list[str] = []
    jit_cache = provenance("flashinfer-jit-cache")
    python = provenance("flashinfer-python")
    versions = {
        name: importlib.metadata.version(name)
        for name in ("flashinfer-jit-cache", "flashinfer-python")
    }
    series = {name: patch_series(version) for name, version in versions.items()}
    if len(set(series.values())) != 1 or None in series.values():
        problems.append(
            "flashinfer-python and flashinfer-jit-cache come from different patch series: "
            + ", ".join(f"{name} {version}" for name, version in versions.items())
        )
    if python["patches"] != jit_cache["patches"]:
        problems.append("flashinfer-python and flashinfer-jit-cache record different patches")

    major, minor, source = device_arch(args.arch)
    problems += cuda_versions(jit_cache["toolkit"], gpu=args.arch is None)
    archs: list[str] = jit_cache["archs"]
    if not any(runs_on(arch, major, minor) for arch in archs):
        problems.append(
            f"flashinfer-jit-cache has code for {', '.join(archs)}, none of which runs on "
            f"sm_{major}{minor} ({source})"
        )
    # FlashInfer picks arch-dependent code paths from this list, as on a node with that GPU.
    os.environ["FLASHINFER_CUDA_ARCH_LIST"] = f"{major}.{minor}{'a' if major >= 9 else ''}"

    if args.profile is not None:
        recipes = load_profiles(Path("profiles.toml")).select(args.profile, [])
    else:
        recipes = jit_cache["recipes"]

    started = time.perf_counter()
    results, load_problems = check(recipes, major)
    problems += load_problems
    total = time.perf_counter() - started
    jit = sum(1 for r in results if not r["aot"] and r["module"] is not None)
    loaded = [r for r in results if r["loaded"]]
    slowest = sorted(loaded, key=lambda r: -float(r["load_seconds"]))[:5]
    print(
        f"node_check: sm_{major}{minor} ({source}); flashinfer {versions['flashinfer-python']}, "
        f"jit-cache {versions['flashinfer-jit-cache']} ({', '.join(archs)})"
    )
    print(
        f"  {len(loaded)} of {len(results)} modules of {len(recipes)} recipes loaded "
        f"prebuilt, {len(results) - len(loaded)} did not ({jit} would JIT-compile); "
        f"{total:.2f} s; slowest: "
        + ", ".join(f"{r['module']} {r['load_seconds']:.3f} s" for r in slowest)
    )
    report = {
        "device": {"major": major, "minor": minor, "source": source},
        "versions": versions,
        "archs": archs,
        "jit_compiles": jit,
        "modules": results,
        "problems": problems,
    }
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    for problem in problems:
        print(f"  FAIL {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
