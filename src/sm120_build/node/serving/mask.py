"""The `quantization` module: FlashInfer's bit packing, which its prefill plan applies to a
custom mask (flashinfer/prefill.py:1781, segment_packbits with bitorder "little"). sglang's
flashinfer backend passes one in speculative decoding's verify step: each request's draft
tokens against its cached tokens and its draft tree (flashinfer_backend.py:1439, the mask of
speculative/eagle_utils.py:47). Checked against a packing in plain torch, bit for bit."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from . import Row, compare, offsets

CALLER = "sglang/srt/layers/attention/flashinfer_backend.py:1439"
# Packing is exact: any bit out of place is an error.
EXACT = (0.0, 0.0)
SEQ_LENS, DRAFT_TOKENS = (37, 128, 201), 4  # three requests between steps, four drafts each


def pack(bits: Any, bitorder: str) -> Any:
    """numpy.packbits of a 1-D boolean tensor: eight bits a byte, the first bit the byte's
    lowest ("little") or highest ("big"), the last byte padded with zeros."""
    import torch

    count = bits.numel()
    padded = torch.zeros((count + 7) // 8 * 8, dtype=torch.int64, device=bits.device)
    padded[:count] = bits.to(torch.int64)
    shifts = torch.arange(8, device=bits.device)
    if bitorder == "big":
        shifts = 7 - shifts
    return (padded.view(-1, 8) << shifts).sum(-1).to(torch.uint8)


def segment_pack(bits: Any, indptr: list[int], bitorder: str) -> tuple[Any, list[int]]:
    """Each segment bits[indptr[i]:indptr[i+1]] packed on its own, and the packed indptr."""
    import torch

    parts = [pack(bits[start:end], bitorder) for start, end in pairwise(indptr)]
    return torch.cat(parts), offsets(part.numel() for part in parts)


def check(modules: list[str]) -> list[Row]:
    import flashinfer
    import torch

    module = modules[0]
    gen = torch.Generator(device="cuda").manual_seed(11)
    rows = []
    bits = torch.rand(1003, generator=gen, device="cuda") < 0.5  # not a whole number of bytes
    for bitorder in ("big", "little"):
        got = flashinfer.packbits(bits, bitorder)
        rows.append(
            compare(
                "quantization",
                module,
                f"packbits/{bitorder}",
                got,
                pack(bits, bitorder),
                EXACT,
                "flashinfer/quantization.py:47",
            )
        )
    # The verify step's mask: per request, its draft tokens (rows) over its cached and draft
    # tokens (columns), flattened row by row, as FlashInfer's plan packs it.
    indptr = offsets(DRAFT_TOKENS * (length + DRAFT_TOKENS) for length in SEQ_LENS)
    mask = torch.rand(indptr[-1], generator=gen, device="cuda") < 0.5
    got, got_indptr = flashinfer.segment_packbits(
        mask, torch.tensor(indptr, dtype=torch.int32, device="cuda"), bitorder="little"
    )
    want, want_indptr = segment_pack(mask, indptr, "little")
    rows.append(
        compare("quantization", module, "segment_packbits/little", got, want, EXACT, CALLER)
    )
    rows.append(
        compare(
            "quantization",
            module,
            "segment_packbits/indptr",
            got_indptr,
            torch.tensor(want_indptr, device="cuda"),
            EXACT,
            CALLER,
        )
    )
    return rows
