"""verify_gpu's plain-torch references, on CPU against hand-worked small cases, and its
comparison failing on a wrong result. The SM12x-only checks (fp4) run first on an SM120 node:
these tests are what stands behind their references until then."""

from __future__ import annotations

import math
from itertools import pairwise
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the references are torch code (tests session)")

from sm120_build.node.serving import FAIL, PASS, TOLERANCES, compare  # noqa: E402
from sm120_build.node.serving.attention import cases, reference  # noqa: E402
from sm120_build.node.serving.elementwise import _grouped_topk, _merge, _rope_reference  # noqa: E402
from sm120_build.node.serving.fp4 import (  # noqa: E402
    judge,
    reference_dequantized,
    round_to_e2m1,
    unpack,
)
from sm120_build.node.serving.gemm import dequantize_block_fp8  # noqa: E402
from sm120_build.node.serving.mask import EXACT, pack, segment_pack  # noqa: E402
from sm120_build.node.serving.moe import reference_moe  # noqa: E402


def test_e2m1_rounds_to_nearest_ties_to_even_and_saturates() -> None:
    x = torch.tensor([0.24, 0.25, 0.26, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -0.75, -5.5])
    want = [0.0, 0.0, 0.5, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, -1.0, -6.0]
    assert round_to_e2m1(x).tolist() == want


def test_nvfp4_reference_scales_each_block_by_its_amax() -> None:
    block = torch.zeros(1, 16)
    block[0, :3] = torch.tensor([12.0, 5.0, 1.0])  # amax 12: scale e4m3(2) = 2
    assert reference_dequantized(block, 1.0)[0, :3].tolist() == [12.0, 4.0, 1.0]
    exact = torch.tensor([[6.0, 3.0, 1.5, 0.5] + [0.0] * 12])  # amax 6: scale 1, all exact
    assert torch.equal(reference_dequantized(exact, 1.0), exact)
    # The global scale divides out again: 24 * (1/4) -> 6, back to 24.
    assert reference_dequantized(exact * 4, 0.25)[0, :4].tolist() == [24.0, 12.0, 6.0, 2.0]


def test_unpack_reads_low_nibble_first_and_the_e4m3_scale() -> None:
    packed = torch.tensor([[0x21, 0x9F] + [0] * 6], dtype=torch.uint8)  # 16 values
    scales = torch.tensor([[0x40]], dtype=torch.uint8)  # e4m3 0x40 = 2.0
    values = unpack(packed, scales, 1.0)
    assert values[0, :4].tolist() == [1.0, 2.0, -12.0, -1.0]


def test_attention_reference_on_a_hand_worked_case() -> None:
    """One query over two keys: logits 0 and 1*1/sqrt(2)... softmax by hand."""
    q = torch.tensor([[[1.0, 0.0]]])  # [qo=1, heads=1, dim=2]
    k = torch.tensor([[[0.0, 1.0]], [[2.0, 0.0]]])  # [kv=2, heads=1, dim=2]
    v = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]])
    scale = 0.5
    weights = torch.tensor([math.exp(0.0), math.exp(2.0 * scale)])
    weights /= weights.sum()
    want = weights[0] * v[0] + weights[1] * v[1]
    got = reference(q, k, v, causal=True, window=-1, cap=None, sm_scale=scale)
    assert torch.allclose(got[0], want, atol=1e-6)
    # A window of 0 lets the query (at position 1) see only key 1; causal with qo = kv
    # would let the first query see key 0 alone.
    assert torch.allclose(reference(q, k, v, True, 0, None, scale)[0], v[1], atol=1e-6)
    two = torch.cat([q, q])
    assert torch.allclose(reference(two, k, v, True, -1, None, scale)[0], v[0], atol=1e-6)
    capped = reference(q, k, v, True, -1, 0.5, scale)[0]
    weights = torch.tensor([1.0, math.exp(0.5 * math.tanh(1.0 / 0.5))])
    assert torch.allclose(capped, (weights / weights.sum()) @ v[:, 0], atol=1e-6)


def test_merging_attention_states_matches_one_softmax_over_both() -> None:
    """Two halves of a softmax, merged by their base-2 log-sum-exp, give the whole."""
    logits = torch.tensor([0.5, -1.0, 2.0, 0.25])
    values = torch.tensor([[1.0], [2.0], [3.0], [4.0]])

    def state(part: slice) -> tuple[Any, Any]:
        w = torch.softmax(logits[part], 0)
        return (w[:, None] * values[part]).sum(0)[None], torch.logsumexp(logits[part], 0)[
            None
        ] / math.log(2)

    (v_a, s_a), (v_b, s_b) = state(slice(0, 2)), state(slice(2, 4))
    merged, lse = _merge(v_a, s_a, v_b, s_b)
    whole = (torch.softmax(logits, 0)[:, None] * values).sum(0)
    assert torch.allclose(merged[0], whole, atol=1e-6)
    assert torch.allclose(lse, torch.logsumexp(logits, 0)[None] / math.log(2), atol=1e-6)


def test_rope_reference_rotates_neox_halves() -> None:
    q = torch.tensor([[1.0, 0.0, 0.0, 1.0]])  # one head of dim 4: halves (1,0) and (0,1)
    angle = math.pi / 2
    cos_sin = torch.tensor([[1.0, 1.0, 0.0, 0.0], [math.cos(angle), 1.0, math.sin(angle), 0.0]])
    rotated = _rope_reference(q, torch.tensor([1]), cos_sin, 4)
    # pair 0: (x0, x2) = (1, 0) turned by 90 degrees -> (0, 1); pair 1 (angle 0) unchanged.
    assert torch.allclose(rotated, torch.tensor([[0.0, 0.0, 1.0, 1.0]]), atol=1e-6)


def test_grouped_topk_keeps_the_best_groups_and_normalises() -> None:
    scores = torch.full((1, 8), -10.0)
    scores[0, [0, 1, 6]] = torch.tensor([3.0, 2.0, 4.0])  # groups of 2: {0,1} and {6,7} lead
    weights, indices = _grouped_topk(
        scores, torch.zeros(8), groups=4, top_groups=2, topk=2, scale=2.0
    )
    assert sorted(indices[0].tolist()) == [0, 6]
    probabilities = torch.sigmoid(torch.tensor([3.0, 4.0]))
    order = indices[0].tolist()
    want = probabilities / probabilities.sum() * 2.0
    assert torch.allclose(weights[0], want if order == [0, 6] else want.flip(0), atol=1e-6)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_comparison_fails_a_wrong_result_and_passes_the_right_one(dtype: str) -> None:
    """Every check ends in compare(): a perturbed output, or one NaN, fails it."""
    expected = torch.randn(64, 128, generator=torch.Generator().manual_seed(0))
    right = expected.to(getattr(torch, dtype))
    assert compare("r", "m", "c", right, expected, TOLERANCES[dtype], "").status == PASS
    wrong = right.clone()
    wrong[3, 7] += 0.25  # one element off by a fraction of its scale
    assert compare("r", "m", "c", wrong, expected, TOLERANCES[dtype], "").status == FAIL
    poisoned = right.clone()
    poisoned[0, 0] = float("nan")
    assert compare("r", "m", "c", poisoned, expected, TOLERANCES[dtype], "").status == FAIL


def test_a_sink_adds_its_exponential_to_the_denominator_alone() -> None:
    """One query over one key (logit 1 after scaling) and a sink logit of 0: the value is
    weighted e / (e + 1); without the sink it would be weighted 1."""
    q = torch.tensor([[[1.0, 0.0]]])
    k = torch.tensor([[[2.0, 0.0]]])
    v = torch.tensor([[[3.0, -1.0]]])
    got = reference(q, k, v, True, -1, None, 0.5, sink=torch.tensor([0.0]))
    weight = math.e / (math.e + 1)
    assert torch.allclose(got[0, 0], torch.tensor([3.0, -1.0]) * weight, atol=1e-6)
    assert torch.allclose(reference(q, k, v, True, -1, None, 0.5)[0, 0], v[0, 0], atol=1e-6)


def test_mla_reference_is_attention_over_the_latent_and_rotary_parts() -> None:
    """MLA as mla.py feeds the reference: keys [ckv | kpe], values ckv, one KV head for all
    query heads. Two keys, hand-worked: logits (q_nope.ckv + q_pe.kpe) * scale."""
    q = torch.tensor([[[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]])  # 2 heads: nope (2) | pe (1)
    ckv = torch.tensor([[[1.0, 0.0]], [[0.0, 2.0]]])
    kpe = torch.tensor([[[1.0]], [[0.0]]])
    got = reference(q, torch.cat([ckv, kpe], -1), ckv, False, -1, None, 1.0)
    for head, logits in ((0, [2.0, 0.0]), (1, [0.0, 2.0])):
        w = torch.softmax(torch.tensor(logits), 0)
        assert torch.allclose(got[0, head], w[0] * ckv[0, 0] + w[1] * ckv[1, 0], atol=1e-6)


def test_fp4_quantization_check_fails_a_value_off_by_more_than_one_step() -> None:
    """The fp4 quantization check's verdict on CPU: the reference's own values pass; one
    value moved by two steps, or more than 0.1 % of values moved by one, fail."""
    x = torch.randn(128, 512, generator=torch.Generator().manual_seed(3)) * 3
    scale = 448.0 * 6.0 / float(x.abs().max())
    want = reference_dequantized(x, scale)
    assert judge(want.clone(), want)[2]
    step = float(want[5, :16].abs().max()) / 6
    wrong = want.clone()
    wrong[5, 3] += 2 * step
    assert not judge(wrong, want)[2]
    many = want.clone()
    many[:, 0] += want.abs().view(128, -1, 16).amax(-1)[:, 0] / 6  # one step, 1/512 of values
    assert not judge(many, want)[2]


def test_block_fp8_dequantization_scales_each_block() -> None:
    values = torch.ones(2, 256)
    scales = torch.tensor([[2.0, 3.0]])  # one 2-row block (rows_per_scale 2), two 128 groups
    got = dequantize_block_fp8(values, scales, 2)
    assert got[:, :128].eq(2.0).all() and got[:, 128:].eq(3.0).all()
    per_row = dequantize_block_fp8(values, torch.tensor([[1.0, 4.0], [5.0, 6.0]]), 1)
    assert per_row[1, 0] == 5.0 and per_row[0, 255] == 4.0


@pytest.mark.parametrize(
    ("module", "layouts"),
    [
        (
            "batch_prefill_with_kv_cache_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_dtype_idx_i32_"
            "head_dim_qk_192_head_dim_vo_128_posenc_0_use_swa_False_use_logits_cap_False_f16qk_False",
            ["ragged"],
        ),
        (
            "batch_prefill_with_kv_cache_dtype_q_bf16_dtype_kv_e4m3_dtype_o_bf16_dtype_idx_i32_"
            "head_dim_qk_64_head_dim_vo_64_posenc_0_use_swa_True_use_logits_cap_False_f16qk_False",
            ["paged", "paged"],
        ),
        (
            "single_decode_with_kv_cache_dtype_q_f16_dtype_kv_f16_dtype_o_f16_head_dim_qk_128_"
            "head_dim_vo_128_posenc_0_use_swa_False_use_logits_cap_True",
            ["single_decode"],
        ),
        (
            "batch_attention_with_kv_cache_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_dtype_idx_i32_"
            "head_dim_qk_64_head_dim_vo_64_posenc_0_use_logits_soft_cap_true_use_profiler_false",
            ["holistic", "holistic"],
        ),
        ("batch_prefill_attention_sink_bf16_swa_True_fa2", ["sink", "sink"]),
        # upstream's AOT name for the same sink kernels: the public wrapper never loads it
        (
            "batch_prefill_with_attention_sink_kv_cache_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_"
            "dtype_idx_i32_head_dim_qk_64_head_dim_vo_64_use_swa_False_",
            [],
        ),
    ],
)
def test_each_attention_module_name_asks_for_its_runs(module: str, layouts: list[str]) -> None:
    found = cases(module)
    assert [case.layout for case in found] == layouts
    if "swa_True" in module:
        assert all(case.window > 0 for case in found)
    if "cap_True" in module or "soft_cap_true" in module:
        assert all(case.cap for case in found)


def test_moe_reference_routes_through_swiglu_and_rounds_the_intermediate() -> None:
    """One token, expert 1 of 2 at weight 0.5, fc1 rows [up; gate]: up = gate = 6, so the
    intermediate is silu(6) * 6 = 35.91, which NVFP4 with a scale of 1 rounds to 36 (block
    scale e4m3(35.91 / 6) = 6, 5.985 -> e2m1 6); fc2 passes it on: 0.5 * 36 = 18."""
    hidden, inter = 16, 16
    x = torch.zeros(1, hidden)
    x[0, 0] = 6.0
    w13 = torch.zeros(2, 2 * inter, hidden)
    w13[1, 0, 0] = 1.0  # up[0]
    w13[1, inter, 0] = 1.0  # gate[0]
    w13[0] = 5.0  # expert 0 is not routed to: it must not count
    w2 = torch.zeros(2, hidden, inter)
    w2[1, 0, 0] = 1.0
    out = reference_moe(
        x, w13, w2, torch.tensor([[1]]), torch.tensor([[0.5]]), 1.0, intermediate_scale=1.0
    )
    want = torch.zeros(1, hidden)
    want[0, 0] = 18.0
    assert torch.equal(out, want)


@pytest.mark.parametrize("bitorder", ["big", "little"])
def test_the_mask_packer_is_numpys_packbits(bitorder: str) -> None:
    """FlashInfer documents packbits and segment_packbits as numpy.packbits per segment."""
    numpy = pytest.importorskip("numpy")
    bits = torch.rand(1003, generator=torch.Generator().manual_seed(3)) < 0.5
    want = numpy.packbits(bits.numpy(), bitorder=bitorder)
    assert pack(bits, bitorder).numpy().tolist() == want.tolist()
    indptr = [0, 5, 5, 21, 1003]  # an empty segment, one of two bytes, one ragged
    packed, packed_indptr = segment_pack(bits, indptr, bitorder)
    parts = [numpy.packbits(bits[a:b].numpy(), bitorder=bitorder) for a, b in pairwise(indptr)]
    assert packed.numpy().tolist() == numpy.concatenate(parts).tolist()
    assert packed_indptr == [0, 1, 1, 3, 3 + (1003 - 21 + 7) // 8]


def test_a_packed_mask_one_bit_off_fails_the_exact_comparison() -> None:
    """What tests/device/checks_fail_on_wrong_results.py does to segment_packbits on a GPU:
    one bit flipped in thousands fails the quantization check's row; the right bytes pass."""
    bits = torch.rand(4003, generator=torch.Generator().manual_seed(5)) < 0.5
    want = pack(bits, "little")
    wrong = want.clone()
    wrong[len(wrong) // 3] ^= 1
    assert compare("quantization", "m", "c", wrong, want, EXACT, "x").status == FAIL
    assert compare("quantization", "m", "c", want.clone(), want, EXACT, "x").status == PASS


def test_every_module_of_the_served_profile_has_a_check() -> None:
    """Derived recipes are named by their generator and a digest (batch_prefill.bf3c4f2a):
    verify_gpu finds their family by that stem, so the served profile has no module without
    a check (trtllm_comm is checked over ranks, sglang's kernels by module name)."""
    from pathlib import Path

    from sm120_build.node.serving import check_for, checks
    from sm120_build.profiles import load

    profiles = load(Path(__file__).resolve().parents[1] / "profiles.toml")
    families = checks()
    unchecked = [
        recipe
        for recipe in profiles.profiles["served"]
        if recipe != "trtllm_comm"
        and not recipe.startswith(("sglang_", "kvcache."))
        and check_for(recipe, families) is None
    ]
    assert unchecked == []
    assert check_for("batch_prefill.bf3c4f2a", families) is families["attention"]
    assert check_for("batch_mla.87606514", families) is families["attention"]
    assert check_for("nothing.12345678", families) is None
