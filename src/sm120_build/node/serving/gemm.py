"""The SM12x GEMM modules, which run first on an SM120 node: the NVFP4 GEMM
(fp4_gemm_cutlass_sm120) and the block-FP8 GEMM (gemm_sm120), each against a plain-torch
matmul of the operands it was given, dequantized by this package's own references."""

from __future__ import annotations

from typing import Any

from . import Row, compare
from .fp4 import unpack

BLOCK_FP8 = 128  # DeepSeek-style block-FP8: 1x128 activation groups, 128x128 weight blocks
# A GEMM's inputs are exact here (dequantized values, products exact in fp32), so the only
# roundings are the fp32 sums' order and the bf16 output's half ulp (2^-9 relative): 1e-2
# of the result's own size, plus 1e-2 of the largest result for sums that cancel.
GEMM_RTOL = 1e-2


def dequantize_block_fp8(values: Any, scales: Any, rows_per_scale: int) -> Any:
    """fp8 values [R, K] times their scales [R / rows_per_scale, K / 128] (one scale per
    rows_per_scale x 128 block) -> fp32."""
    expanded = scales.float().repeat_interleave(rows_per_scale, 0).repeat_interleave(BLOCK_FP8, 1)
    return values.float() * expanded[: values.shape[0], : values.shape[1]]


def _gemm_tolerance(expected: Any) -> tuple[float, float]:
    return GEMM_RTOL, GEMM_RTOL * float(expected.abs().max())


def fp4_gemm(modules: list[str]) -> list[Row]:
    """mm_fp4 as sglang's fp4_gemm calls it (layers/quantization/modelopt_quant.py:139): both
    operands NVFP4 with swizzled ue4m3 block scales, alpha = 1 / (global scale of a x of b),
    bf16 out. The cutlass backend is named: it is the module the wheel holds ("auto" may pick
    cuDNN on SM12x)."""
    import torch
    from flashinfer import fp4_quantize, mm_fp4

    gen = torch.Generator(device="cuda").manual_seed(7)
    m, n, k = 128, 256, 512
    a = torch.randn(m, k, generator=gen, device="cuda").to(torch.bfloat16)
    b = (torch.randn(n, k, generator=gen, device="cuda") * 0.05).to(torch.bfloat16)
    scale_a = 448.0 * 6.0 / float(a.float().abs().max())
    scale_b = 448.0 * 6.0 / float(b.float().abs().max())

    def quantize(x: Any, scale: float, swizzled: bool) -> tuple[Any, Any]:
        packed, scales = fp4_quantize(
            x, torch.tensor([scale], device="cuda"), is_sf_swizzled_layout=swizzled
        )
        return packed, scales

    a_fp4, a_sf = quantize(a, scale_a, True)
    b_fp4, b_sf = quantize(b, scale_b, True)
    # The same values with their scales in the linear layout, which the reference can read.
    a_values = unpack(*_linear(quantize(a, scale_a, False), m), scale_a)
    b_values = unpack(*_linear(quantize(b, scale_b, False), n), scale_b)
    alpha = torch.tensor([1.0 / (scale_a * scale_b)], device="cuda")
    got = mm_fp4(a_fp4, b_fp4.T, a_sf, b_sf.T, alpha, torch.bfloat16, backend="cutlass")
    torch.cuda.synchronize()
    expected = a_values @ b_values.T
    return [
        compare(
            "fp4_gemm",
            modules[0],
            f"mm_fp4/cutlass/bf16/{m}x{n}x{k}",
            got,
            expected,
            _gemm_tolerance(expected),
            "sglang/srt/layers/quantization/modelopt_quant.py:139",
        )
    ]


def _linear(quantized: tuple[Any, Any], rows: int) -> tuple[Any, Any]:
    import torch

    packed, scales = quantized
    return packed.view(torch.uint8).cpu(), scales.view(torch.uint8).cpu().view(rows, -1)


def block_fp8_gemm(modules: list[str]) -> list[Row]:
    """gemm_fp8_nt_groupwise on its cutlass backend, which is gemm_sm120 on SM12x
    (flashinfer/gemm/gemm_base.py:3331): e4m3 activations with one scale per 1x128 group,
    e4m3 weights with one per 128x128 block, scales MN-major, bf16 out. sglang 0.5.9 asks for
    the trtllm backend instead (layers/quantization/fp8_utils.py:338-344), which FlashInfer
    refuses on SM12x; this is the module upstream's AOT set ships for SM12x."""
    import torch
    from flashinfer.gemm import gemm_fp8_nt_groupwise

    gen = torch.Generator(device="cuda").manual_seed(11)
    m, n, k = 128, 256, 512
    a = torch.randn(m, k, generator=gen, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, k, generator=gen, device="cuda").to(torch.float8_e4m3fn)
    a_scale = torch.rand(m, k // BLOCK_FP8, generator=gen, device="cuda") + 0.5
    b_scale = torch.rand(n // BLOCK_FP8, k // BLOCK_FP8, generator=gen, device="cuda") + 0.5
    got = gemm_fp8_nt_groupwise(
        a,
        b,
        a_scale.T.contiguous(),
        b_scale.T.contiguous(),
        scale_major_mode="MN",
        scale_granularity_mnk=(1, BLOCK_FP8, BLOCK_FP8),
        out_dtype=torch.bfloat16,
        backend="cutlass",
    )
    torch.cuda.synchronize()
    expected = dequantize_block_fp8(a, a_scale, 1) @ dequantize_block_fp8(b, b_scale, BLOCK_FP8).T
    return [
        compare(
            "gemm_sm120",
            modules[0],
            f"gemm_fp8_nt_groupwise/cutlass/bf16/{m}x{n}x{k}",
            got,
            expected,
            _gemm_tolerance(expected),
            "flashinfer/gemm/gemm_base.py:3247",
        )
    ]
