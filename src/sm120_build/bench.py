"""`nox -s bench`: cold build time by stage and by module, no-op and warm-sccache rebuild
times, and wheel sizes.

A benchmark, not a test: it measures and reports. The cold build runs in a scratch copy of
the project with an empty build cache; pip's own download cache is kept, so the figures are
build time, not network time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import build, cli, pins, pipeline, toolkit
from .console import say
from .errors import UserError
from .layout import Layout, repo_root


def _scratch_project(source: Path, scratch: Path) -> Layout:
    root = scratch / "project"
    root.mkdir()
    for name in ("pins.toml", "audit-waivers.toml", "profiles.toml"):
        shutil.copy(source / name, root)
    for name in ("patches", "kernel"):
        shutil.copytree(
            source / name,
            root / name,
            ignore=shutil.ignore_patterns("__pycache__", "_build_meta.py"),
        )
    return Layout(root=root, cache=root / ".cache")


def _compile_seconds(layout: Layout) -> dict[str, float]:
    (entry,) = (layout.cache / "artifacts" / "jit-cache").glob("*/compile_seconds.json")
    seconds: dict[str, float] = json.loads(entry.read_text())
    return seconds


def _compile_one(command: list[str]) -> float:
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise UserError(f"sample compile failed: {' '.join(command)}\n{result.stderr[-2000:]}")
    return time.monotonic() - started


def sample(layout: Layout, request: pipeline.KernelRequest, per_recipe: int) -> int:
    """Estimate each recipe's cold compile time from `per_recipe` of its translation units,
    compiled with their rendered flags one per core; print the table and return 0."""
    pinned = pins.load(layout.pins_file)
    pipeline.vendor_all(layout, pinned)
    cuda = toolkit.pip_toolkit(pinned.toolkit_requirement, layout.cache)
    upstream = pinned.upstream("flashinfer")
    digest = hashlib.sha256(f"bench-sample {request.recipes}".encode()).hexdigest()
    with (
        build.sources_at_fixed_path(layout.vendor / upstream.name, digest) as sources,
        tempfile.TemporaryDirectory() as objects,
    ):
        modules = build.render_modules(sources, request.recipes, request.archs, cuda)
        units: dict[str, list[list[str]]] = {}
        for module in modules:
            for source in module.cuda_sources:
                units.setdefault(module.recipe, []).append(
                    [str(cuda.nvcc), *module.cuda_flags, "-c", source]
                )
            for source in module.cxx_sources:
                units.setdefault(module.recipe, []).append(["c++", *module.cxx_flags, "-c", source])
        chosen: list[tuple[str, list[str]]] = []
        for recipe, commands in units.items():
            step_size = max(1, len(commands) // per_recipe)
            for index, command in enumerate(commands[::step_size][:per_recipe]):
                chosen.append((recipe, [*command, "-o", f"{objects}/{recipe}-{index}.o"]))
        say(f"compiling {len(chosen)} sampled translation units, {os.cpu_count()} at a time")
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            times = list(pool.map(_compile_one, [command for _, command in chosen]))
    print(f"\nsampled cold compile ({', '.join(str(a) for a in request.archs)}, one unit per core)")
    print(
        f"  {'recipe':<24} {'modules':>7} {'units':>6} {'sampled':>7} {'s/unit':>7} {'est. s':>8}"
    )
    total = 0.0
    for recipe, commands in units.items():
        measured = [t for (r, _), t in zip(chosen, times, strict=True) if r == recipe]
        per_unit = sum(measured) / len(measured)
        estimate = per_unit * len(commands)
        total += estimate
        count = sum(1 for m in modules if m.recipe == recipe)
        print(
            f"  {recipe:<24} {count:>7} {len(commands):>6} {len(measured):>7} "
            f"{per_unit:>7.1f} {estimate:>8.0f}"
        )
    all_units = sum(map(len, units.values()))
    print(f"  {'total (one core)':<24} {'':>7} {all_units:>6} {'':>15} {total:>8.0f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench", description=__doc__)
    cli.add_kernel_options(parser)
    parser.add_argument(
        "--sample",
        type=int,
        metavar="N",
        help="instead of building: estimate each module recipe's cold compile time from N of "
        "its translation units (for profiles too large to build here)",
    )
    args = parser.parse_args(argv)
    source = repo_root()
    if args.sample is not None:
        with tempfile.TemporaryDirectory(prefix="sm120-bench-") as scratch:
            layout = _scratch_project(source, Path(scratch))
            return sample(layout, cli.kernel_request(layout, args), args.sample)
    with tempfile.TemporaryDirectory(prefix="sm120-bench-") as scratch:
        layout = _scratch_project(source, Path(scratch))
        pinned = pins.load(layout.pins_file)
        request = cli.kernel_request(layout, args)
        archs = request.archs
        cold = pipeline.build_wheels(layout, pinned, request)
        modules = _compile_seconds(layout)
        started = time.monotonic()
        pipeline.build_wheels(layout, pinned, request)
        no_op = time.monotonic() - started
        # The wheel cache dropped: a fresh build tree, every compile served by sccache.
        shutil.rmtree(layout.cache / "artifacts" / "jit-cache")
        warm = pipeline.build_wheels(layout, pinned, request)
        sizes = {p.name: p.stat().st_size for p in sorted(layout.wheelhouse.glob("*.whl"))}

    stage = "compile + jit-cache wheel"
    print(f"\ncold build ({', '.join(str(a) for a in archs)}, {os.cpu_count()} cores)")
    for name, seconds in cold.items():
        print(f"  {name:<28} {seconds:8.1f} s")
    print(f"  {'total':<28} {sum(cold.values()):8.1f} s")
    print("compiler time per module (sum over its translation units)")
    for name, seconds in sorted(modules.items(), key=lambda item: -item[1]):
        print(f"  {name:<28} {seconds:8.1f} s")
    print(f"no-op rebuild                  {no_op:8.1f} s")
    print(
        f"fresh build tree, warm sccache {warm[stage]:8.1f} s "
        f"({100 * warm[stage] / cold[stage]:.0f} % of the cold {cold[stage]:.1f} s)"
    )
    print("wheel sizes")
    for name, size in sizes.items():
        print(f"  {size / 1e6:7.1f} MB  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
