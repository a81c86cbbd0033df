"""Profiles derived from sglang's own code (derive/): the served-configuration file, the
rendered profiles-derived.toml, and, slow, a re-derivation that must give the checked-in
file."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sm120_build.derive import Served, load_served, recipe_name, render
from sm120_build.errors import UserError
from sm120_build.pins import read_toml
from sm120_build.profiles import load

from .conftest import REPO

PREFILL = (
    "flashinfer.jit.attention.modules:gen_batch_prefill_module('fa2', torch.bfloat16, "
    "torch.bfloat16, torch.bfloat16, torch.int32, {qk}, {vo}, 0, False, False, False)"
)


def served(name: str, also: tuple[str, ...] = ()) -> Served:
    return Served(name, f"{name} test", Path("/m"), {"tp_size": 1}, (12, 0), also)


def answer(*calls: str) -> dict[str, Any]:
    return {
        "resolved": {"attention_backend": "flashinfer"},
        "requested": [
            {"call": c, "defined_at": "flashinfer/jit/x.py:1", "loaded_by": ["sglang/srt/y.py:2 f"]}
            for c in calls
        ],
    }


def test_the_served_file_names_what_is_wrong(tmp_path: Path) -> None:
    (tmp_path / "served-models.toml").write_text('[models.a]\nmodel = "nowhere"\narch = "12.0"\n')
    with pytest.raises(UserError, match=r"\[models.a\] model = .*nowhere holds no config.json"):
        load_served(tmp_path)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "served-models.toml").write_text('[models.a]\nmodel = "m"\narch = "twelve"\n')
    with pytest.raises(UserError, match=r'needs arch = "MAJOR.MINOR"'):
        load_served(tmp_path)
    (tmp_path / "served-models.toml").write_text(
        '[models."a.b"]\nmodel = "m"\narch = "12.1"\nserver_args = { tp_size = 8 }\n'
    )
    (only,) = load_served(tmp_path)
    assert (only.name, only.arch, only.server_args) == ("a.b", (12, 1), {"tp_size": 8})


def test_rendered_profiles_load_beside_the_hand_written_ones(tmp_path: Path) -> None:
    mha, mla = PREFILL.format(qk=128, vo=128), PREFILL.format(qk=192, vo=128)
    kv = "sglang.jit_kernel.kvcache:_jit_kvcache_module(2048)"
    text = render(
        [served("one", also=("cascade",)), served("two")],
        {"one": answer(mha, kv), "two": answer(mha, mla)},
        "0.5.9",
    )
    (tmp_path / "profiles-derived.toml").write_text(text)
    read_toml(tmp_path / "profiles-derived.toml")  # valid TOML
    hand = (REPO / "profiles.toml").read_text()
    (tmp_path / "profiles.toml").write_text(hand)
    profiles = load(tmp_path / "profiles.toml")
    assert profiles.profiles["one"] == (recipe_name(mha), recipe_name(kv), "cascade")
    assert profiles.profiles["served"] == (
        recipe_name(mha),
        recipe_name(kv),
        "cascade",
        recipe_name(mla),
    )
    assert profiles.recipes[recipe_name(mla)].call == mla
    assert recipe_name(mha).startswith("batch_prefill.") and recipe_name(kv).startswith("kvcache.")
    assert recipe_name(mha) != recipe_name(mla)
    # A name defined in both files is refused, not silently taken from one.
    (tmp_path / "profiles-derived.toml").write_text(text + '\n[modules.cascade]\ncall = "m:f()"\n')
    with pytest.raises(UserError, match=r"\[modules.cascade\] is defined twice"):
        load(tmp_path / "profiles.toml")


@pytest.mark.slow
def test_the_derived_profiles_are_what_sglang_asks_for() -> None:
    """Re-derive every served configuration with sglang 0.5.9's own code; the checked-in
    profiles-derived.toml must be what comes out."""
    result = subprocess.run(
        [sys.executable, "-m", "sm120_build", "derive-profiles", "--check"],
        cwd=REPO,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=3000,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    derived = load(REPO / "profiles.toml")
    calls = {name: derived.recipes[name].call for name in derived.profiles["served"]}
    # What the independent read of sglang found: DeepSeek's MLA ragged prefill is asked for,
    # no plan asks for a sliding window or a soft cap, and each model's KV row size.
    assert PREFILL.format(qk=192, vo=128) in calls.values()
    attention = [c for c in calls.values() if "gen_batch_prefill_module" in c]
    assert all(c.endswith("0, False, False, False)") for c in attention)
    # The backend's forward merges an extend over a cached prefix (cascade) for the MHA
    # models. GLM with --moe-runner-backend flashinfer_cutlass runs FlashInfer's fused MoE;
    # DeepSeek at the default backend runs sgl_kernel's (cutlass_moe_fp4) and routes with
    # sgl_kernel's moe_fused_gate (its shared expert is fused in, so FlashInfer's DeepSeek
    # routing is not taken); GLM's 160 experts are no power of two, so neither is it there.
    members = {name: set(recipes) for name, recipes in derived.profiles.items()}
    for name in ("llama-3.1-8b-instruct", "qwen3-30b-a3b-fp8", "glm-4.6-nvfp4"):
        assert "cascade" in members[name], name
    assert {"fused_moe_120", "fp4_gemm_cutlass_sm120"} <= members["glm-4.6-nvfp4"]
    assert "fp4_gemm_cutlass_sm120" in members["deepseek-v3-nvfp4"]
    assert not {"fused_moe_120", "dsv3_fused_routing"} & members["deepseek-v3-nvfp4"]
    assert "dsv3_fused_routing" not in members["served"]
    # The allreduce fusion only where --enable-flashinfer-allreduce-fusion asks for it.
    served = ["llama-3.1-8b-instruct", "qwen3-30b-a3b-fp8", "deepseek-v3-nvfp4", "glm-4.6-nvfp4"]
    assert [n for n in served if "trtllm_comm" in members[n]] == ["glm-4.6-nvfp4"]
    assert "trtllm_comm" in members["served"]
    # Speculative decoding (NEXTN: GLM's and DeepSeek's MTP layer): the target's verify step
    # plans a custom mask on the FA2 backend, which FlashInfer packs with `quantization`; the
    # MLA backend plans its verify without one, so DeepSeek asks for nothing more.
    assert members["glm-4.6-nvfp4-mtp"] == members["glm-4.6-nvfp4"] | {"quantization"}
    assert members["deepseek-v3-nvfp4-mtp"] == members["deepseek-v3-nvfp4"]
    # What compiles on the node outside these wheels: Qwen3-FP8's block-FP8 linears reach
    # DeepGEMM (which has no SM12x kernels in the pinned sgl_kernel), its experts Triton's
    # fused MoE; every configuration's KV index arrays are a Triton kernel.
    data = read_toml(REPO / "profiles-derived.toml")["profiles"]
    qwen = [entry["name"] for entry in data["qwen3-30b-a3b-fp8"]["compiled_on_node"]]
    assert any(name.startswith("deep_gemm deep_gemm.") for name in qwen)
    assert any("fused_moe_triton_kernels.fused_moe_kernel" in name for name in qwen)
    kv_index = [
        name
        for profile in data.values()
        for entry in profile.get("compiled_on_node", [])
        for name in [entry["name"]]
        if "create_flashinfer_kv_indices_triton" in name
    ]
    assert len(kv_index) == len(served) + 2
    kv = {
        profile: sorted(
            re.findall(
                r"_jit_kvcache_module\((\d+)\)", " ".join(derived.recipes[m].call for m in members)
            )
        )
        for profile, members in derived.profiles.items()
        if profile in ("llama-3.1-8b-instruct", "qwen3-30b-a3b-fp8", "glm-4.6-nvfp4")
    }
    assert kv == {
        "llama-3.1-8b-instruct": ["2048"],  # 8 KV heads x 128 x 2 bytes
        "qwen3-30b-a3b-fp8": ["1024"],  # 4 x 128 x 2
        "glm-4.6-nvfp4": ["256"],  # 8 KV heads over TP 8: 1 x 128 x 2
    }


def test_what_compiles_at_first_use_is_listed_in_its_profile(tmp_path: Path) -> None:
    mha = PREFILL.format(qk=128, vo=128)
    kernel = {
        "name": "triton sglang.srt.x.kernel",
        "defined_at": "sglang/srt/x.py:3",
        "loaded_by": ["sglang/srt/y.py:4 f"],
    }
    text = render(
        [served("one"), served("two")],
        {"one": {**answer(mha), "first_use": [kernel]}, "two": answer(mha)},
        "0.5.9",
    )
    (tmp_path / "profiles-derived.toml").write_text(text)
    profiles = read_toml(tmp_path / "profiles-derived.toml")["profiles"]
    assert profiles["one"]["compiled_on_node"] == [kernel]
    assert profiles["two"]["compiled_on_node"] == []
    assert profiles["one"]["resolved"] == {"attention_backend": "flashinfer"}
    (tmp_path / "profiles.toml").write_text((REPO / "profiles.toml").read_text())
    assert load(tmp_path / "profiles.toml").profiles["one"] == (recipe_name(mha),)


INJECTED = 'x"\n[modules.evil]\ncall = "os:system(\'touch /tmp/x\')"\n#'


def test_text_from_the_configurations_and_sglang_stays_data(tmp_path: Path) -> None:
    """A model name, a description, a resolved argument and a first-use entry that hold
    TOML of their own: it used to be written as it was (the union's description joined the
    names unescaped), so `served` became an injected recipe that the build evaluated."""
    mha = PREFILL.format(qk=128, vo=128)
    item = Served("one", INJECTED, Path("/m"), {}, (12, 0), ())
    sneaky = Served(INJECTED, "d", Path("/m"), {}, (12, 0), ())
    hostile = {
        "resolved": {"attention_backend": INJECTED},
        "requested": [{"call": mha, "defined_at": INJECTED, "loaded_by": [INJECTED]}],
        "first_use": [{"name": INJECTED, "defined_at": INJECTED, "loaded_by": [INJECTED]}],
    }
    text = render([item, sneaky], {"one": hostile, INJECTED: answer(mha)}, "0.5.9")
    (tmp_path / "profiles-derived.toml").write_text(text)
    data = read_toml(tmp_path / "profiles-derived.toml")
    assert list(data["modules"]) == [recipe_name(mha)]
    assert set(data["profiles"]) == {"one", INJECTED, "served"}
    assert data["profiles"]["served"]["description"].endswith(f"one, {INJECTED}")
    assert data["profiles"]["one"]["description"] == INJECTED
    assert data["profiles"]["one"]["resolved"] == {"attention_backend": INJECTED}


def test_a_served_configuration_name_must_be_plain(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "served-models.toml").write_text('[models."x\\"y"]\nmodel = "m"\narch = "12.0"\n')
    with pytest.raises(UserError, match="served configuration 'x\"y' is not a plain name"):
        load_served(tmp_path)


def test_a_call_a_hand_written_recipe_makes_is_named_by_it() -> None:
    quantize = "flashinfer.fp4_quantization:gen_fp4_quantization_sm120_module()"
    text = render(
        [served("one", also=("fp4_quantization_120",))],
        {"one": answer(quantize)},
        "0.5.9",
        {quantize: "fp4_quantization_120"},
    )
    assert "\n[modules." not in text  # nothing defined twice
    assert text.count('"fp4_quantization_120",') == 2  # once in the profile, once in the union
