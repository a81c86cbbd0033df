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
    plan_table,
    read_shards,
    update_costs,
    write_shard,
)

from .conftest import refusal, zip_wheel


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
    assert refusal(read_shards, shards_dir) == (
        f"{shards_dir} holds shards of 2 different builds (inputs, profile, archs, toolkit or "
        "shard count differ); keep one build's shards only"
    )


def test_merge_refuses_parts_whose_package_files_differ(tmp_path: Path) -> None:
    first = fake_wheel(tmp_path / "1.whl", ["a"])
    second = fake_wheel(tmp_path / "2.whl", ["b"], package="print('other')\n")
    with pytest.raises(UserError, match="differ from the first shard"):
        merge_wheels([first, second], tmp_path / "merged.whl")


def test_shard_spec_bounds() -> None:
    assert ShardSpec.parse("1/1") == ShardSpec(1, 1)
    assert ShardSpec.parse(" 3/3 ") == ShardSpec(3, 3)
    assert refusal(ShardSpec.parse, "0/3") == "--shard 0/3: expected I/N with 1 <= I <= N, e.g. 2/4"


def test_the_plan_table_sums_each_shard() -> None:
    modules = [module("moe", 89), module("gemm", 20), module("attn", 5, recipe="attention")]
    costs = Costs({"moe": 5500.4, "gemm": 950.0}, {"attention": 14.0})
    table = plan_table(modules, costs, [["moe"], ["gemm", "attn"]])
    assert table == (
        "shard modules  units   est. s  largest module\n"
        "    1       1     89     5500  moe (5500 s)\n"
        "    2       2     25     1020  gemm (950 s)"
    )


def test_plan_adds_each_module_to_its_shards_load() -> None:
    """a (10) and b (6) open the two shards, c (5) joins b (6 < 10), d (2) joins a (10 < 11):
    only adding up each shard's load tells where d goes."""
    modules = [module("a", 1), module("b", 1), module("c", 1), module("d", 1)]
    costs = Costs({"a": 10.0, "b": 6.0, "c": 5.0, "d": 2.0}, {})
    assert plan(modules, costs, 2) == [["a", "d"], ["b", "c"]]
    assert plan(modules[:2], costs, 2) == [["a"], ["b"]]  # as many shards as modules


def test_a_cost_table_without_sections_is_empty_and_its_about_line_is_written(
    tmp_path: Path,
) -> None:
    table = tmp_path / "deep" / "ci" / "module-costs.json"
    table.parent.mkdir(parents=True)
    table.write_text("{}")
    assert load_costs(table) == Costs({}, {})
    table.unlink()
    update_costs(table, "here", modules={"a": 1.0})
    text = table.read_text()
    data = json.loads(text)
    assert text == json.dumps(data, indent=2, sort_keys=True) + "\n"
    assert data["about"] == (
        "Compiler seconds of one core: per module (sum over its translation units) where a "
        "build measured it, per translation unit by recipe where `nox -s bench -- --sample` "
        "did. The shard plan balances on these; `nox -s bench` refreshes them."
    )
    other = tmp_path / "new" / "nested" / "module-costs.json"
    update_costs(other, "there", per_unit={"x": 2.0})
    assert load_costs(other) == Costs({}, {"x": 2.0})


def test_a_written_shard_is_one_directory_with_its_record(tmp_path: Path) -> None:
    shards_dir = write_set(tmp_path, [["a"], ["b"]])
    assert sorted(p.name for p in shards_dir.iterdir()) == ["1-of-2", "2-of-2"]
    shard = shards_dir / "1-of-2"
    assert oct(shard.stat().st_mode & 0o777) == "0o755"
    text = (shard / "shard.json").read_text()
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"
    write_set(tmp_path, [["a"], ["b"]])  # written again: replaced, nothing left beside it
    assert sorted(p.name for p in shards_dir.iterdir()) == ["1-of-2", "2-of-2"]


def test_shard_refusals_name_the_shard(tmp_path: Path) -> None:
    shards_dir = write_set(tmp_path, [["a"], ["b"], ["c"], ["d"]])
    shutil.rmtree(shards_dir / "1-of-4")
    shutil.rmtree(shards_dir / "3-of-4")
    assert refusal(read_shards, shards_dir) == (
        f"{shards_dir}: shards 1, 3 of 4 are missing (found 2, 4); build them, then merge"
    )
    assert refusal(read_shards, tmp_path / "none") == (
        f"no shards in {tmp_path / 'none'}: run `nox -s build_shard -- --shard I/N` for each I "
        "(or download the shard artifacts there) first"
    )
    record = shards_dir / "2-of-4" / "shard.json"
    record.write_text("[]")
    message = refusal(read_shards, shards_dir)
    assert message.startswith(f"{record} is not a shard record of this tool (TypeError: ")
    assert message.endswith("; build that shard again with `nox -s build_shard`")


def test_a_shard_that_built_another_share_or_holds_two_wheels_is_refused(tmp_path: Path) -> None:
    shards_dir = tmp_path / "shards"
    wheel = fake_wheel(tmp_path / "part.whl", ["a"])
    record = {"key": "k", "index": 1, "count": 1, "plan": [["a", "b"]]}
    write_shard(shards_dir, ShardSpec(1, 1), wheel, {**record, "modules": {"a": "r"}})
    assert (
        refusal(read_shards, shards_dir)
        == "shard 1/1 built ['a'], not its share of the plan ['a', 'b']"
    )
    shutil.copy(wheel, shards_dir / "1-of-1" / "extra.whl")
    assert refusal(read_shards, shards_dir) == (
        f"{shards_dir / '1-of-1'} should hold one wheel, not 2: build it again"
    )


def test_a_repeated_shard_is_named_as_such(tmp_path: Path) -> None:
    """A second copy of shard 2 (a download named otherwise) was refused with "none of 2
    are missing (found 1, 2, 2)", which contradicts itself."""
    shards_dir = write_set(tmp_path, [["a"], ["b"]])
    shutil.copytree(shards_dir / "2-of-2", shards_dir / "2-of-2-again")
    assert refusal(read_shards, shards_dir) == (
        f"{shards_dir}: shard 2 of 2 is there twice (2-of-2, 2-of-2-again); keep one copy of "
        "each shard, then merge"
    )


def test_every_repeated_shard_is_named(tmp_path: Path) -> None:
    shards_dir = write_set(tmp_path, [["a"], ["b"]])
    for label in ("1-of-2", "2-of-2"):
        shutil.copytree(shards_dir / label, shards_dir / f"{label}-again")
    assert refusal(read_shards, shards_dir) == (
        f"{shards_dir}: shard 1 of 2 is there twice (1-of-2, 1-of-2-again); shard 2 of 2 is "
        "there twice (2-of-2, 2-of-2-again); keep one copy of each shard, then merge"
    )


def test_a_shard_numbered_outside_its_build_is_named(tmp_path: Path) -> None:
    """Records changed to shards 0 and 4 of 3 were refused as "shards 2, 3 of 3 are missing
    (found 0, 1, 4)": those shards' directories are there, and what is wrong is their
    records."""
    shards_dir = write_set(tmp_path, [["a"], ["b"], ["c"]])
    for label, index in (("2-of-3", 0), ("3-of-3", 4)):
        record_file = shards_dir / label / "shard.json"
        record = json.loads(record_file.read_text())
        record_file.write_text(json.dumps({**record, "index": index}))
    assert refusal(read_shards, shards_dir) == (
        f"{shards_dir}: shard numbers 0, 4 are outside the build's 1-3 (a record was changed); "
        "build those shards again, then merge"
    )


def test_a_shard_is_written_where_no_directory_was(tmp_path: Path) -> None:
    """build_shard's --out-dir may name a directory whose parents do not exist yet."""
    wheel = fake_wheel(tmp_path / "part.whl", ["a"])
    record = {"key": "k", "index": 1, "count": 1, "plan": [["a"]], "modules": {"a": "r"}}
    written = write_shard(tmp_path / "artifacts" / "shards", ShardSpec(1, 1), wheel, record)
    assert written == tmp_path / "artifacts" / "shards" / "1-of-1"
    assert [part.record["index"] for part in read_shards(written.parent)] == [1]
