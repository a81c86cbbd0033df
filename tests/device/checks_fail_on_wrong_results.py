"""On a GPU: verify_gpu's checks fail when a module computes something wrong. Each module's
public entry point is wrapped to perturb its output slightly (as a wrong define or a stale
buffer would), the family's check runs, and every row must fail; then unwrapped, every row
must pass. Not a test of the suite (it needs a GPU and the installed jit-cache)."""

from __future__ import annotations

import importlib.metadata
import json
import sys
from typing import Any

import flashinfer
import flashinfer.mla
import flashinfer.norm
import torch

from sm120_build.node.serving import FAIL, PASS, attention, elementwise, mask


def perturbed(function: Any, where: Any) -> Any:
    def wrong(*args: Any, **kwargs: Any) -> Any:
        out = function(*args, **kwargs)
        target = where(out)
        flat = target.view(-1)
        if target.is_floating_point():
            flat[flat.numel() // 3] += 0.5  # one element of thousands, off by half a unit
        else:
            flat[flat.numel() // 3] ^= 1  # packed bits: one bit flipped
        return out

    return wrong


provenance = json.loads(
    importlib.metadata.distribution("flashinfer-jit-cache").read_text("sm120-build.json") or "{}"
)
attention_modules = [m for m, r in provenance["modules"].items() if r.startswith("attention")]
norm_modules = [m for m, r in provenance["modules"].items() if r == "norm"]
quantization_modules = [m for m, r in provenance["modules"].items() if r == "quantization"]
failures = 0


def whole(out: Any) -> Any:
    return out


def rows(check: Any, modules: list[str], keep: Any) -> list[Any]:
    """The rows of a family's check that `keep` selects by case; none where the wheel has no
    module of that family (the d64 build has no norm, no MLA, no mask packer)."""
    return [r for r in check(modules) if keep(r.case)] if modules else []


# (label, owner, entry point, which output to perturb, check, its modules, which cases)
CASES: list[tuple[str, Any, str, Any, Any, list[str], Any]] = [
    (
        "norm rmsnorm",
        flashinfer.norm,
        "rmsnorm",
        whole,
        elementwise.norm,
        norm_modules,
        lambda case: case.startswith("rmsnorm/"),
    ),
    (
        "attention paged prefill",
        flashinfer.BatchPrefillWithPagedKVCacheWrapper,
        "run",
        whole,
        attention.check,
        attention_modules,
        lambda case: case.startswith("paged"),
    ),
    (
        "attention decode",
        flashinfer.BatchDecodeWithPagedKVCacheWrapper,
        "run",
        whole,
        attention.check,
        attention_modules,
        lambda case: case.startswith("decode"),
    ),
    (
        "attention MLA",
        flashinfer.mla.BatchMLAPagedAttentionWrapper,
        "run",
        whole,
        attention.check,
        attention_modules,
        lambda case: case.startswith("mla/"),
    ),
    (
        "quantization packbits",
        flashinfer,
        "packbits",
        whole,
        mask.check,
        quantization_modules,
        lambda case: case.startswith("packbits"),
    ),
    (
        "quantization segment_packbits",
        flashinfer,
        "segment_packbits",
        lambda out: out[0],  # (packed bits, their indptr)
        mask.check,
        quantization_modules,
        lambda case: case == "segment_packbits/little",
    ),
]
checked = 0
for label, owner, name, where, check, modules, keep in CASES:
    right = rows(check, modules, keep)
    if not right:
        print(f"{label}: no such module in this wheel, not checked")
        continue
    original = getattr(owner, name)
    setattr(owner, name, perturbed(original, where))
    try:
        wrong = rows(check, modules, keep)
    finally:
        setattr(owner, name, original)
    bad = sum(r.status == FAIL for r in wrong)
    good = sum(r.status == PASS for r in right)
    print(f"{label}: perturbed {bad}/{len(wrong)} rows FAIL; unperturbed {good}/{len(right)} PASS")
    failures += (bad != len(wrong)) + (good != len(right))
    checked += 1
torch.cuda.synchronize()
sys.exit(1 if failures or not checked else 0)
