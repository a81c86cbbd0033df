"""The cutlass fused MoE (fused_moe_120, SM12x code: it runs first on an SM120 node) with
NVFP4 weights and activations, as sglang 0.5.9's ModelOpt NVFP4 MoE calls it
(layers/quantization/modelopt_quant.py:1770), against a MoE in plain torch with the same
routing over the dequantized weights.

FlashInfer's fc1 weight holds the up projection first, then the gate ("w31",
layers/moe/fused_moe_triton/layer.py:706); the activation is SwiGLU, silu(gate) * up. The
kernel quantizes its input with the fc1 input scale and the intermediate with the fc2 input
scale, both to NVFP4, so the reference does the same through fp4.reference_dequantized.
"""

from __future__ import annotations

from typing import Any

from . import FAIL, PASS, Row
from .fp4 import BLOCK, reference_dequantized, unpack

EXPERTS, TOP_K, TOKENS, HIDDEN, INTERMEDIATE = 8, 2, 32, 512, 256
FP4_RANGE = 448.0 * 6.0  # e4m3's largest scale times e2m1's largest value
# Relative L2 error of the whole output. Each NVFP4 rounding moves a value by up to half a
# step of its block's amax / 6, and a value near a rounding boundary may round the other
# way in the kernel than in the reference (one step): both average out over the sums to a
# few per cent. A wrong expert, layout, swizzle or scale is off by O(1).
ALLOWED_RELATIVE_ERROR = 0.05


def reference_moe(
    x: Any,
    w13: Any,
    w2: Any,
    experts: Any,
    weights: Any,
    input_scale: float,
    intermediate_scale: float,
) -> Any:
    """sum over each token's experts of weight * fc2(swiglu(fc1(nvfp4(x)))), with the
    intermediate NVFP4-rounded; w13 [E, 2N, K] is [up; gate], w2 [E, K, N], fp32 values."""
    import torch

    x = reference_dequantized(x.float(), input_scale)
    out = torch.zeros(x.shape[0], w2.shape[1])
    for token in range(x.shape[0]):
        for slot in range(experts.shape[1]):
            expert = int(experts[token, slot])
            up, gate = (w13[expert] @ x[token]).chunk(2)
            hidden = (torch.nn.functional.silu(gate) * up)[None]
            hidden = reference_dequantized(hidden, intermediate_scale)[0]
            out[token] += float(weights[token, slot]) * (w2[expert] @ hidden)
    return out


def check(modules: list[str]) -> list[Row]:
    import torch
    from flashinfer import fp4_quantize
    from flashinfer.fused_moe import cutlass_fused_moe

    gen = torch.Generator(device="cuda").manual_seed(5)

    def draw(*shape: int, scale: float = 1.0) -> Any:
        return (torch.randn(*shape, generator=gen, device="cuda") * scale).to(torch.bfloat16)

    x = draw(TOKENS, HIDDEN)
    w13 = draw(EXPERTS, 2 * INTERMEDIATE, HIDDEN, scale=0.05)
    w2 = draw(EXPERTS, HIDDEN, INTERMEDIATE, scale=0.05)
    logits = torch.randn(TOKENS, EXPERTS, generator=gen, device="cuda")
    top = logits.softmax(-1).topk(TOP_K, dim=-1)
    weights, experts = top.values.float(), top.indices.to(torch.int32)

    def quantize(w: Any) -> tuple[Any, Any, Any, Any]:
        """Per expert: packed values, swizzled scales (for the kernel), the dequantized
        values (from the linear scales, for the reference) and the global scales."""
        scales = FP4_RANGE / w.float().abs().amax(dim=(1, 2))
        packed, swizzled, values = [], [], []
        for expert in range(w.shape[0]):
            scale = scales[expert : expert + 1]
            q, sf = fp4_quantize(w[expert], scale, is_sf_swizzled_layout=True)
            q_linear, sf_linear = fp4_quantize(w[expert], scale, is_sf_swizzled_layout=False)
            packed.append(q.view(torch.uint8))
            swizzled.append(sf.view(torch.uint8).reshape(w.shape[1], -1))
            values.append(
                unpack(
                    q_linear.view(torch.uint8).cpu(),
                    sf_linear.view(torch.uint8).cpu().view(w.shape[1], w.shape[2] // BLOCK),
                    float(scale),
                )
            )
        return torch.stack(packed), torch.stack(swizzled), torch.stack(values), scales

    w13_packed, w13_sf, w13_values, w13_scales = quantize(w13)
    w2_packed, w2_sf, w2_values, w2_scales = quantize(w2)
    input_scale = FP4_RANGE / float(x.float().abs().max())
    # The fc2 input scale from the intermediate's range over every expert, as a calibrated
    # checkpoint has it.
    up, gate = torch.einsum("tk,enk->ten", x.float(), w13.float()).chunk(2, dim=-1)
    intermediate_scale = FP4_RANGE / float((torch.nn.functional.silu(gate) * up).abs().max())
    a1 = torch.tensor([input_scale], device="cuda")
    a2 = torch.tensor([intermediate_scale], device="cuda")
    output = torch.empty(TOKENS, HIDDEN, dtype=torch.bfloat16, device="cuda")
    cutlass_fused_moe(
        output=output,
        input=x,
        token_selected_experts=experts,
        token_final_scales=weights,
        fc1_expert_weights=w13_packed.view(torch.long),
        fc2_expert_weights=w2_packed.view(torch.long),
        output_dtype=torch.bfloat16,
        quant_scales=[
            a1,
            w13_sf.view(torch.int32),
            1.0 / (a1 * w13_scales),
            a2,
            w2_sf.view(torch.int32),
            1.0 / (a2 * w2_scales),
        ],
    )
    torch.cuda.synchronize()
    expected = reference_moe(
        x.cpu(),
        w13_values,
        w2_values,
        experts.cpu(),
        weights.cpu(),
        input_scale,
        intermediate_scale,
    )
    got = output.float().cpu()
    finite = bool(torch.isfinite(got).all())
    error = float((got - expected).norm() / expected.norm()) if finite else float("inf")
    ok = finite and error <= ALLOWED_RELATIVE_ERROR
    return [
        Row(
            "fused_moe",
            modules[0],
            f"nvfp4/swiglu/e{EXPERTS}/top{TOP_K}/{TOKENS}x{HIDDEN}x{INTERMEDIATE} (relative L2)",
            error,
            ALLOWED_RELATIVE_ERROR,
            PASS if ok else FAIL,
            "sglang/srt/layers/quantization/modelopt_quant.py:1770",
        )
    ]
