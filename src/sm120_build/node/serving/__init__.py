"""Numerical checks of the serving path's modules (all but trtllm_comm, which node/verify.py
checks over ranks), one family per file: each calls the module through FlashInfer's public
API (or sglang's own kernel wrappers) as sglang 0.5.9 does, and compares with a reference
written in plain torch, never through FlashInfer, on seeded inputs.

A check is a function of the module names of its recipe that the wheel holds; it returns
one Row per case. Tolerances are per dtype: |out - ref| <= atol + rtol * |ref|, stated with
their reason where they are set.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

PASS, FAIL, NOT_RUNNABLE = "PASS", "FAIL", "not runnable on this GPU"

# bf16 keeps 8 significant bits (2^-8 ~ 3.9e-3 relative), fp16 11 (2^-11 ~ 4.9e-4); an
# output rounded once from fp32 arithmetic is within half an ulp, and a few ulps of
# headroom cover the different order of the sums. A wrong define, a wrong layout or stale
# data is off by O(1).
TOLERANCES = {"bfloat16": (1.6e-2, 1.6e-2), "float16": (2e-3, 2e-3), "float32": (1e-5, 1e-5)}


@dataclass(frozen=True)
class Row:
    recipe: str
    module: str
    case: str
    max_abs_error: float
    max_allowed: float
    status: str
    caller: str  # where sglang 0.5.9 makes the call this case makes


def compare(
    recipe: str,
    module: str,
    case: str,
    got: Any,
    expected: Any,
    tolerance: tuple[float, float],
    caller: str,
) -> Row:
    """One row: every element within atol + rtol * |expected|, and nothing NaN."""
    import torch

    got, expected = got.float().cpu(), expected.float().cpu()
    rtol, atol = tolerance
    error = (got - expected).abs()
    allowed = atol + rtol * expected.abs()
    ok = got.shape == expected.shape and bool(torch.isfinite(got).all())
    ok = ok and bool((error <= allowed).all())
    return Row(
        recipe,
        module,
        case,
        float(error.nan_to_num(1e30).max()) if error.numel() else 0.0,
        float(allowed.max()) if allowed.numel() else 0.0,
        PASS if ok else FAIL,
        caller,
    )


def offsets(lengths: Iterable[int]) -> list[int]:
    """Where each of consecutive segments of these lengths starts, and the end: an indptr."""
    return list(accumulate(lengths, initial=0))


Check = Callable[[list[str]], list[Row]]


# A derived recipe (profiles-derived.toml) is named by its generator, less gen_ and _module,
# and a digest of its call (derive.recipe_name): its family goes by that stem.
DERIVED_FAMILIES = {
    "batch_prefill": "attention",
    "batch_decode": "attention",
    "batch_mla": "attention",
}


def check_for(recipe: str, families: dict[str, Check]) -> Check | None:
    """The check of a recipe of profiles.toml, or of a derived one by its generator."""
    stem = recipe.split(".", 1)[0]
    return families.get(recipe) or families.get(DERIVED_FAMILIES.get(stem, stem))


def checks() -> dict[str, Check]:
    """recipe -> its check (sglang's kernels go by their module names, serving/sglang.py).
    Imported lazily: each family imports torch and FlashInfer."""
    from . import attention, elementwise, fp4, gemm, mask, moe

    return {
        "attention": attention.check,
        "attention_sample": attention.check,
        "attention_d64": attention.check,
        "attention_d128": attention.check,
        "attention_gemma": attention.check,
        "attention_mla": attention.check,
        "attention_entry_points": attention.check,
        "attention_mla_ragged": attention.check,
        "attention_sink": attention.check,
        "cascade": elementwise.cascade,
        "quantization": mask.check,
        "norm": elementwise.norm,
        "rope": elementwise.rope,
        "dsv3_fused_routing": elementwise.dsv3_routing,
        "fp4_quantization_120": fp4.quantization,
        "fp4_quantization_121": fp4.quantization,
        "fp4_gemm_cutlass_sm120": gemm.fp4_gemm,
        "gemm_sm120": gemm.block_fp8_gemm,
        "fused_moe_120": moe.check,
    }
