"""NVFP4 quantization (fp4_quantization_120/121: SM12x code, which runs first on an SM120
node) against a plain-torch reference: FP4 e2m1 values with one ue4m3 (fp8 e4m3) scale per
16 elements, the whole tensor scaled by a global fp32 scale first."""

from __future__ import annotations

from typing import Any

from . import FAIL, PASS, Row

BLOCK = 16
# The e2m1 magnitudes, by their 3-bit code.
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def round_to_e2m1(x: Any) -> Any:
    """The nearest e2m1 value (ties to the even code, as cvt.rn does), saturating at 6."""
    import torch

    values = torch.tensor(E2M1, dtype=torch.float32)
    magnitude = x.abs().clamp(max=6.0)
    distance = (magnitude[..., None] - values).abs()
    nearest = distance.min(dim=-1, keepdim=True).values
    ties = distance == nearest
    # Of two equally near codes, the even one: prefer the lower code unless it is odd.
    codes = torch.arange(8)
    preferred = ties & (codes % 2 == 0)
    choose = torch.where(preferred.any(-1, keepdim=True), preferred, ties)
    code = choose.float().argmax(dim=-1)
    return torch.sign(x) * values[code]


def reference_dequantized(x: Any, global_scale: float) -> Any:
    """What quantizing x to NVFP4 and back gives: per 16-element block, the scale
    sf = e4m3(amax / 6 * global_scale), then e2m1(x * global_scale / sf) * sf / global_scale."""
    import torch

    rows, cols = x.shape
    blocks = x.float().view(rows, cols // BLOCK, BLOCK)
    amax = blocks.abs().amax(-1, keepdim=True)
    scale = (amax / 6.0 * global_scale).to(torch.float8_e4m3fn).float()
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    quantized = round_to_e2m1(blocks * global_scale / safe)
    return (quantized * scale / global_scale).view(rows, cols)


def unpack(packed: Any, scales: Any, global_scale: float) -> Any:
    """A [M, K/2] uint8 tensor of e2m1 pairs (low nibble first) and its linear [M, K/16]
    ue4m3 scales -> the values they stand for."""
    import torch

    values = torch.tensor(E2M1 + tuple(-v for v in E2M1), dtype=torch.float32)
    nibbles = torch.stack([packed & 0xF, packed >> 4], dim=-1).view(packed.shape[0], -1).long()
    decoded = values[nibbles]
    block_scales = scales.view(torch.float8_e4m3fn).float().repeat_interleave(BLOCK, dim=1)
    return decoded * block_scales / global_scale


def judge(got: Any, want: Any) -> tuple[float, float, bool]:
    """Kernel's dequantized values against the reference's: the same e2m1 code and scale
    almost everywhere; an fp32 rounding of the scale may move a value that sits on a
    rounding boundary by one step (the block's amax / 6), never more, and on at most 0.1 %
    of the values. -> (share of values off, worst distance in steps, within bounds)."""
    rows = want.shape[0]
    step = (
        (want.abs().view(rows, -1, BLOCK).amax(-1, keepdim=True) / 6)
        .repeat_interleave(BLOCK, -1)
        .view(rows, -1)
    )
    mismatched = float((got != want).float().mean())
    worst = float(((got - want).abs() / step.clamp(min=1e-30)).max())
    return mismatched, worst, mismatched <= 1e-3 and worst <= 1.0 + 1e-6


def quantization(modules: list[str]) -> list[Row]:
    """fp4_quantize as layers/quantization/modelopt_quant.py:1290 calls it (a global scale,
    16-element blocks), with the scale factors in the linear layout so they can be read back."""
    import torch
    from flashinfer import fp4_quantize

    caller = "sglang/srt/layers/quantization/modelopt_quant.py:1290"
    rows = []
    for dtype in ("bfloat16", "float16"):
        gen = torch.Generator(device="cuda").manual_seed(3)
        x = (torch.randn(128, 512, generator=gen, device="cuda") * 3).to(getattr(torch, dtype))
        global_scale = 448.0 * 6.0 / float(x.float().abs().max())
        packed, scales = fp4_quantize(
            x,
            torch.tensor([global_scale], device="cuda"),
            is_sf_swizzled_layout=False,
        )
        got = unpack(
            packed.view(torch.uint8).cpu(),
            scales.view(torch.uint8).cpu().view(128, -1),
            global_scale,
        )
        want = reference_dequantized(x.cpu(), global_scale)
        mismatched, worst, ok = judge(got, want)
        rows.append(
            Row(
                "fp4_quantization",
                modules[0],
                f"quantize-dequantize/{dtype}/128x512 ({mismatched:.2%} off by one step)",
                worst,
                1.0,
                PASS if ok else FAIL,
                caller,
            )
        )
    return rows
