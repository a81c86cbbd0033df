"""Split a profile's modules over N build machines, and put what they built back together.

The plan is deterministic: every shard job computes the same one from the rendered modules
and the checked-in cost table (ci/module-costs.json, refreshed by `nox -s bench`), so shard
jobs need nothing from each other. Longest first, each module to the least loaded shard.
A module is never split: fused_moe_120 alone bounds the slowest shard from below.

Each shard writes shards/<i>-of-<N>/: the jit-cache wheel of its modules as the compiler
left it, and shard.json with what the merge checks and the provenance needs. The merge
refuses shards of different inputs, a missing or repeated shard, and modules that do not
add up to the plan.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..archives import check_wheel
from ..cache import sha256_of
from ..errors import UserError
from ..layout import JIT_CACHE_PREFIX
from .overlay import base_member_problem
from .render import Module

SHARD_FILE = "shard.json"
# Seconds of one core per translation unit where the table knows nothing of a module or
# its recipe: about the median unit of the sglang-sm120 profile measured on the H200 host.
DEFAULT_UNIT_SECONDS = 15.0


@dataclass(frozen=True)
class ShardSpec:
    index: int  # 1-based
    count: int

    @classmethod
    def parse(cls, text: str) -> ShardSpec:
        match = re.fullmatch(r"(\d+)/(\d+)", text.strip())
        if not match or not 1 <= int(match.group(1)) <= int(match.group(2)):
            raise UserError(f"--shard {text}: expected I/N with 1 <= I <= N, e.g. 2/4")
        return cls(int(match.group(1)), int(match.group(2)))

    @property
    def label(self) -> str:
        return f"{self.index}-of-{self.count}"


WHOLE = ShardSpec(1, 1)


@dataclass(frozen=True)
class Costs:
    """Compiler seconds (one core) per module where measured, and per translation unit by
    recipe where only sampled."""

    modules: dict[str, float]
    per_unit: dict[str, float]

    def of(self, module: Module) -> float:
        if module.name in self.modules:
            return self.modules[module.name]
        return module.units * self.per_unit.get(module.recipe, self.default_unit)

    @property
    def default_unit(self) -> float:
        return statistics.median(self.per_unit.values()) if self.per_unit else DEFAULT_UNIT_SECONDS


def load_costs(path: Path) -> Costs:
    if not path.is_file():
        return Costs({}, {})
    try:
        data = json.loads(path.read_text())
        return Costs(
            {str(k): float(v) for k, v in data.get("modules", {}).items()},
            {str(k): float(v) for k, v in data.get("per_unit", {}).items()},
        )
    except (ValueError, TypeError, AttributeError) as exc:
        raise UserError(f"{path}: not a cost table ({exc}); restore it from git") from None


def update_costs(
    path: Path,
    measured_on: str,
    modules: dict[str, float] | None = None,
    per_unit: dict[str, float] | None = None,
) -> None:
    """Merge new measurements into the table at `path` (what is not measured stays)."""
    data: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    for key, values in (("modules", modules), ("per_unit", per_unit)):
        merged = dict(data.get(key, {}))
        merged.update({name: round(seconds, 1) for name, seconds in (values or {}).items()})
        data[key] = dict(sorted(merged.items()))
    data["measured_on"] = measured_on
    data.setdefault(
        "about",
        "Compiler seconds of one core: per module (sum over its translation units) where a "
        "build measured it, per translation unit by recipe where `nox -s bench -- --sample` "
        "did. The shard plan balances on these; `nox -s bench` refreshes them.",
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(partial, path)


def plan(modules: list[Module], costs: Costs, count: int) -> list[list[str]]:
    """Module names per shard (each in render order): longest first, each to the least
    loaded shard, ties to the lower index."""
    if count > len(modules):
        raise UserError(
            f"{count} shards for {len(modules)} module(s): some shards would build nothing; "
            f"use at most {len(modules)}"
        )
    loads = [0.0] * count
    assigned: dict[str, int] = {}
    for module in sorted(modules, key=lambda m: (-costs.of(m), m.name)):
        target = min(range(count), key=lambda index: (loads[index], index))
        loads[target] += costs.of(module)
        assigned[module.name] = target
    return [[m.name for m in modules if assigned[m.name] == index] for index in range(count)]


def plan_table(modules: list[Module], costs: Costs, shards: list[list[str]]) -> str:
    by_name = {module.name: module for module in modules}
    lines = [f"{'shard':>5} {'modules':>7} {'units':>6} {'est. s':>8}  largest module"]
    for index, names in enumerate(shards, start=1):
        members = [by_name[name] for name in names]
        units = sum(m.units for m in members)
        largest = max(members, key=costs.of)
        total = sum(costs.of(m) for m in members)
        lines.append(
            f"{index:>5} {len(members):>7} {units:>6} {total:>8.0f}  "
            f"{largest.name} ({costs.of(largest):.0f} s)"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class Part:
    """What one shard (or one machine's whole build) compiled: the jit-cache wheel of its
    modules as the compiler left it, and its record: what the merge checks and the
    provenance needs."""

    wheel: Path
    record: dict[str, Any]


def write_shard(out_dir: Path, spec: ShardSpec, wheel: Path, record: dict[str, Any]) -> Path:
    """Replace out_dir/<i>-of-<N>/ by the shard's wheel and record, by a rename."""
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / spec.label
    staging = Path(tempfile.mkdtemp(prefix=f".{spec.label}-", dir=out_dir))
    shutil.copyfile(wheel, staging / wheel.name)
    # The merge takes the wheel only with this hash: a shard changed on its way between
    # machines (an artifact store, a copy) is named, not merged.
    record = {**record, "wheel": {"file": wheel.name, "sha256": sha256_of(wheel)}}
    (staging / SHARD_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    staging.chmod(0o755)
    if target.exists():
        shutil.rmtree(target)
    os.rename(staging, target)
    return target


def _wheel_in(directory: Path) -> Path:
    wheels = sorted(directory.glob("*.whl"))
    if len(wheels) != 1:
        raise UserError(f"{directory} should hold one wheel, not {len(wheels)}: build it again")
    return wheels[0]


def _read_shard(directory: Path) -> Part:
    """One shard: its record, and its wheel, checked against the hash the record holds and
    checked whole (members, RECORD) before the merge reads anything of it."""
    try:
        record: dict[str, Any] = json.loads((directory / SHARD_FILE).read_text())
        recorded = record["wheel"]
        name, sha256 = str(recorded["file"]), str(recorded["sha256"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(
            f"{directory / SHARD_FILE} is not a shard record of this tool ({type(exc).__name__}: "
            f"{exc}); build that shard again with `nox -s build_shard`"
        ) from None
    wheel = _wheel_in(directory)
    if wheel.name != name or sha256_of(wheel) != sha256:
        raise UserError(
            f"shard {directory.name}: {wheel.name} is not the wheel its build recorded "
            f"({name}, sha256 {sha256}; it has {sha256_of(wheel)}). It changed after "
            "`build_shard`: build that shard again, or fetch it again from its build."
        )
    check_wheel(wheel, base_member_problem, f"shard {directory.name}:")
    return Part(wheel, record)


def read_shards(shards_dir: Path) -> list[Part]:
    """Every shard under shards_dir, checked to be one complete set of one build."""
    found = sorted(p.parent for p in shards_dir.glob(f"*-of-*/{SHARD_FILE}"))
    if not found:
        raise UserError(
            f"no shards in {shards_dir}: run `nox -s build_shard -- --shard I/N` for each I "
            "(or download the shard artifacts there) first"
        )
    builds = [_read_shard(d) for d in found]
    keys = {b.record["key"] for b in builds}
    if len(keys) != 1:
        raise UserError(
            f"{shards_dir} holds shards of {len(keys)} different builds (inputs, profile, "
            "archs, toolkit or shard count differ); keep one build's shards only"
        )
    count = builds[0].record["count"]
    indices = sorted(b.record["index"] for b in builds)
    repeated = sorted({index for index in indices if indices.count(index) > 1})
    if repeated:
        copies = [
            f"shard {index} of {count} is there twice ("
            + ", ".join(
                str(d.relative_to(shards_dir))
                for d, b in zip(found, builds, strict=True)
                if b.record["index"] == index
            )
            + ")"
            for index in repeated
        ]
        raise UserError(
            f"{shards_dir}: {'; '.join(copies)}; keep one copy of each shard, then merge"
        )
    strays = [index for index in indices if not 1 <= index <= count]
    if strays:
        raise UserError(
            f"{shards_dir}: shard numbers {', '.join(map(str, strays))} are outside the "
            f"build's 1-{count} (a record was changed); build those shards again, then merge"
        )
    if indices != list(range(1, count + 1)):
        missing = sorted(set(range(1, count + 1)) - set(indices))
        raise UserError(
            f"{shards_dir}: shards {', '.join(map(str, missing))} of {count} are "
            f"missing (found {', '.join(map(str, indices))}); build them, then merge"
        )
    builds.sort(key=lambda b: b.record["index"])
    for build in builds:
        expected = set(build.record["plan"][build.record["index"] - 1])
        if set(build.record["modules"]) != expected:
            raise UserError(
                f"shard {build.record['index']}/{count} built {sorted(build.record['modules'])}, "
                f"not its share of the plan {sorted(expected)}"
            )
    return builds


def merge_wheels(parts: list[Path], out: Path) -> Path:
    """One wheel holding every part's modules; the files outside the modules (package code,
    metadata, licences) must be the same in every part."""
    shared: dict[str, bytes] | None = None
    with zipfile.ZipFile(out, "w") as merged:
        for part in parts:
            with zipfile.ZipFile(part) as archive:
                common = {
                    info.filename: archive.read(info)
                    for info in archive.infolist()
                    if not info.is_dir() and not info.filename.startswith(JIT_CACHE_PREFIX)
                }
                for info in archive.infolist():
                    if info.filename.startswith(JIT_CACHE_PREFIX) and not info.is_dir():
                        merged.writestr(info, archive.read(info))
            if shared is None:
                shared = common
                for info_name, data in sorted(common.items()):
                    merged.writestr(zipfile.ZipInfo(info_name), data)
            elif {k: v for k, v in common.items() if not k.endswith("/RECORD")} != {
                k: v for k, v in shared.items() if not k.endswith("/RECORD")
            }:
                raise UserError(f"{part.name}: its package files differ from the first shard's")
    return out
