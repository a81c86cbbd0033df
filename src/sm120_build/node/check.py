"""`sm120-node-check` (or `nox -s node_check` from a checkout): on a serving node, prove that
FlashInfer and sglang will not JIT-compile.

Runs where the wheelhouse's wheels are installed; it installs nothing unless --install DIR
asks it to. It reports, with no GPU needed:

- the versions and patch series of flashinfer-python and flashinfer-jit-cache, which must
  be one build's;
- the archs the jit-cache holds code for, which must cover the GPU (or --arch MAJOR.MINOR),
  and the host CPU its shared objects are built for (by their ELF headers), which must be
  this machine's for them to be loaded;
- the CUDA the jit-cache was built with, against the driver's;
- with --trust-key KEY.pub, whether each installed wheel of ours was verified against its
  signed provenance when --install put it there (docs/provenance.md).

Then, where torch and a GPU (or --arch) are there, it loads every module of the profile (by
default the recipes the jit-cache records it was built from) as the serving path does, with
JIT compilation disabled, and fails, naming the module, when one would be compiled or does
not load. What it could not check, and why, is said at the end, and fails the check too.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import platform
import re
import sys
import time
from pathlib import Path
from typing import Any

from .. import hosts
from ..errors import UserError, exit_status
from ..layout import PROVENANCE_FILE
from ..profiles import FIRST_USE_COMPILERS, first_use
from .install import add_node_options, disable_jit, install_checked
from .loads import check
from .provenance import BUILT, installed_provenance

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


def module_hosts(distribution: str) -> dict[str, int]:
    """Host CPU (hosts.py's name) -> how many of the distribution's shared objects are built
    for it, by their ELF headers."""
    counts: dict[str, int] = {}
    for file in importlib.metadata.distribution(distribution).files or []:
        if file.name.endswith(".so"):
            name = hosts.named_machine(hosts.elf_machine(Path(str(file.locate()))))
            counts[name] = counts.get(name, 0) + 1
    return counts


def cuda_versions(toolkit: dict[str, Any] | None, torch: Any, gpu: bool) -> list[str]:
    """Say which CUDA each part is for: the node's torch, the jit-cache's toolkit, and (with
    a GPU) the driver; a driver too old for the toolkit cannot run the modules at all."""
    built = str((toolkit or {}).get("cuda", "?"))
    torch_cuda = "not installed" if torch is None else (torch.version.cuda or "CPU only")
    line = f"CUDA: torch {torch_cuda}, jit-cache built with {built}"
    problems = []
    if gpu:
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


def importable_torch() -> Any:
    """torch, or None where it is not installed (FlashInfer's modules load only with it)."""
    try:
        import torch
    except ModuleNotFoundError:
        return None
    return torch


def device_arch(requested: str | None, torch: Any) -> tuple[tuple[int, int] | None, str]:
    """((major, minor), how it was found), or (None, why there is none): --arch, else the
    first visible GPU."""
    if requested is not None:
        # The build's spellings too: a node checks for the GPU, whatever the suffix built.
        match = re.fullmatch(r"(\d+)\.(\d)[af]?", requested)
        if match is None:
            raise UserError(f"--arch {requested!r}: expected MAJOR.MINOR, e.g. 12.0 (or 12.0f)")
        return (int(match.group(1)), int(match.group(2))), "--arch"
    if torch is None:
        return None, "torch is not installed here, so no GPU could be asked for its arch"
    if not torch.cuda.is_available():
        return None, "no CUDA GPU is visible; on a machine without one, pass --arch 12.0"
    major, minor = torch.cuda.get_device_capability(0)
    return (major, minor), str(torch.cuda.get_device_name(0))


def recorded_recipes(jit_cache: dict[str, Any], profile: str | None) -> dict[str, str]:
    """The recipes to check: those the jit-cache was built from, or a profile the installed
    jit-cache records. Never read from a file in the working directory: a recipe is code,
    and only what the node installed with a checked hash is evaluated."""
    if profile is None:
        recipes: dict[str, str] = jit_cache["recipes"]
        return recipes
    recorded: dict[str, dict[str, str]] = jit_cache.get("profiles", {})
    if profile not in recorded:
        known = ", ".join(sorted(recorded)) or "none (it was built before profiles were recorded)"
        raise UserError(
            f"--profile {profile}: the installed flashinfer-jit-cache records no such profile "
            f"(it records: {known})"
        )
    return recorded[profile]


def first_use_lines(jit_cache: dict[str, Any], profile: str | None) -> list[str]:
    """Per compiler, what the profile's configuration still compiles on this node at first
    use outside these wheels (as the derivation recorded it, with sglang's call site), and
    the compilers it did not reach."""
    recorded: dict[str, list[dict[str, Any]]] = jit_cache.get("compiled_on_node", {})
    if profile is None or profile not in recorded:
        return [
            "what still compiles at first use outside these wheels is recorded per derived "
            "configuration: run with --profile NAME"
            + (f" ({', '.join(sorted(recorded))})" if recorded else " (none recorded)")
        ]
    by_compiler: dict[str, list[str]] = {}
    for entry in recorded[profile]:
        compiler, function, site = first_use(entry)
        by_compiler.setdefault(compiler, []).append(f"{function} (from {site})")
    lines = [
        f"would compile at first use, {FIRST_USE_COMPILERS.get(compiler, compiler)}: {what}"
        for compiler, functions in by_compiler.items()
        for what in functions
    ]
    unreached = [name for key, name in FIRST_USE_COMPILERS.items() if key not in by_compiler]
    if unreached:
        lines.append(f"not reached by {profile}'s derivation: {', '.join(unreached)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="node_check", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--arch", metavar="MAJOR.MINOR", help="check for this GPU arch instead of the GPU's"
    )
    parser.add_argument(
        "--profile",
        metavar="NAME",
        help="check this profile, as the installed jit-cache records it, instead of what the "
        "wheel was built from",
    )
    parser.add_argument("--json", type=Path, help="also write the findings to this file")
    add_node_options(parser)
    args = parser.parse_args(argv)
    return exit_status(lambda: _run(args), args.verbose)


def _run(args: argparse.Namespace) -> int:
    torch = importable_torch()
    if args.install is not None:
        if torch is None:
            raise UserError(
                f"torch is not installed in {sys.prefix}: the node check runs in the Python "
                "that serves sglang, which holds torch (`python -m nox -s node_check` from "
                "that environment). Nothing was installed."
            )
        install_checked(args.install, trust_key=args.trust_key)
    disable_jit()
    problems: list[str] = []
    not_checked: list[str] = []
    if args.trust_key is not None:
        problems += _signed_provenance(args.trust_key)
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
    archs: list[str] = jit_cache["archs"]
    built_for = module_hosts("flashinfer-jit-cache")
    recipes = recorded_recipes(jit_cache, args.profile)
    arch, source = device_arch(args.arch, torch)
    problems += cuda_versions(
        jit_cache["toolkit"], torch, gpu=args.arch is None and arch is not None
    )
    print(
        f"node_check: {f'sm_{arch[0]}{arch[1]} ({source})' if arch else 'no GPU arch'}; "
        f"flashinfer {versions['flashinfer-python']}, "
        f"jit-cache {versions['flashinfer-jit-cache']} ({', '.join(archs)}"
        + "".join(f"; {count} {name} shared objects" for name, count in built_for.items())
        + ")"
    )
    results: list[dict[str, Any]] = []
    if arch is None:
        not_checked.append(f"the {len(recipes)} recipes' modules were not loaded: {source}")
    else:
        major, minor = arch
        if not any(runs_on(built, major, minor) for built in archs):
            problems.append(
                f"flashinfer-jit-cache has code for {', '.join(archs)}, none of which runs on "
                f"sm_{major}{minor} ({source})"
            )
        # FlashInfer picks arch-dependent code paths from this list, as on a node with that GPU.
        os.environ["FLASHINFER_CUDA_ARCH_LIST"] = f"{major}.{minor}{'a' if major >= 9 else ''}"
        foreign = sorted(set(built_for) - {platform.machine()})
        if foreign:
            not_checked.append(
                f"the {len(recipes)} recipes' modules were not loaded: the jit-cache's shared "
                f"objects are {', '.join(foreign)} code and this machine is "
                f"{platform.machine()}, which cannot load them; run the check on a node of "
                "that host"
            )
        elif torch is None:
            not_checked.append(
                f"the {len(recipes)} recipes' modules were not loaded: torch is not installed "
                "here, and FlashInfer loads its modules only with it"
            )
        else:
            results, load_problems = _load_modules(recipes, arch)
            problems += load_problems
    jit = sum(1 for r in results if not r["aot"] and r["module"] is not None)
    first_use = first_use_lines(jit_cache, args.profile)
    for line in first_use:
        print(f"  {line}")
    report = {
        "device": {"major": arch[0], "minor": arch[1], "source": source} if arch else None,
        "versions": versions,
        "archs": archs,
        "hosts": built_for,
        "jit_compiles": jit,
        "modules": results,
        "first_use": first_use,
        "problems": problems,
        "not_checked": not_checked,
    }
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    for problem in problems:
        print(f"  FAIL {problem}")
    for reason in not_checked:
        print(f"  NOT CHECKED {reason}")
    return 1 if problems or not_checked else 0


def _signed_provenance(trust_key: Path) -> list[str]:
    """Print what the envelopes kept at install say of each installed wheel of ours; the
    ones without a verified envelope are problems."""
    installed = {}
    for project in BUILT:
        try:
            installed[project] = importlib.metadata.version(project)
        except importlib.metadata.PackageNotFoundError:
            continue
    problems = []
    for project, found in installed_provenance(trust_key, installed).items():
        print(f"  provenance {project} {installed[project]}: {found}")
        if not found.startswith("verified"):
            problems.append(f"{project} {installed[project]}: {found}")
    return problems


def _load_modules(
    recipes: dict[str, str], arch: tuple[int, int]
) -> tuple[list[dict[str, Any]], list[str]]:
    """Load every module the recipes name, and say how it went in one line."""
    started = time.perf_counter()
    results, problems = check(recipes, arch)
    total = time.perf_counter() - started
    jit = sum(1 for r in results if not r["aot"] and r["module"] is not None)
    loaded = [r for r in results if r["loaded"]]
    driver = [str(r["module"]) for r in results if r.get("needs_driver")]
    slowest = sorted(loaded, key=lambda r: -float(r["load_seconds"]))[:5]
    print(
        f"  {len(loaded)} of {len(results)} modules of {len(recipes)} recipes loaded "
        f"prebuilt, {len(results) - len(loaded)} did not ({jit} would JIT-compile); "
        f"{total:.2f} s"
        + ("; slowest: " if slowest else "")
        + ", ".join(f"{r['module']} {r['load_seconds']:.3f} s" for r in slowest)
    )
    if driver:
        print(
            f"  {', '.join(driver)}: prebuilt, and FlashInfer takes it; not loaded here, for "
            "it links the NVIDIA driver (libcuda.so.1), which this machine has not"
        )
    return results, problems


if __name__ == "__main__":
    sys.exit(main())
