"""FlashInfer's FA2 MLA module (batch_mla_attention, DeepSeek's latent attention with the
weights absorbed) through BatchMLAPagedAttentionWrapper, as sglang 0.5.9's flashinfer MLA
backend plans it: pages of one token, decode with causal=False
(layers/attention/flashinfer_mla_backend.py:734) and paged prefill with causal=True (:882).
sglang asks for backend "auto", which is FA2 on SM12x (flashinfer/utils.py:455); here the
backend is named, since "auto" would pick FA3 on an sm_90 GPU.

The reference is softmax attention in plain torch with one latent KV head: keys are the
compressed KV (512) beside the rotary part (64), values the compressed KV alone.
"""

from __future__ import annotations

import math
import re
from typing import Any

from . import Row, compare, offsets
from .attention import ATTENTION_TOLERANCE, QO_LENS, reference

_MLA = re.compile(
    r"batch_mla_attention_dtype_q_(?P<q>bf16|f16)_dtype_kv_(?P=q)_dtype_o_(?P=q)_dtype_idx_i32_"
    r"head_dim_ckv_(?P<ckv>\d+)_head_dim_kpe_(?P<kpe>\d+)_profiler_False"
)
_DTYPES = {"bf16": "bfloat16", "f16": "float16"}
HEADS = 16  # DeepSeek-V3's 128 heads at TP 8
KV_LENS = (37, 128, 201)
SM_SCALE = 1 / math.sqrt(128 + 64)  # DeepSeek-V3: qk_nope_head_dim + qk_rope_head_dim
CALLERS = {
    "decode": "sglang/srt/layers/attention/flashinfer_mla_backend.py:734",
    "prefill": "sglang/srt/layers/attention/flashinfer_mla_backend.py:882",
}


def check(modules: list[str]) -> list[Row]:
    rows = []
    for module in modules:
        match = _MLA.fullmatch(module)
        if match is None:
            continue
        dtype = _DTYPES[match.group("q")]
        ckv, kpe = int(match.group("ckv")), int(match.group("kpe"))
        rows += [_run(module, phase, dtype, ckv, kpe) for phase in ("decode", "prefill")]
    return rows


def _run(module: str, phase: str, dtype: str, ckv_dim: int, kpe_dim: int) -> Row:
    import flashinfer
    import torch

    gen = torch.Generator(device="cuda").manual_seed(ckv_dim + kpe_dim)
    torch_dtype = getattr(torch, dtype)
    qo_lens = (1, 1, 1) if phase == "decode" else QO_LENS
    causal = phase == "prefill"

    def draw(*shape: int) -> Any:
        return torch.randn(*shape, generator=gen, device="cuda").to(torch_dtype)

    q_nope = [draw(n, HEADS, ckv_dim) for n in qo_lens]
    q_pe = [draw(n, HEADS, kpe_dim) for n in qo_lens]
    ckv = [draw(n, 1, ckv_dim) for n in KV_LENS]
    kpe = [draw(n, 1, kpe_dim) for n in KV_LENS]
    expected = torch.cat(
        [
            reference(
                torch.cat([qn, qp], dim=-1),
                torch.cat([c, p], dim=-1),
                c,
                causal,
                -1,
                None,
                SM_SCALE,
            )
            for qn, qp, c, p in zip(q_nope, q_pe, ckv, kpe, strict=True)
        ]
    )
    # One token a page, the pages in a shuffled order.
    total = sum(KV_LENS)
    order = torch.randperm(total, generator=gen, device="cuda").to(torch.int32)
    ckv_cache = torch.empty(total, 1, ckv_dim, dtype=torch_dtype, device="cuda")
    kpe_cache = torch.empty(total, 1, kpe_dim, dtype=torch_dtype, device="cuda")
    ckv_cache[order.long()] = torch.cat(ckv)
    kpe_cache[order.long()] = torch.cat(kpe)
    qo_indptr = torch.tensor(offsets(qo_lens), dtype=torch.int32, device="cuda")
    kv_indptr = torch.tensor(offsets(KV_LENS), dtype=torch.int32, device="cuda")
    kv_lens = torch.tensor(KV_LENS, dtype=torch.int32, device="cuda")
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    wrapper = flashinfer.mla.BatchMLAPagedAttentionWrapper(workspace, backend="fa2")
    wrapper.plan(
        qo_indptr,
        kv_indptr,
        order,
        kv_lens,
        HEADS,
        ckv_dim,
        kpe_dim,
        1,
        causal,
        SM_SCALE,
        torch_dtype,
        torch_dtype,
    )
    got = wrapper.run(torch.cat(q_nope), torch.cat(q_pe), ckv_cache, kpe_cache)
    torch.cuda.synchronize()
    return compare(
        "attention",
        module,
        f"mla/{phase}/page1/{dtype}/ckv{ckv_dim}/kpe{kpe_dim}",
        got,
        expected,
        ATTENTION_TOLERANCE[dtype],
        CALLERS[phase],
    )
