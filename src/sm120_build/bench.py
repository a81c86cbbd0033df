"""`nox -s bench`: cold build time by stage and by module, no-op rebuild time, rebuild times
from a warm module cache and from a warm sccache alone, and wheel sizes.

A benchmark, not a test: it measures and reports. The cold build runs in a scratch copy of
the project with an empty build cache; pip's own download cache is kept, so the figures are
build time, not network time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import attest, jit_cache, options, pins, pipeline, toolkit
from .console import say
from .errors import UserError, exit_status
from .jit_cache import render, shards, sources
from .layout import CACHE_ENV, Layout, repo_root


def _scratch_project(source: Path, scratch: Path) -> Layout:
    root = scratch / "project"
    root.mkdir(parents=True)
    for name in (
        "pins.toml",
        "audit-waivers.toml",
        "audit-scope.toml",
        "profiles.toml",
        "profiles-derived.toml",
    ):
        shutil.copy(source / name, root)
    for name in ("patches", "kernel", "ci"):
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


def sample(
    layout: Layout, request: jit_cache.KernelRequest, per_recipe: int, costs_file: Path
) -> int:
    """Estimate each recipe's cold compile time from `per_recipe` of its translation units,
    compiled with their rendered flags one per core; print the table, record the seconds per
    unit in the cost table the shard plan balances on, and return 0."""
    pinned = pins.load(layout.pins_file)
    pipeline.vendor_all(layout, pinned)
    cuda = toolkit.pip_toolkit(pinned.toolkit_requirement, layout.cache)
    upstream = pinned.upstream("flashinfer")
    digest = hashlib.sha256(f"bench-sample {request.recipes}".encode()).hexdigest()
    with (
        sources.at_fixed_path(layout.vendor / upstream.name, digest) as exported,
        tempfile.TemporaryDirectory() as objects,
    ):
        modules = render.render_modules(exported, request.recipes, request.archs, cuda)
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
    per_unit_seconds: dict[str, float] = {}
    for recipe, commands in units.items():
        measured = [t for (r, _), t in zip(chosen, times, strict=True) if r == recipe]
        per_unit = per_unit_seconds[recipe] = sum(measured) / len(measured)
        estimate = per_unit * len(commands)
        total += estimate
        count = sum(1 for m in modules if m.recipe == recipe)
        print(
            f"  {recipe:<24} {count:>7} {len(commands):>6} {len(measured):>7} "
            f"{per_unit:>7.1f} {estimate:>8.0f}"
        )
    all_units = sum(map(len, units.values()))
    print(f"  {'total (one core)':<24} {'':>7} {all_units:>6} {'':>15} {total:>8.0f}")
    shards.update_costs(
        costs_file,
        _measured_on(request, f"{per_recipe} sampled unit(s) per recipe"),
        per_unit=per_unit_seconds,
    )
    say(f"per-unit costs written to {costs_file}")
    return 0


def _measured_on(request: jit_cache.KernelRequest, how: str) -> str:
    archs = " ".join(str(arch) for arch in request.archs)
    return (
        f"{os.cpu_count()} cores of {platform.node()}, {archs}, {time.strftime('%Y-%m-%d')}; {how}"
    )


def _timed(command: list[str], cwd: Path, env: dict[str, str]) -> float:
    started = time.monotonic()
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise UserError(f"{' '.join(command[2:])} failed in {cwd}:\n{result.stderr[-3000:]}")
    return time.monotonic() - started


# Shards share one source path (/tmp/sm120-build-<digest>, part of the bytes), so shards
# that run at once on one machine each get a /tmp of their own, as on separate machines.
_PRIVATE_TMP = ["unshare", "--mount", "--propagation", "private", "sh", "-c"]
_MOUNT_AND_RUN = 'mount -t tmpfs -o mode=1777 tmpfs /tmp && exec "$@"'


def _stop_servers(environments: list[dict[str, str]]) -> None:
    for env in environments:
        subprocess.run(["sccache", "--stop-server"], env=env, capture_output=True)


def sharded(source: Path, scratch: Path, kernel_args: list[str], count: int) -> int:
    """One machine simulating a sharded build: the request built once with every core, then
    as `count` shard processes at once (each its own project copy, build tree, /tmp and
    cores; one shared sccache directory: CI's machines and remote cache) merged, then the same
    again from the warm shared sccache. Prints wall times and whether the bytes agree."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        raise UserError(
            "--shards runs each shard with a /tmp of its own: it needs root and unshare"
        )
    cores = os.cpu_count() or 1
    python = [sys.executable, "-m", "sm120_build"]
    # Each project its own cache (as each CI machine has): only sccache's directory is shared.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCCACHE_") and k != CACHE_ENV}
    single = _scratch_project(source, scratch / "single").root
    say(f"one build, {cores} cores")
    times = {"one build": _timed([*python, "build-wheels", *kernel_args], single, env)}
    say(f"one build: {times['one build']:.1f} s")
    ports = [str(30000 + (os.getpid() + i) % 10000) for i in range(count)]
    shard_env = [
        {
            **env,
            "SCCACHE_DIR": str(scratch / "shared-sccache"),
            "SCCACHE_SERVER_PORT": port,  # a server per shard, in the shard's mount namespace
            "CMAKE_BUILD_PARALLEL_LEVEL": str(max(1, cores // count)),
        }
        for port in ports
    ]
    roots = [_scratch_project(source, scratch / f"shard-{i}").root for i in range(1, count + 1)]
    try:
        for run in ("cold", "warm"):
            say(f"{count} shards at once, {max(1, cores // count)} core(s) each, {run} sccache")
            for root in roots:
                # Same paths (the toolkit's path is in every compile command, as on CI
                # machines with one workspace path), fresh build trees, no cached wheels.
                artifacts = root / ".cache" / "artifacts"
                for produced in (artifacts / "jit-cache", artifacts / "modules", root / "shards"):
                    shutil.rmtree(produced, ignore_errors=True)
            started = time.monotonic()
            processes = [
                subprocess.Popen(
                    [
                        *_PRIVATE_TMP,
                        _MOUNT_AND_RUN,
                        "sh",
                        *python,
                        "build-shard",
                        *kernel_args,
                        "--shard",
                        f"{i}/{count}",
                    ],
                    cwd=root,
                    env=shard_env[i - 1],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for i, root in enumerate(roots, start=1)
            ]
            for process in processes:
                _, stderr = process.communicate()
                if process.returncode != 0:
                    raise UserError(f"a shard failed:\n{stderr[-3000:]}")
            for root in roots[1:]:
                shutil.copytree(root / "shards", roots[0] / "shards", dirs_exist_ok=True)
            _timed([*python, "merge-shards"], roots[0], env)
            times[f"{count} shards + merge, {run} sccache"] = time.monotonic() - started
            say(f"{count} shards + merge, {run} sccache: {time.monotonic() - started:.1f} s")
            same = all(
                (roots[0] / "wheelhouse" / p.name).read_bytes() == p.read_bytes()
                for p in (single / "wheelhouse").iterdir()
            )
            say(f"merged wheelhouse {'is' if same else 'is NOT'} byte-identical to one build's")
            _stop_servers(shard_env)  # they see this run's /tmp only
    finally:
        _stop_servers(shard_env)
    first = times["one build"]
    print(f"\nsharded build simulation ({cores} cores, {' '.join(kernel_args)})")
    for name, seconds in times.items():
        print(f"  {name:<38} {seconds:8.1f} s  ({first / seconds:.2f}x of one build)")
    best = min(times.values())
    print(f"  best / one build: {best / first:.2f} (wall time)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench", description=__doc__)
    options.add_kernel_options(parser)
    parser.add_argument(
        "--sample",
        type=int,
        metavar="N",
        help="instead of building: estimate each module recipe's cold compile time from N of "
        "its translation units (for profiles too large to build here)",
    )
    parser.add_argument(
        "--shards",
        type=int,
        metavar="N",
        help="instead: time one build against N shard processes at once (cores split between "
        "them, one shared sccache), cold and warm, and check the merge gives the same bytes",
    )
    parser.add_argument(
        "--verbose", action="store_true", help="show the traceback of an unexpected error"
    )
    args = parser.parse_args(argv)
    return exit_status(lambda: _bench(args), args.verbose)


def _bench(args: argparse.Namespace) -> int:
    source = repo_root()
    if args.shards is not None:
        kernel_args = [
            *([f"--profile={args.profile}"] if args.profile else []),
            *(f"--module={name}" for name in args.module or []),
            *(f"--arch={arch}" for arch in args.arch or []),
        ]
        # Outside /tmp, which each shard replaces by one of its own.
        cache = Layout.from_root(source).cache
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="bench-shards-", dir=cache) as scratch:
            return sharded(source, Path(scratch), kernel_args, args.shards)
    if args.sample is not None:
        with tempfile.TemporaryDirectory(prefix="sm120-bench-") as scratch:
            layout = _scratch_project(source, Path(scratch))
            request = options.kernel_request(layout, args)
            return sample(layout, request, args.sample, Layout.from_root(source).costs_file)
    with tempfile.TemporaryDirectory(prefix="sm120-bench-") as scratch:
        layout = _scratch_project(source, Path(scratch))
        pinned = pins.load(layout.pins_file)
        request = options.kernel_request(layout, args)
        archs = request.archs
        # Unsigned: a benchmark's wheels are never published.
        run = attest.begin(options.build_parameters(layout, args), None)
        cold = pipeline.build_wheels(layout, pinned, request, run)
        modules = _compile_seconds(layout)
        started = time.monotonic()
        pipeline.build_wheels(layout, pinned, request, run)
        no_op = time.monotonic() - started
        # The wheel cache dropped, a fresh build tree: every module from the module cache.
        shutil.rmtree(layout.cache / "artifacts" / "jit-cache")
        from_modules = pipeline.build_wheels(layout, pinned, request, run)
        # The module cache dropped too: every compile served by sccache.
        shutil.rmtree(layout.cache / "artifacts" / "jit-cache")
        shutil.rmtree(layout.built_modules)
        warm = pipeline.build_wheels(layout, pinned, request, run)
        modules_warm = _compile_seconds(layout)
        sizes = {p.name: p.stat().st_size for p in sorted(layout.wheelhouse.glob("*.whl"))}

    stage = "render + compile"
    print(f"\ncold build ({', '.join(str(a) for a in archs)}, {os.cpu_count()} cores)")
    for name, seconds in cold.items():
        print(f"  {name:<28} {seconds:8.1f} s")
    print(f"  {'total':<28} {sum(cold.values()):8.1f} s")
    print("compiler time per module (sum over its translation units): cold, warm sccache only")
    for name, seconds in sorted(modules.items(), key=lambda item: -item[1]):
        again = modules_warm[name]
        print(f"  {name:<28} {seconds:8.1f} s {again:8.1f} s ({100 * again / seconds:.0f} %)")
    print(f"no-op rebuild                  {no_op:8.1f} s")
    for name, rebuild in (("warm module cache", from_modules), ("warm sccache only", warm)):
        print(
            f"fresh build tree, {name:<17} {rebuild[stage]:8.1f} s "
            f"({100 * rebuild[stage] / cold[stage]:.0f} % of the cold {cold[stage]:.1f} s)"
        )
    print("wheel sizes")
    for name, size in sizes.items():
        print(f"  {size / 1e6:7.1f} MB  {name}")
    costs_file = Layout.from_root(source).costs_file
    shards.update_costs(costs_file, _measured_on(request, "cold build"), modules=modules)
    say(f"per-module costs written to {costs_file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
