"""`nox -s bench`: cold build time by stage and by module, no-op and warm-sccache rebuild
times, and wheel sizes.

A benchmark, not a test: it measures and reports. The cold build runs in a scratch copy of
the project with an empty build cache; pip's own download cache is kept, so the figures are
build time, not network time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from . import cli, pins, pipeline
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench", description=__doc__)
    cli.add_kernel_options(parser)
    args = parser.parse_args(argv)
    source = repo_root()
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
