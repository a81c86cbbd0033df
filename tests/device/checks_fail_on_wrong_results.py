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
        target = where(out, args)
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
CASES: list[tuple[str, Any, str, Any, Any]] = [
    (
        "norm rmsnorm",
        flashinfer.norm,
        "rmsnorm",
        lambda out, args: out,
        lambda: (
            [r for r in elementwise.norm(norm_modules) if r.case.startswith("rmsnorm/")]
            if norm_modules
            else []
        ),
    ),
    (
        "attention paged prefill",
        flashinfer.BatchPrefillWithPagedKVCacheWrapper,
        "run",
        lambda out, args: out,
        lambda: [r for r in attention.check(attention_modules) if r.case.startswith("paged")],
    ),
    (
        "attention decode",
        flashinfer.BatchDecodeWithPagedKVCacheWrapper,
        "run",
        lambda out, args: out,
        lambda: [r for r in attention.check(attention_modules) if r.case.startswith("decode")],
    ),
    (
        "attention MLA",
        flashinfer.mla.BatchMLAPagedAttentionWrapper,
        "run",
        lambda out, args: out,
        lambda: [r for r in attention.check(attention_modules) if r.case.startswith("mla/")],
    ),
]
if quantization_modules:  # the speculative-decoding mask packer, where the wheel has it
    CASES += [
        (
            "quantization packbits",
            flashinfer,
            "packbits",
            lambda out, args: out,
            lambda: [r for r in mask.check(quantization_modules) if r.case.startswith("packbits")],
        ),
        (
            "quantization segment_packbits",
            flashinfer,
            "segment_packbits",
            lambda out, args: out[0],
            lambda: [
                r for r in mask.check(quantization_modules) if r.case == "segment_packbits/little"
            ],
        ),
    ]
checked = 0
for label, owner, name, where, run in CASES:
    right = run()
    if not right:  # a wheel without this family's modules (the d64 build has no norm, no MLA)
        print(f"{label}: no such module in this wheel, not checked")
        continue
    original = getattr(owner, name)
    setattr(owner, name, perturbed(original, where))
    try:
        wrong = run()
    finally:
        setattr(owner, name, original)
    bad = sum(r.status == FAIL for r in wrong)
    good = sum(r.status == PASS for r in right)
    print(f"{label}: perturbed {bad}/{len(wrong)} rows FAIL; unperturbed {good}/{len(right)} PASS")
    failures += (bad != len(wrong)) + (good != len(right))
    checked += 1
torch.cuda.synchronize()
sys.exit(1 if failures or not checked else 0)
