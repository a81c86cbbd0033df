"""The README's table of what compiles on a node is generated from each stack's
profiles-derived.toml: the checked-in README holds exactly that table, and each kind of row
comes from the records it names. derive_profiles' --check of it runs in test_derive.py's
re-derivation (slow)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sm120_build.derive import readme
from sm120_build.errors import UserError
from sm120_build.layout import Layout
from sm120_build.profiles import DERIVED_FILE

from .conftest import REPO

DERIVED = """\
[modules."batch_prefill.1"]
call = "flashinfer.jit.attention:gen_batch_prefill_module('fa2')"

[modules.sglang_kvcache_2048]
call = "sglang.jit_kernel.kvcache:_jit_kvcache_module(2048)"

[profiles.small]
description = "Small, TP 1"
modules = ["batch_prefill.1", "sglang_kvcache_2048", "comm"]

[[profiles.small.compiled_on_node]]
name = "triton sglang.srt.layers.attention.utils.kv_indices"
defined_at = "u.py:16"
loaded_by = ["b.py:10 plan", "b.py:20 plan"]

[[profiles.small.compiled_on_node]]
name = "deep_gemm deep_gemm.gemm"
defined_at = "d.py:1"
loaded_by = []

[profiles.bare]
description = "Bare"
modules = []
compiled_on_node = []

[profiles.served]
description = "every servable configuration"
modules = ["batch_prefill.1", "sglang_kvcache_2048", "comm"]

[[not_servable.big.cannot_build]]
call = "flashinfer.fused_moe:gen_trtllm_gen_fused_moe_sm100_module()"
reason = "supported major versions [10]"
loaded_by = ["m.py:5 apply"]

[not_servable.big]
description = "Big, TP 8"
arch = "12.0"
"""


def test_the_readme_holds_the_table_the_derived_files_give() -> None:
    text = (REPO / "README.md").read_text()
    assert readme.is_current(REPO / "README.md", REPO)
    # One row per configuration each stack derived.
    section = text[text.index(readme.BEGIN) : text.index(readme.END)]
    for stack in ("sglang-0.5.9", "sglang-0.5.23"):
        assert f"| `{stack}` | `llama-3.1-8b-instruct`: " in section


def test_a_hand_edit_of_the_table_is_told_apart(tmp_path: Path) -> None:
    edited = tmp_path / "README.md"
    edited.write_text((REPO / "README.md").read_text().replace("Triton `", "Triton (edited) `", 1))
    assert not readme.is_current(edited, REPO)
    assert readme.regenerated(edited, REPO) == (REPO / "README.md").read_text()


def test_each_row_says_what_its_records_say(tmp_path: Path) -> None:
    (tmp_path / "profiles.toml").write_text('[modules.comm]\ncall = "flashinfer.comm:gen()"\n')
    (tmp_path / DERIVED_FILE).write_text(DERIVED)
    small, bare, big = readme.stack_rows("sglang-x", tmp_path)
    assert small == (
        "| `sglang-x` | `small`: Small, TP 1 | 2 FlashInfer module(s); sglang's "
        "`sglang_kvcache_2048` | Triton `kv_indices` (u.py:16; from b.py:10 plan)<br>"
        "DeepGEMM `gemm` (d.py:1; from an unknown site) |"
    )
    assert (
        bare
        == "| `sglang-x` | `bare`: Bare | 0 FlashInfer module(s) | nothing the replay reached |"
    )
    assert big == (
        "| `sglang-x` | `big`: Big, TP 8 | not servable on SM120 with these arguments | needs "
        "`flashinfer.fused_moe:gen_trtllm_gen_fused_moe_sm100_module()` "
        "(supported major versions [10]) |"
    )
    (tmp_path / DERIVED_FILE).unlink()
    assert readme.stack_rows("sglang-x", tmp_path) == [
        "| `sglang-x` | (none derived yet: docs/stacks.md, Derivation) | | |"
    ]


def test_a_readme_without_the_markers_is_refused_naming_them() -> None:
    with pytest.raises(UserError) as refused:
        readme.rewritten("# README\n", "table")
    assert readme.BEGIN in str(refused.value) and readme.END in str(refused.value)
    # Markers in the wrong order are no section either.
    with pytest.raises(UserError):
        readme.rewritten(f"{readme.END}\n{readme.BEGIN}\n", "table")


def test_the_section_is_replaced_markers_and_all_and_nothing_else() -> None:
    text = f"before\n{readme.BEGIN}\nold\n{readme.END}\nafter\n"
    assert readme.rewritten(text, f"{readme.BEGIN}\nnew\n{readme.END}") == (
        f"before\n{readme.BEGIN}\nnew\n{readme.END}\nafter\n"
    )


def test_only_the_checkout_s_own_stacks_rewrite_its_readme(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "stacks" / "sglang-0.5.23").mkdir(parents=True)
    shutil.copy(REPO / "pins.toml", root)
    shutil.copy(REPO / "stacks" / "sglang-0.5.23" / "pins.toml", root / "stacks" / "sglang-0.5.23")
    assert readme.is_checkout_stack(Layout(root=root, cache=tmp_path))
    other = Layout(root=root, cache=tmp_path, stack_dir=root / "stacks" / "sglang-0.5.23")
    assert readme.is_checkout_stack(other)
    assert not readme.is_checkout_stack(
        Layout(root=root, cache=tmp_path, stack_dir=tmp_path / "elsewhere")
    )
