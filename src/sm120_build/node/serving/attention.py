"""FlashInfer's batch attention modules (FA2, the backend sglang 0.5.9 runs on SM12x) through
the wrappers sglang's flashinfer backend uses (layers/attention/flashinfer_backend.py: the
ragged and paged prefill wrappers at :254-276, the decode wrapper at :280), against softmax
attention in plain torch over the same (fp8-rounded, where the KV cache is fp8) keys and
values.

Each module the wheel holds is run with the plan arguments its name encodes (query and KV
dtypes, head dim, sliding window, logits soft-cap): a prefill module over a paged KV cache
with page sizes 1 and 16 and over ragged K/V, a decode module over pages of 1 and 16. Three
requests of different lengths, 8 query heads over 2 KV heads (grouped-query).
"""

from __future__ import annotations

import math
import re
from typing import Any

from . import TOLERANCES, Row, compare

_BATCH = re.compile(
    r"batch_(?P<kind>prefill|decode)_with_kv_cache_dtype_q_(?P<q>\w+?)_dtype_kv_(?P<kv>\w+?)_"
    r"dtype_o_\w+?_dtype_idx_i32_head_dim_qk_(?P<dim>\d+)_head_dim_vo_(?P=dim)_posenc_0_"
    r"use_swa_(?P<swa>True|False)_use_logits_cap_(?P<cap>True|False)(?P<rest>.*)"
)
_DTYPES = {"bf16": "bfloat16", "f16": "float16", "e4m3": "float8_e4m3fn"}
QO_HEADS, KV_HEADS = 8, 2
KV_LENS, QO_LENS = (37, 128, 201), (5, 1, 17)
WINDOW, SOFT_CAP = 48, 30.0
CALLER = "sglang/srt/layers/attention/flashinfer_backend.py:777"  # prefill; decode :888
# Attention sums many products: bf16 and fp16 outputs are rounded from fp32 softmax and
# accumulation in an order of the kernel's own; fp8 keys and values are the same rounded
# values in the reference, so the bound is the output dtype's, doubled for the sum.
ATTENTION_TOLERANCE = {
    name: (2 * rtol, 2 * atol) for name, (rtol, atol) in TOLERANCES.items() if name != "float32"
}


def check(modules: list[str]) -> list[Row]:
    rows: list[Row] = []
    for module in modules:
        match = _BATCH.fullmatch(module)
        if match is None or match.group("rest") not in ("", "_f16qk_False"):
            continue  # not a batch FA2 module of plain position encoding: no check here
        rows += _module(module, match.groupdict())
    return rows


def _module(module: str, spec: dict[str, str]) -> list[Row]:
    q_dtype, kv_dtype = _DTYPES[spec["q"]], _DTYPES[spec["kv"]]
    dim = int(spec["dim"])
    window = WINDOW if spec["swa"] == "True" else -1
    cap = SOFT_CAP if spec["cap"] == "True" else None
    rows = []
    label = (
        f"{spec['q']}/{spec['kv']}/d{dim}"
        + ("/swa" if window > 0 else "")
        + ("/cap" if cap else "")
    )
    if spec["kind"] == "decode":
        for page in (1, 16):
            rows.append(_run(module, "decode", page, q_dtype, kv_dtype, dim, window, cap, label))
    else:
        for page in (1, 16):
            rows.append(_run(module, "paged", page, q_dtype, kv_dtype, dim, window, cap, label))
        if kv_dtype == q_dtype:  # ragged K/V come in the query's dtype
            rows.append(_run(module, "ragged", 0, q_dtype, kv_dtype, dim, window, cap, label))
    return rows


def reference(
    q: Any, k: Any, v: Any, causal: bool, window: int, cap: float | None, sm_scale: float
) -> Any:
    """softmax(q k^T) v for one request, in fp32: [qo, heads, dim] against [kv, kv_heads,
    dim]; query i sits at position kv_len - qo_len + i."""
    import torch

    qo, kv = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    logits = torch.einsum("qhd,khd->hqk", q.float(), k) * sm_scale
    if cap is not None:
        logits = cap * torch.tanh(logits / cap)
    position = torch.arange(qo, device=q.device)[:, None] + (kv - qo)
    key = torch.arange(kv, device=q.device)[None, :]
    allowed = torch.ones(qo, kv, dtype=torch.bool, device=q.device)
    if causal:
        allowed &= key <= position
    if window >= 0:
        allowed &= key >= position - window
    logits = logits.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", logits.softmax(-1), v)


def _run(
    module: str,
    layout: str,
    page: int,
    q_dtype: str,
    kv_dtype: str,
    dim: int,
    window: int,
    cap: float | None,
    label: str,
) -> Row:
    import flashinfer
    import torch

    gen = torch.Generator(device="cuda").manual_seed(dim + page)
    qo_lens = (1, 1, 1) if layout == "decode" else QO_LENS
    q_type, kv_type = getattr(torch, q_dtype), getattr(torch, kv_dtype)

    def draw(*shape: int) -> Any:
        return torch.randn(*shape, generator=gen, device="cuda")

    queries = [draw(n, QO_HEADS, dim).to(q_type) for n in qo_lens]
    keys = [draw(n, KV_HEADS, dim).to(kv_type) for n in KV_LENS]
    values = [draw(n, KV_HEADS, dim).to(kv_type) for n in KV_LENS]
    sm_scale = 1 / math.sqrt(dim)
    causal = layout != "decode"
    expected = torch.cat(
        [
            reference(q, k, v, causal, window, cap, sm_scale)
            for q, k, v in zip(queries, keys, values, strict=True)
        ]
    )
    q = torch.cat(queries)
    qo_indptr = torch.tensor([0, *_cumulative(qo_lens)], dtype=torch.int32, device="cuda")
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    common = {"q_data_type": q_type, "kv_data_type": kv_type}
    if window >= 0:
        common["window_left"] = window
    if cap is not None:
        common["logits_soft_cap"] = cap
    if layout == "ragged":
        kv_indptr = torch.tensor([0, *_cumulative(KV_LENS)], dtype=torch.int32, device="cuda")
        wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend="fa2")
        wrapper.plan(qo_indptr, kv_indptr, QO_HEADS, KV_HEADS, dim, causal=True, **common)
        got = wrapper.run(q, torch.cat(keys), torch.cat(values))
    else:
        pages, indptr, last = _pages(keys, values, page, gen)
        if layout == "decode":
            wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
            wrapper.plan(*indptr, last, QO_HEADS, KV_HEADS, dim, page, **common)
        else:
            wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                workspace, "NHD", backend="fa2"
            )
            wrapper.plan(
                qo_indptr, *indptr, last, QO_HEADS, KV_HEADS, dim, page, causal=True, **common
            )
        got = wrapper.run(q, pages)
    torch.cuda.synchronize()
    case = f"{layout}" + (f"/page{page}" if page else "") + f"/{label}"
    caller = CALLER if layout != "decode" else CALLER.replace(":777", ":888")
    return compare("attention", module, case, got, expected, ATTENTION_TOLERANCE[q_dtype], caller)


def _cumulative(lengths: tuple[int, ...]) -> list[int]:
    total, out = 0, []
    for length in lengths:
        total += length
        out.append(total)
    return out


def _pages(keys: list[Any], values: list[Any], page: int, gen: Any) -> tuple[Any, Any, Any]:
    """The requests' K/V in a paged cache of `page` tokens a page, its pages in a shuffled
    order: ((k_cache, v_cache), (kv_indptr, kv_indices), last_page_len)."""
    import torch

    counts = [(len(k) + page - 1) // page for k in keys]
    total = sum(counts)
    order = torch.randperm(total, generator=gen, device="cuda").to(torch.int32)
    shape = (total, page, KV_HEADS, keys[0].shape[-1])
    k_cache = torch.zeros(shape, dtype=keys[0].dtype, device="cuda")
    v_cache = torch.zeros_like(k_cache)
    start = 0
    for k, v, count in zip(keys, values, counts, strict=True):
        for index in range(count):
            slot = int(order[start + index])
            rows = slice(index * page, min((index + 1) * page, len(k)))
            k_cache[slot, : rows.stop - rows.start] = k[rows]
            v_cache[slot, : rows.stop - rows.start] = v[rows]
        start += count
    indptr = torch.tensor([0, *_cumulative(tuple(counts))], dtype=torch.int32, device="cuda")
    last = torch.tensor([len(k) - (c - 1) * page for k, c in zip(keys, counts, strict=True)])
    return (k_cache, v_cache), (indptr, order), last.to(torch.int32).cuda()
