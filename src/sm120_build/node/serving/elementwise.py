"""norm, cascade, rope and dsv3_fused_routing against plain-torch references."""

from __future__ import annotations

from typing import Any

from . import TOLERANCES, Row, compare

DTYPES = ("bfloat16", "float16")


def _generator(seed: int) -> Any:
    import torch

    return torch.Generator(device="cuda").manual_seed(seed)


def _randn(gen: Any, *shape: int, dtype: str = "float32") -> Any:
    import torch

    return torch.randn(*shape, generator=gen, device="cuda").to(getattr(torch, dtype))


def _rmsnorm(x: Any, weight: Any, eps: float) -> Any:
    import torch

    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


def norm(modules: list[str]) -> list[Row]:
    """rmsnorm, fused_add_rmsnorm and their Gemma forms (weight + 1), as sglang's RMSNorm and
    GemmaRMSNorm call them when flashinfer serves them (layers/layernorm.py:54)."""
    import flashinfer.norm as fn

    caller = "sglang/srt/layers/layernorm.py:54"
    rows = []
    for dtype in DTYPES:
        tolerance = TOLERANCES[dtype]
        for hidden in (4096, 7168):
            gen = _generator(hidden)
            x = _randn(gen, 77, hidden, dtype=dtype)
            residual = _randn(gen, 77, hidden, dtype=dtype)
            weight = (_randn(gen, hidden) * 0.1 + 1).to(x.dtype)
            eps = 1e-6
            case = f"{dtype}/h{hidden}"
            rows.append(
                compare(
                    "norm",
                    modules[0],
                    f"rmsnorm/{case}",
                    fn.rmsnorm(x, weight, eps),
                    _rmsnorm(x, weight, eps),
                    tolerance,
                    caller,
                )
            )
            rows.append(
                compare(
                    "norm",
                    modules[0],
                    f"gemma_rmsnorm/{case}",
                    fn.gemma_rmsnorm(x, weight, eps),
                    _rmsnorm(x, weight.float() + 1, eps),
                    tolerance,
                    caller,
                )
            )
            for gemma in (False, True):
                inout, res = x.clone(), residual.clone()
                summed = (x.float() + residual.float()).to(x.dtype)  # the kernel keeps this
                if gemma:
                    fn.gemma_fused_add_rmsnorm(inout, res, weight, eps)
                    expected = _rmsnorm(summed, weight.float() + 1, eps)
                else:
                    fn.fused_add_rmsnorm(inout, res, weight, eps)
                    expected = _rmsnorm(summed, weight, eps)
                name = "gemma_fused_add_rmsnorm" if gemma else "fused_add_rmsnorm"
                rows.append(
                    compare(
                        "norm", modules[0], f"{name}/{case}/out", inout, expected, tolerance, caller
                    )
                )
                rows.append(
                    compare(
                        "norm",
                        modules[0],
                        f"{name}/{case}/residual",
                        res,
                        summed,
                        tolerance,
                        caller,
                    )
                )
    return rows


def _merge(v_a: Any, s_a: Any, v_b: Any, s_b: Any) -> tuple[Any, Any]:
    """Two attention states merged by their log-sum-exp (base 2, as FlashInfer keeps it)."""
    import torch

    s_a, s_b = s_a.float(), s_b.float()
    top = torch.maximum(s_a, s_b)
    w_a, w_b = torch.exp2(s_a - top), torch.exp2(s_b - top)
    merged = (v_a.float() * w_a[..., None] + v_b.float() * w_b[..., None]) / (w_a + w_b)[..., None]
    return merged, top + torch.log2(w_a + w_b)


def cascade(modules: list[str]) -> list[Row]:
    """merge_state (layers/attention/flashinfer_backend.py:853, the ragged and paged halves
    of an extend) and merge_states."""
    import flashinfer.cascade as fc
    import torch

    caller = "sglang/srt/layers/attention/flashinfer_backend.py:853"
    rows = []
    for dtype in DTYPES:
        tolerance = TOLERANCES[dtype]
        gen = _generator(7)
        v_a, v_b = _randn(gen, 97, 32, 128, dtype=dtype), _randn(gen, 97, 32, 128, dtype=dtype)
        s_a, s_b = _randn(gen, 97, 32) * 4, _randn(gen, 97, 32) * 4
        got_v, got_s = fc.merge_state(v_a, s_a, v_b, s_b)
        want_v, want_s = _merge(v_a, s_a, v_b, s_b)
        module = modules[0]
        rows.append(
            compare("cascade", module, f"merge_state/{dtype}/v", got_v, want_v, tolerance, caller)
        )
        rows.append(
            compare(
                "cascade", module, f"merge_state/{dtype}/s", got_s, want_s, (1e-4, 1e-4), caller
            )
        )
        states = torch.stack([_randn(gen, 97, 32, 128, dtype=dtype) for _ in range(5)], dim=1)
        lses = torch.stack([_randn(gen, 97, 32) * 4 for _ in range(5)], dim=1)
        got_v, got_s = fc.merge_states(states, lses)
        want_v, want_s = states[:, 0].float(), lses[:, 0].float()
        for index in range(1, 5):
            want_v, want_s = _merge(want_v, want_s, states[:, index], lses[:, index])
        rows.append(
            compare("cascade", module, f"merge_states/{dtype}/v", got_v, want_v, tolerance, caller)
        )
        rows.append(
            compare(
                "cascade", module, f"merge_states/{dtype}/s", got_s, want_s, (1e-4, 1e-4), caller
            )
        )
    return rows


def _rope_reference(
    q: Any, positions: Any, cos_sin: Any, head_size: int, is_neox: bool = True
) -> Any:
    """Rotation of the first rotary_dim of each head: neox style rotates its two halves,
    GPT-J style its adjacent pairs."""
    import torch

    rotary = cos_sin.shape[1]
    x = q.float().view(q.shape[0], -1, head_size)
    cos, sin = cos_sin[positions].float().chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    part = x[..., :rotary]
    if is_neox:
        first, second = part.chunk(2, dim=-1)
        rotated = torch.cat([first * cos - second * sin, second * cos + first * sin], -1)
    else:
        even, odd = part[..., 0::2], part[..., 1::2]
        rotated = torch.stack([even * cos - odd * sin, odd * cos + even * sin], -1).flatten(-2)
    return torch.cat([rotated, x[..., rotary:]], -1).view(q.shape)


def rope(modules: list[str]) -> list[Row]:
    """apply_rope_with_cos_sin_cache_inplace, the call of FlashInfer's rope module sglang's
    RoPE makes where FlashInfer serves it (layers/rotary_embedding.py; sglang 0.5.9 uses its
    own kernel on CUDA, this is the FlashInfer module the wheel holds)."""
    import flashinfer.rope as fr
    import torch

    caller = "sglang/srt/layers/rotary_embedding.py:365"
    rows = []
    for dtype in DTYPES:
        gen = _generator(11)
        positions = torch.randint(0, 4096, (131,), generator=gen, device="cuda")
        inv_freq = 1.0 / (10000 ** (torch.arange(0, 128, 2, device="cuda").float() / 128))
        angles = torch.arange(4096, device="cuda").float()[:, None] * inv_freq[None, :]
        cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1)
        q = _randn(gen, 131, 32 * 128, dtype=dtype)
        k = _randn(gen, 131, 8 * 128, dtype=dtype)
        want_q = _rope_reference(q, positions, cos_sin, 128)
        want_k = _rope_reference(k, positions, cos_sin, 128)
        fr.apply_rope_with_cos_sin_cache_inplace(positions, q, k, 128, cos_sin, is_neox=True)
        rows.append(
            compare("rope", modules[0], f"neox/{dtype}/q", q, want_q, TOLERANCES[dtype], caller)
        )
        rows.append(
            compare("rope", modules[0], f"neox/{dtype}/k", k, want_k, TOLERANCES[dtype], caller)
        )
    return rows


def _grouped_topk(
    scores: Any, bias: Any, groups: int, top_groups: int, topk: int, scale: float
) -> tuple[Any, Any]:
    """DeepSeek-V3's no-aux routing (sglang's own biased_grouped_topk, in plain torch)."""
    import torch

    probabilities = scores.float().sigmoid()
    biased = probabilities + bias.float()
    tokens, experts = scores.shape
    grouped = biased.view(tokens, groups, experts // groups)
    group_scores = grouped.topk(2, dim=-1).values.sum(-1)
    chosen = group_scores.topk(top_groups, dim=-1).indices
    mask = torch.zeros(tokens, groups, device=scores.device, dtype=torch.bool)
    mask.scatter_(1, chosen, True)
    masked = biased.masked_fill(~mask.repeat_interleave(experts // groups, dim=1), float("-inf"))
    indices = masked.topk(topk, dim=-1).indices
    weights = probabilities.gather(1, indices)
    return weights / weights.sum(-1, keepdim=True) * scale, indices


def dsv3_routing(modules: list[str]) -> list[Row]:
    """fused_topk_deepseek as layers/moe/topk.py:780 calls it: 256 experts in 8 groups, the
    top 4 groups, 8 experts, fp32 scores."""
    import torch
    from flashinfer.fused_moe import fused_topk_deepseek

    caller = "sglang/srt/layers/moe/topk.py:780"
    gen = _generator(17)
    scores = _randn(gen, 64, 256)
    bias = _randn(gen, 256) * 0.1
    weights = torch.empty(64, 8, device="cuda", dtype=torch.float32)
    indices = torch.empty(64, 8, device="cuda", dtype=torch.int32)
    fused_topk_deepseek(scores, bias, 8, 4, 8, 2.5, weights, indices, True)
    want_weights, want_indices = _grouped_topk(scores, bias, 8, 4, 8, 2.5)
    # The same experts per token in any order; their weights in that order.
    got_sorted, order = indices.long().sort(dim=-1)
    want_sorted, want_order = want_indices.sort(dim=-1)
    same = bool(torch.equal(got_sorted, want_sorted))
    rows = [
        Row(
            "dsv3_fused_routing",
            modules[0],
            "experts/fp32/t64/e256",
            0.0,
            0.0,
            "PASS" if same else "FAIL",
            caller,
        )
    ]
    rows.append(
        compare(
            "dsv3_fused_routing",
            modules[0],
            "weights/fp32/t64/e256",
            weights.gather(1, order),
            want_weights.gather(1, want_order),
            (1e-5, 1e-5),  # fp32 throughout; only the order of a sum differs
            caller,
        )
    )
    return rows
