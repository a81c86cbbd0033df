"""Profiles derived from sglang's own code (derive/): the served-configuration file, the
rendered profiles-derived.toml, and, slow, a re-derivation that must give the checked-in
file."""

from __future__ import annotations

import os
import re
import shutil
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


def tomllib_loads(text: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    loaded: dict[str, Any] = tomllib.loads(text)
    return loaded


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
    # and the sum over its experts is a torch.compile'd function, compiled at its first call
    assert "torch.compile sglang.srt.layers.moe.fused_moe_triton.fused_moe." in " ".join(qwen)
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


TRTLLM_GEN = "flashinfer.jit.fused_moe:gen_trtllm_gen_fused_moe_sm100_module()"


def test_a_configuration_that_asks_for_a_module_its_gpu_cannot_build_is_not_served(
    tmp_path: Path,
) -> None:
    """gpt-oss at sglang's defaults on SM12x asked for trtllm-gen's fused MoE, which
    FlashInfer builds for major 10 only: it used to be written as an ordinary module of
    its profile and of `served`, and the build failed later. Now the configuration is
    listed as not servable, with the call, FlashInfer's reason and sglang's call site."""
    mha = PREFILL.format(qk=64, vo=64)
    refused = {
        **answer(mha, TRTLLM_GEN),
        "unavailable": [
            {
                "call": TRTLLM_GEN,
                "defined_at": "flashinfer/jit/fused_moe.py:1",
                "loaded_by": ["sglang/srt/layers/quantization/mxfp4.py:9 apply"],
                "reason": "RuntimeError: No supported CUDA architectures found for major "
                "versions [10].",
            }
        ],
    }
    text = render(
        [served("llama"), served("gpt-oss")],
        {"llama": answer(PREFILL.format(qk=128, vo=128)), "gpt-oss": refused},
        "0.5.9",
    )
    (tmp_path / "profiles-derived.toml").write_text(text)
    data = read_toml(tmp_path / "profiles-derived.toml")
    assert set(data["profiles"]) == {"llama", "served"}
    assert recipe_name(TRTLLM_GEN) not in data["modules"]
    assert recipe_name(mha) not in data["modules"]
    (entry,) = data["not_servable"]["gpt-oss"]["cannot_build"]
    assert entry["call"] == TRTLLM_GEN
    assert entry["loaded_by"] == ["sglang/srt/layers/quantization/mxfp4.py:9 apply"]
    assert "major versions [10]" in entry["reason"]
    assert data["profiles"]["served"]["description"].endswith(": llama")


def test_a_configuration_not_derived_now_keeps_what_the_file_held(tmp_path: Path) -> None:
    """`--config NAME`, or a replay that failed: the other configurations' profiles, their
    recipes and their not-servable entries stay as the file had them, and the union is made
    again over all of them."""
    one, two = PREFILL.format(qk=128, vo=128), PREFILL.format(qk=64, vo=64)
    first = render(
        [served("one"), served("two")], {"one": answer(one), "two": answer(two)}, "0.5.9"
    )
    previous = tomllib_loads(first)
    newer = PREFILL.format(qk=256, vo=256)
    again = render([served("one"), served("two")], {"one": answer(newer)}, "0.5.9", None, previous)
    data = tomllib_loads(again)
    assert data["profiles"]["two"] == previous["profiles"]["two"]
    assert data["modules"][recipe_name(two)] == previous["modules"][recipe_name(two)]
    assert data["profiles"]["one"]["modules"] == [recipe_name(newer)]
    assert recipe_name(one) not in data["modules"]  # nothing of one's old profile is left
    assert data["profiles"]["served"]["modules"] == [recipe_name(newer), recipe_name(two)]
    # Rendering again with the same inputs gives the same file.
    assert (
        render([served("one"), served("two")], {"one": answer(newer)}, "0.5.9", None, data) == again
    )


def test_a_draft_model_path_must_hold_a_model(tmp_path: Path) -> None:
    """speculative_draft_model_path used to be passed through unread: a path to nothing
    gave the same profile as a real draft."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "served-models.toml").write_text(
        '[models.a]\nmodel = "m"\narch = "12.0"\n'
        'server_args = { speculative_algorithm = "EAGLE", speculative_draft_model_path = "d" }\n'
    )
    with pytest.raises(UserError, match=r"speculative_draft_model_path = .*/d holds no config"):
        load_served(tmp_path)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "config.json").write_text("{}")
    (only,) = load_served(tmp_path)
    assert only.server_args["speculative_draft_model_path"] == str(tmp_path / "d")


def test_the_replays_stand_in_factories_keep_the_meta_device() -> None:
    """Weights built under torch.device("meta") stayed shapes only until the replay's
    stand-in factories (which send device="cuda" to the host) replaced torch.empty & co.:
    the meta context then no longer knew the real factories, and every weight was allocated
    on the host, in full (gpt-oss-120b: killed at 22 GB)."""
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import replay, torch\n"
        "replay._virtual_gpu((12, 0))\n"
        "with torch.device('meta'):\n"
        "    made = [torch.nn.Linear(4, 4).weight, torch.empty(3, device='cuda'),\n"
        "            torch.zeros(2, device='cuda:0', dtype=torch.bfloat16), torch.ones(2)]\n"
        "outside = [torch.empty(2, device='cuda'), torch.zeros(2)]\n"
        "print(' '.join(t.device.type for t in made + outside))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(REPO / "src" / "sm120_build" / "derive")],
        capture_output=True,
        text=True,
    )
    if "No module named 'torch'" in result.stderr:
        pytest.skip("torch is not installed in this Python (tests_fast on other Pythons)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["meta"] * 4 + ["cpu"] * 2


def gpt_oss_config() -> dict[str, Any]:
    """gpt-oss-120b's config.json, as the checkpoint ships it (no weights are read)."""
    return {
        "architectures": ["GptOssForCausalLM"],
        "attention_bias": True,
        "eos_token_id": 200002,
        "experts_per_token": 4,
        "head_dim": 64,
        "hidden_act": "silu",
        "hidden_size": 2880,
        "initial_context_length": 4096,
        "intermediate_size": 2880,
        "layer_types": ["sliding_attention", "full_attention"] * 18,
        "max_position_embeddings": 131072,
        "model_type": "gpt_oss",
        "num_attention_heads": 64,
        "num_experts_per_tok": 4,
        "num_hidden_layers": 36,
        "num_key_value_heads": 8,
        "num_local_experts": 128,
        "pad_token_id": 199999,
        "quantization_config": {
            "modules_to_not_convert": [
                "model.layers.*.self_attn",
                "model.layers.*.mlp.router",
                "model.embed_tokens",
                "lm_head",
            ],
            "quant_method": "mxfp4",
        },
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "factor": 32.0,
            "original_max_position_embeddings": 4096,
            "rope_type": "yarn",
            "truncate": False,
        },
        "rope_theta": 150000,
        "sliding_window": 128,
        "swiglu_limit": 7.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 201088,
    }


def eagle_draft_config() -> dict[str, Any]:
    """A one-layer EAGLE draft for Llama-3.1-8B, in float16 (as EAGLE-LLaMA3.1-Instruct-8B)."""
    return {
        "architectures": ["LlamaForCausalLMEagle"],
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "max_position_embeddings": 2048,
        "model_type": "llama",
        "num_attention_heads": 32,
        "num_hidden_layers": 1,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "vocab_size": 128256,
    }


@pytest.mark.slow
def test_configurations_outside_the_served_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The replay on configurations the checked-in file does not hold, with sglang 0.5.9's
    own code: gpt-oss-120b at TP 8 asks for trtllm-gen's fused MoE (FlashInfer builds it for
    major 10 only), so it is not servable, named with sglang's call site; at TP 1 the
    replay cannot reach its MoE kernels, so that configuration fails by name while the
    others are derived; a float16 EAGLE draft adds its own f16 prefill module. Then
    `--config` re-derives one configuration and keeps the rest as the file held them."""
    import json

    from sm120_build import pins, pipeline
    from sm120_build.derive import DERIVED_FILE, derive_profiles
    from sm120_build.layout import Layout

    repo = Layout.from_root(REPO)
    pinned = pins.load(repo.pins_file)
    pipeline.vendor_all(repo, pinned)  # the replay runs the patched trees, as the CLI does
    stack = tmp_path / "stack"
    stack.mkdir()
    for name in ("pins.toml", "profiles.toml"):
        shutil.copy(REPO / name, stack)
    (stack / "vendor").symlink_to(repo.vendor)
    shutil.copytree(REPO / "models" / "llama-3.1-8b-instruct", stack / "llama")
    unknown_type = {**json.loads((stack / "llama" / "config.json").read_text())}
    unknown_type["model_type"] = "no-such-model-type"
    for name, config in (
        ("gpt-oss", gpt_oss_config()),
        ("draft", eagle_draft_config()),
        ("unknown-type", unknown_type),
    ):
        (stack / name).mkdir()
        (stack / name / "config.json").write_text(json.dumps(config))
    (stack / "served-models.toml").write_text(
        '[models.llama]\nmodel = "llama"\narch = "12.0"\nserver_args = { tp_size = 1 }\n'
        '[models.llama-eagle]\nmodel = "llama"\narch = "12.0"\nserver_args = { tp_size = 1, '
        'speculative_algorithm = "EAGLE", speculative_draft_model_path = "draft", '
        "speculative_num_steps = 3, speculative_eagle_topk = 1, "
        "speculative_num_draft_tokens = 4 }\n"
        '[models.gpt-oss-tp8]\nmodel = "gpt-oss"\narch = "12.0"\nserver_args = { tp_size = 8 }\n'
        '[models.gpt-oss-tp1]\nmodel = "gpt-oss"\narch = "12.0"\nserver_args = { tp_size = 1 }\n'
        # Bad input: each refused by name, none reported as covered.
        '[models.unknown-type]\nmodel = "unknown-type"\narch = "12.0"\n'
        '[models.unknown-quant]\nmodel = "llama"\narch = "12.0"\n'
        'server_args = { quantization = "no-such-quantization" }\n'
        '[models.ngram]\nmodel = "llama"\narch = "12.0"\n'
        'server_args = { speculative_algorithm = "NGRAM" }\n'
    )
    layout = Layout(root=REPO, cache=repo.cache, stack_dir=stack)

    assert derive_profiles(layout, pinned, False, []) == 1
    data = read_toml(stack / DERIVED_FILE)
    assert set(data["profiles"]) == {"llama", "llama-eagle", "served"}
    said = capsys.readouterr().err
    for name, words in (
        ("unknown-type", "no-such-model-type"),
        ("unknown-quant", "no-such-quantization"),
        ("ngram", "speculative_algorithm NGRAM: the replay follows only the EAGLE family"),
    ):
        start = said.index(f"{name}: FAILED, the others go on")
        end = said.find("sm120-build: configuration ", start)
        assert words in said[start : end if end >= 0 else None], said[start:][:3000]
        assert name not in data.get("not_servable", {})
    (refused,) = data["not_servable"]["gpt-oss-tp8"]["cannot_build"]
    assert refused["call"] == TRTLLM_GEN
    assert "major versions [10]" in refused["reason"]
    assert any(
        site.startswith("sglang/srt/layers/quantization/mxfp4.py:") for site in refused["loaded_by"]
    )
    assert "gpt-oss-tp1" not in data["not_servable"]
    calls = {
        name: data["modules"][name]["call"]
        for name in data["profiles"]["llama-eagle"]["modules"]
        if name in data["modules"]
    }
    float16 = [
        c for c in calls.values() if "gen_batch_prefill_module" in c and "torch.float16" in c
    ]
    assert float16, calls
    assert not [
        n
        for n in data["profiles"]["llama"]["modules"]
        if "torch.float16" in data["modules"].get(n, {}).get("call", "")
    ]
    served = data["profiles"]["served"]["modules"]
    assert recipe_name(TRTLLM_GEN) not in served and recipe_name(float16[0]) in served

    # One configuration again: the file is the same, and the others were not replayed.
    before = (stack / DERIVED_FILE).read_text()
    # Only a failing one: nothing is derived, and the file is left as it was.
    assert derive_profiles(layout, pinned, False, ["gpt-oss-tp1"]) == 1
    assert (stack / DERIVED_FILE).read_text() == before
    assert derive_profiles(layout, pinned, False, ["llama"]) == 0
    assert (stack / DERIVED_FILE).read_text() == before
    with pytest.raises(
        UserError, match=r"no configuration 'nope' in served-models.toml \(known: llama"
    ):
        derive_profiles(layout, pinned, True, ["nope"])
