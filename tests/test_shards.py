"""The shard plan, the shard records and the merge of shard wheels (no compiler)."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest

from sm120_build.errors import UserError
from sm120_build.jit_cache.render import Module
from sm120_build.jit_cache.shards import (
    Costs,
    ShardSpec,
    load_costs,
    merge_wheels,
    plan,
    read_shards,
    update_costs,
    write_shard,
)

from .conftest import zip_wheel


def module(name: str, units: int, recipe: str | None = None) -> Module:
    return Module(
        name=name,
        recipe=recipe or name,
        cuda_sources=[f"{name}/{i}.cu" for i in range(units)],
        cxx_sources=[],
        cuda_flags=[],
        cxx_flags=[],
        link_flags=[],
        device_link=False,
    )


def test_shard_spec_parses_and_refuses() -> None:
    assert ShardSpec.parse("2/4") == ShardSpec(2, 4)
    assert ShardSpec.parse("2/4").label == "2-of-4"
    for text in ("0/2", "3/2", "2", "a/b", "1/0"):
        with pytest.raises(UserError, match="expected I/N"):
            ShardSpec.parse(text)


def test_costs_come_from_measurements_then_per_unit_then_the_default() -> None:
    costs = Costs({"measured": 100.0}, {"attention": 10.0, "other": 30.0})
    assert costs.of(module("measured", 3)) == 100.0
    assert costs.of(module("batch_prefill_x", 4, recipe="attention")) == 40.0
    assert costs.of(module("unknown", 2)) == 2 * 20.0  # median of the per-unit figures


def test_plan_balances_longest_first_and_is_deterministic() -> None:
    modules = [module("moe", 89), module("gemm", 20), module("attn_a", 5), module("attn_b", 5)]
    costs = Costs({"moe": 5500.0, "gemm": 950.0, "attn_a": 70.0, "attn_b": 65.0}, {})
    assert plan(modules, costs, 2) == [["moe"], ["gemm", "attn_a", "attn_b"]]
    assert plan(modules, costs, 2) == plan(list(modules), costs, 2)
    shards = plan(modules, costs, 3)
    assert sorted(name for names in shards for name in names) == sorted(m.name for m in modules)
    assert shards == [["moe"], ["gemm"], ["attn_a", "attn_b"]]


def test_plan_refuses_more_shards_than_modules() -> None:
    with pytest.raises(UserError, match="use at most 2"):
        plan([module("a", 1), module("b", 1)], Costs({}, {}), 3)


def test_update_costs_merges_and_keeps_what_was_not_measured(tmp_path: Path) -> None:
    table = tmp_path / "ci" / "module-costs.json"
    update_costs(table, "first", modules={"a": 10.04, "b": 20.0})
    update_costs(table, "second", modules={"a": 12.0}, per_unit={"attention": 13.66})
    costs = load_costs(table)
    assert costs.modules == {"a": 12.0, "b": 20.0}
    assert costs.per_unit == {"attention": 13.7}
    assert json.loads(table.read_text())["measured_on"] == "second"


def test_a_damaged_cost_table_is_refused(tmp_path: Path) -> None:
    table = tmp_path / "module-costs.json"
    table.write_text("{not json")
    with pytest.raises(UserError, match="not a cost table"):
        load_costs(table)
    assert load_costs(tmp_path / "missing.json") == Costs({}, {})


def fake_wheel(path: Path, modules: list[str], package: str = "print('pkg')\n") -> Path:
    return zip_wheel(
        path,
        {
            "flashinfer_jit_cache/__init__.py": package.encode(),
            **{f"flashinfer_jit_cache/jit_cache/{n}/{n}.so": n.encode() for n in modules},
            "flashinfer_jit_cache-1.dist-info/WHEEL": b"Wheel-Version: 1.0\n",
        },
    )


def write_set(root: Path, plan_: list[list[str]], key: str = "k") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    shards_dir = root / "shards"
    for index, names in enumerate(plan_, start=1):
        spec = ShardSpec(index, len(plan_))
        wheel = fake_wheel(root / f"part{index}.whl", names)
        record = {"key": key, "index": index, "count": len(plan_), "plan": plan_}
        write_shard(shards_dir, spec, wheel, {**record, "modules": dict.fromkeys(names, "r")})
    return shards_dir


def test_read_shards_accepts_one_complete_set(tmp_path: Path) -> None:
    shards_dir = write_set(tmp_path, [["a"], ["b", "c"]])
    found = read_shards(shards_dir)
    assert [b.record["index"] for b in found] == [1, 2]
    merged = merge_wheels([b.wheel for b in found], tmp_path / "merged.whl")
    with zipfile.ZipFile(merged) as archive:
        names = sorted(archive.namelist())
    assert [n for n in names if n.endswith(".so")] == [
        f"flashinfer_jit_cache/jit_cache/{m}/{m}.so" for m in ("a", "b", "c")
    ]
    assert names.count("flashinfer_jit_cache/__init__.py") == 1


def test_read_shards_refuses_a_missing_shard(tmp_path: Path) -> None:
    shards_dir = write_set(tmp_path, [["a"], ["b"], ["c"]])
    shutil.rmtree(shards_dir / "2-of-3")
    with pytest.raises(UserError, match="shards 2 of 3 are missing"):
        read_shards(shards_dir)
    with pytest.raises(UserError, match="no shards"):
        read_shards(tmp_path / "empty")


def test_read_shards_refuses_shards_of_different_builds(tmp_path: Path) -> None:
    shards_dir = write_set(tmp_path / "one", [["a"], ["b"]])
    other = write_set(tmp_path / "other", [["a"], ["b"]], key="other")
    shutil.rmtree(shards_dir / "2-of-2")
    shutil.copytree(other / "2-of-2", shards_dir / "2-of-2")
    with pytest.raises(UserError, match="2 different builds"):
        read_shards(shards_dir)


def test_merge_refuses_parts_whose_package_files_differ(tmp_path: Path) -> None:
    first = fake_wheel(tmp_path / "1.whl", ["a"])
    second = fake_wheel(tmp_path / "2.whl", ["b"], package="print('other')\n")
    with pytest.raises(UserError, match="differ from the first shard"):
        merge_wheels([first, second], tmp_path / "merged.whl")
