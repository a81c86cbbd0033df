"""`sm120-verify-gpu` (or `nox -s verify_gpu` from a checkout): every module of the
installed jit-cache wheel computes the right thing on this node's GPU.

For each module (or those of --module / --profile) the check of its recipe runs it through
FlashInfer's public API (sglang's own wrappers for sglang's kernels), as sglang 0.5.9 calls
it, against a plain-torch reference (node/serving/); trtllm_comm runs over ranks
(node/comm.py). A module whose machine code this GPU cannot run (an sm_120a module on sm_90)
is reported as not runnable, never as passed; a module whose recipe has no check yet is
reported as such. One table row per check; the exit status is 1 on any failure, or when
nothing at all could run.

Runs in the Python that serves sglang, with FLASHINFER_DISABLE_JIT=1 (set unless it is set).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..errors import UserError, exit_status
from ..layout import PROVENANCE_FILE
from ..sglang_kernels import MODULE_PREFIX
from .check import recorded_recipes, runs_on
from .install import add_node_options, disable_jit, install_checked
from .serving import FAIL, NOT_RUNNABLE, PASS, Row

NO_CHECK = "no check written yet"
_GENCODE = re.compile(r"-gencode=arch=compute_(\d+?)(\d)([af]?),code=")


def module_archs(provenance: dict[str, Any]) -> dict[str, set[str]]:
    """module -> the archs (12.0a, 9.0, ...) its recorded compile commands target."""
    archs: dict[str, set[str]] = {}
    for argv in provenance["compile_commands"]:
        # CMakeFiles/<module>.dir<source path, made symbolic>.o
        match = re.match(r"CMakeFiles/(.+?)\.dir", argv[argv.index("-o") + 1])
        if match is None:
            continue
        module = match.group(1)
        for flag in argv:
            if match := _GENCODE.match(flag):
                archs.setdefault(module, set()).add(
                    f"{match.group(1)}.{match.group(2)}{match.group(3)}"
                )
    return archs


# The all-reduces, checked over ranks rather than one module call at a time.
RANKED = frozenset({"trtllm_comm", "pcie_ipc_comm"})


def selected(provenance: dict[str, Any], args: argparse.Namespace) -> dict[str, str]:
    """module -> recipe, narrowed by --module (a module or recipe name) and --profile."""
    modules: dict[str, str] = provenance["modules"]
    if args.profile:
        recipes = set(recorded_recipes(provenance, args.profile))
        modules = {m: r for m, r in modules.items() if r in recipes}
    if args.module:
        unknown = [n for n in args.module if n not in modules and n not in modules.values()]
        if unknown:
            raise UserError(
                f"the installed jit-cache holds no module or recipe {', '.join(unknown)} "
                f"(it holds {len(modules)} modules of {', '.join(sorted(set(modules.values())))})"
            )
        modules = {m: r for m, r in modules.items() if m in args.module or r in args.module}
    return modules


def serving_rows(modules: dict[str, str], archs: dict[str, set[str]]) -> list[Row]:
    """The rows of every module but the all-reduces (RANKED), recipe by recipe, with
    progress."""
    import torch

    from .serving import check_for, checks
    from .serving.sglang import check as sglang_check

    major, minor = torch.cuda.get_device_capability()
    by_recipe: dict[str, list[str]] = {}
    for module, recipe in sorted(modules.items()):
        if module not in RANKED:
            by_recipe.setdefault(recipe, []).append(module)
    families = checks()
    rows: list[Row] = []
    for number, (recipe, names) in enumerate(sorted(by_recipe.items()), start=1):
        started = time.perf_counter()
        runnable = [n for n in names if any(runs_on(a, major, minor) for a in archs.get(n, ()))]
        rows += [
            Row(
                recipe,
                n,
                "-",
                0.0,
                0.0,
                NOT_RUNNABLE,
                f"built for {', '.join(sorted(archs.get(n, ())))}",
            )
            for n in names
            if n not in runnable
        ]
        check = sglang_check if names[0].startswith(MODULE_PREFIX) else check_for(recipe, families)
        if check is None:
            rows += [Row(recipe, n, "-", 0.0, 0.0, NO_CHECK, "") for n in runnable]
        elif runnable:
            try:
                found = check(runnable)
            except Exception as exc:  # a module that raises fails its recipe, named
                found = [
                    Row(
                        recipe,
                        ", ".join(runnable),
                        f"raised {type(exc).__name__}: {exc}",
                        0.0,
                        0.0,
                        FAIL,
                        "",
                    )
                ]
            checked = {row.module for row in found}
            rows += found + [
                Row(recipe, n, "-", 0.0, 0.0, NO_CHECK, "") for n in runnable if n not in checked
            ]
        print(
            f"[{number}/{len(by_recipe)}] {recipe}: {len(names)} module(s), "
            f"{time.perf_counter() - started:.1f} s",
            flush=True,
        )
    return rows


def print_rows(rows: list[Row]) -> None:
    print(f"\n{'recipe / module / case':<96} {'max |err|':>10} {'allowed':>9}  result")
    for row in rows:
        name = f"{row.recipe} / {row.module[:48]} / {row.case}"
        print(f"{name[:96]:<96} {row.max_abs_error:>10.2e} {row.max_allowed:>9.2e}  {row.status}")


def summary(rows: list[Row]) -> dict[str, dict[str, int]]:
    """recipe -> status -> rows."""
    counts: dict[str, dict[str, int]] = {}
    for row in rows:
        per = counts.setdefault(row.recipe, {})
        per[row.status] = per.get(row.status, 0) + 1
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="verify_gpu", description=__doc__)
    parser.add_argument(
        "--module",
        action="append",
        metavar="NAME",
        help="check only this module, or this recipe's modules (repeatable)",
    )
    parser.add_argument(
        "--profile",
        metavar="NAME",
        help="check only the modules of this profile's recipes, as the installed jit-cache "
        "records the profile",
    )
    parser.add_argument(
        "--pattern",
        action="append",
        metavar="PATTERN",
        help="trtllm_comm: check only this pattern (allreduce, residual_rmsnorm, moe_finalize, "
        "moe_reduction, custom_lamport_norm, pdl_race; repeatable)",
    )
    parser.add_argument(
        "--world-size", type=int, help="trtllm_comm ranks (default: one per GPU, two on one GPU)"
    )
    parser.add_argument("--json", type=Path, help="also write all rows to this file")
    add_node_options(parser)
    args = parser.parse_args(argv)
    return exit_status(lambda: _verify(args), args.verbose)


def _verify(args: argparse.Namespace) -> int:
    if args.install is not None:
        install_checked(args.install, trust_key=args.trust_key)
    disable_jit()
    import torch

    if not torch.cuda.is_available():
        raise UserError("no CUDA GPU is visible: run this on a GPU node")
    try:
        text = importlib.metadata.distribution("flashinfer-jit-cache").read_text(PROVENANCE_FILE)
    except importlib.metadata.PackageNotFoundError:
        raise UserError(f"flashinfer-jit-cache is not installed in {sys.prefix}") from None
    if text is None:
        raise UserError(f"the installed flashinfer-jit-cache has no {PROVENANCE_FILE}")
    provenance = json.loads(text)
    modules = selected(provenance, args)
    started = time.perf_counter()
    rows = serving_rows(modules, module_archs(provenance))
    print_rows(rows)
    ranked_passed = ranked_failed = 0  # rows of the all-reduces, over all ranks
    if "trtllm_comm" in modules:
        comm_json = args.json.with_suffix(".comm.json") if args.json else None
        passed, failed_here = verify_comm_rows(args, comm_json)
        ranked_passed, ranked_failed = ranked_passed + passed, ranked_failed + failed_here
    if "pcie_ipc_comm" in modules:
        passed, failed_here = verify_pcie_rows(args)
        ranked_passed, ranked_failed = ranked_passed + passed, ranked_failed + failed_here
    counts = summary(rows)
    print("\nper recipe:")
    for recipe, per in sorted(counts.items()):
        print(f"  {recipe:<24} " + ", ".join(f"{n} {status}" for status, n in sorted(per.items())))
    failed = sum(1 for row in rows if row.status == FAIL) + ranked_failed
    ran = sum(1 for row in rows if row.status in (PASS, FAIL)) + len(RANKED & set(modules))
    passed = sum(1 for r in rows if r.status == PASS) + ranked_passed
    print(
        f"\n{passed} passed, {failed} failed, "
        f"{sum(1 for r in rows if r.status == NOT_RUNNABLE)} not runnable on this GPU, "
        f"{sum(1 for r in rows if r.status == NO_CHECK)} without a check; "
        f"{time.perf_counter() - started:.1f} s"
    )
    if args.json:
        args.json.write_text(json.dumps([asdict(row) for row in rows], indent=2) + "\n")
    if not ran:
        raise UserError("nothing could run on this GPU: no module of the selection is checked here")
    return 1 if failed else 0


def verify_comm_rows(args: argparse.Namespace, json_path: Path | None) -> tuple[int, int]:
    """trtllm_comm over ranks (node/comm.py): the rows passed and failed."""
    from .comm import verify_comm

    return verify_comm(args.world_size, args.pattern or [], json_path)


def verify_pcie_rows(args: argparse.Namespace) -> tuple[int, int]:
    """FlashInfer 0.7's PCIe all-reduce over ranks (node/pcie.py): the rows passed and
    failed."""
    import torch

    from .pcie import run_pcie_checks

    world_size = args.world_size or max(2, torch.cuda.device_count())
    rows = run_pcie_checks(world_size)
    print(f"\npcie_ipc_comm over {world_size} ranks:")
    for row in rows:
        status = PASS if row["passed"] else FAIL
        print(
            f"  {status:<4} rank {row['rank']} {row['case']}: max abs error "
            f"{row['max_abs_error']:.3g} (allowed {row['max_allowed']:.3g})"
        )
    failed = sum(1 for row in rows if not row["passed"])
    return len(rows) - failed, failed


if __name__ == "__main__":
    sys.exit(main())
