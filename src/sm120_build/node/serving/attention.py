"""FlashInfer's FA2 attention modules (the backend sglang 0.5.9 runs on SM12x) through the
wrappers sglang's flashinfer backend uses (layers/attention/flashinfer_backend.py: the ragged
and paged prefill wrappers at :254-276, the decode wrapper at :280), and FlashInfer's other
public entry points for the modules of upstream's AOT set that sglang does not call (single
prefill and decode, BatchAttention, the attention-sink wrapper), against softmax attention in
plain torch over the same (fp8-rounded, where the KV cache is fp8) keys and values.

Each module the wheel holds is run with the plan arguments its name encodes (query and KV
dtypes, head dims, sliding window, logits soft-cap): a batch prefill module over a paged KV
cache with page sizes 1 and 16 and over ragged K/V, a decode module over pages of 1 and 16, a
single module over one request. Three requests of different lengths, 8 query heads over 2 KV
heads (grouped-query). A prefill module whose query and value head dims differ (DeepSeek's
MLA ragged prefill, 192/128) runs only ragged, as sglang runs it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from . import TOLERANCES, Row, compare, offsets

_FA2 = re.compile(
    r"(?P<kind>batch_prefill|batch_decode|single_prefill|single_decode)_with_kv_cache_"
    r"dtype_q_(?P<q>\w+?)_dtype_kv_(?P<kv>\w+?)_dtype_o_\w+?_(?:dtype_idx_i32_)?"
    r"head_dim_qk_(?P<dim>\d+)_head_dim_vo_(?P<dim_vo>\d+)_posenc_0_"
    r"use_swa_(?P<swa>True|False)_use_logits_cap_(?P<cap>True|False)(?P<rest>.*)"
)
_HOLISTIC = re.compile(
    r"batch_attention_with_kv_cache_dtype_q_(?P<q>\w+?)_dtype_kv_(?P<kv>\w+?)_dtype_o_\w+?_"
    r"dtype_idx_i32_head_dim_qk_(?P<dim>\d+)_head_dim_vo_(?P=dim)_posenc_0_"
    r"use_logits_soft_cap_(?P<cap>true|false)_use_profiler_false"
)
# The names the attention-sink wrapper loads (flashinfer/attention.py:245), not the names of
# upstream's gen_batch_prefill_attention_sink_module, which that wrapper never asks for.
_SINK = re.compile(r"batch_prefill_attention_sink_(?P<q>bf16|f16)_swa_(?P<swa>True|False)_fa2")
SINK_HEAD_DIM = 64  # the only one FlashInfer's AOT set and our recipe make
_DTYPES = {"bf16": "bfloat16", "f16": "float16", "e4m3": "float8_e4m3fn"}
QO_HEADS, KV_HEADS = 8, 2
KV_LENS, QO_LENS = (37, 128, 201), (5, 1, 17)
WINDOW, SOFT_CAP = 48, 30.0
CALLER = "sglang/srt/layers/attention/flashinfer_backend.py:777"  # prefill; decode :888
MLA_RAGGED_CALLER = "sglang/srt/layers/attention/flashinfer_mla_backend.py:869"
# Attention sums many products: bf16 and fp16 outputs are rounded from fp32 softmax and
# accumulation in an order of the kernel's own; fp8 keys and values are the same rounded
# values in the reference, so the bound is the output dtype's, doubled for the sum.
ATTENTION_TOLERANCE = {
    name: (2 * rtol, 2 * atol) for name, (rtol, atol) in TOLERANCES.items() if name != "float32"
}


@dataclass(frozen=True)
class Case:
    """One run of a module: how its K/V are laid out and what the plan asks for."""

    module: str
    layout: str  # paged, ragged, decode, single_prefill, single_decode, holistic, sink
    page: int  # tokens a page (paged layouts), else 0
    q_dtype: str
    kv_dtype: str
    dim: int
    dim_vo: int
    window: int  # -1: none
    cap: float | None
    caller: str

    @property
    def label(self) -> str:
        dims = f"d{self.dim}" + (f"/{self.dim_vo}" if self.dim_vo != self.dim else "")
        return (
            self.layout
            + (f"/page{self.page}" if self.page else "")
            + f"/{_short(self.q_dtype)}/{_short(self.kv_dtype)}/{dims}"
            + ("/swa" if self.window >= 0 else "")
            + ("/cap" if self.cap else "")
        )


def _short(dtype: str) -> str:
    return {v: k for k, v in _DTYPES.items()}[dtype]


def check(modules: list[str]) -> list[Row]:
    """Every module of an attention recipe: the FA2 ones here, the MLA ones in mla.py."""
    from . import mla

    rows: list[Row] = []
    for module in modules:
        rows += [_run(case) for case in cases(module)]
    return rows + mla.check(modules)


def cases(module: str) -> list[Case]:
    """The runs a module's name asks for; none for a module this family does not check."""
    if match := _FA2.fullmatch(module):
        spec = match.groupdict()
        if spec["rest"] not in ("", "_f16qk_False"):
            return []  # another position encoding or the fp16 QK reduction: not checked here
        q, kv = _DTYPES[spec["q"]], _DTYPES[spec["kv"]]
        dim, dim_vo = int(spec["dim"]), int(spec["dim_vo"])
        window = WINDOW if spec["swa"] == "True" else -1
        cap = SOFT_CAP if spec["cap"] == "True" else None

        def case(layout: str, page: int, caller: str = CALLER) -> Case:
            return Case(module, layout, page, q, kv, dim, dim_vo, window, cap, caller)

        kind = spec["kind"]
        if kind == "single_prefill":
            return [case("single_prefill", 0, "flashinfer/prefill.py:989")]
        if kind == "single_decode":
            return [case("single_decode", 0, "flashinfer/decode.py:361")]
        if kind == "batch_decode":
            return [case("decode", page, CALLER.replace(":777", ":888")) for page in (1, 16)]
        if dim != dim_vo:
            return [case("ragged", 0, MLA_RAGGED_CALLER)]
        paged = [case("paged", page) for page in (1, 16)]
        return paged + ([case("ragged", 0)] if kv == q else [])  # ragged K/V: the query's dtype
    if match := _HOLISTIC.fullmatch(module):
        spec = match.groupdict()
        cap = SOFT_CAP if spec["cap"] == "true" else None
        return [
            Case(
                module,
                "holistic",
                page,
                _DTYPES[spec["q"]],
                _DTYPES[spec["kv"]],
                int(spec["dim"]),
                int(spec["dim"]),
                -1,
                cap,
                "flashinfer/attention.py:71",
            )
            for page in (1, 16)
        ]
    if match := _SINK.fullmatch(module):
        spec = match.groupdict()
        dtype = _DTYPES[spec["q"]]
        window = WINDOW if spec["swa"] == "True" else -1
        return [
            Case(
                module,
                "sink",
                page,
                dtype,
                dtype,
                SINK_HEAD_DIM,
                SINK_HEAD_DIM,
                window,
                None,
                "flashinfer/attention.py:205",
            )
            for page in (1, 16)
        ]
    return []


def reference(
    q: Any,
    k: Any,
    v: Any,
    causal: bool,
    window: int,
    cap: float | None,
    sm_scale: float,
    sink: Any = None,
) -> Any:
    """softmax(q k^T) v for one request, in fp32: [qo, heads, dim] against [kv, kv_heads,
    dim]; query i sits at position kv_len - qo_len + i. A sink (one logit a query head) adds
    exp(sink) to the softmax's denominator and nothing to its numerator."""
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
    if sink is not None:
        column = sink.float().view(-1, 1, 1).expand(-1, qo, 1)
        weights = torch.cat([logits, column], dim=-1).softmax(-1)[..., :-1]
    else:
        weights = logits.softmax(-1)
    return torch.einsum("hqk,khd->qhd", weights, v)


def _run(case: Case) -> Row:
    import flashinfer
    import torch

    gen = torch.Generator(device="cuda").manual_seed(case.dim + case.page)
    lengths: dict[str, tuple[int, ...]] = {
        "decode": (1, 1, 1),
        "single_prefill": (17,),
        "single_decode": (1,),
    }
    qo_lens = lengths.get(case.layout, QO_LENS)
    kv_lens: tuple[int, ...] = KV_LENS[-1:] if case.layout.startswith("single") else KV_LENS
    if case.layout == "ragged" and case.dim != case.dim_vo:
        kv_lens = qo_lens  # sglang's MLA ragged prefill: the new tokens only (kv = qo)
    kv_heads = QO_HEADS if case.dim != case.dim_vo else KV_HEADS
    q_type, kv_type = getattr(torch, case.q_dtype), getattr(torch, case.kv_dtype)

    def draw(*shape: int) -> Any:
        return torch.randn(*shape, generator=gen, device="cuda")

    queries = [draw(n, QO_HEADS, case.dim).to(q_type) for n in qo_lens]
    keys = [draw(n, kv_heads, case.dim).to(kv_type) for n in kv_lens]
    values = [draw(n, kv_heads, case.dim_vo).to(kv_type) for n in kv_lens]
    sink = draw(QO_HEADS) * 2 if case.layout == "sink" else None
    sm_scale = 1 / math.sqrt(case.dim)
    causal = case.layout not in ("decode", "single_decode")
    expected = torch.cat(
        [
            reference(q, k, v, causal, case.window, case.cap, sm_scale, sink)
            for q, k, v in zip(queries, keys, values, strict=True)
        ]
    )
    q = torch.cat(queries)
    qo_indptr = torch.tensor(offsets(qo_lens), dtype=torch.int32, device="cuda")
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    common: dict[str, Any] = {"q_data_type": q_type, "kv_data_type": kv_type}
    if case.window >= 0:
        common["window_left"] = case.window
    if case.cap is not None:
        common["logits_soft_cap"] = case.cap
    if case.layout == "single_prefill":
        got = flashinfer.single_prefill_with_kv_cache(
            q,
            keys[0],
            values[0],
            causal=True,
            window_left=case.window,
            logits_soft_cap=case.cap,
            backend="fa2",
        )
    elif case.layout == "single_decode":
        got = flashinfer.single_decode_with_kv_cache(
            q[0], keys[0], values[0], window_left=case.window, logits_soft_cap=case.cap
        )[None]
    elif case.layout == "ragged":
        kv_indptr = torch.tensor(offsets(kv_lens), dtype=torch.int32, device="cuda")
        wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend="fa2")
        wrapper.plan(
            qo_indptr,
            kv_indptr,
            QO_HEADS,
            kv_heads,
            case.dim,
            head_dim_vo=case.dim_vo,
            causal=True,
            **common,
        )
        got = wrapper.run(q, torch.cat(keys), torch.cat(values))
    else:
        pages, indptr, last = _pages(keys, values, case.page, gen)
        if case.layout == "decode":
            wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
            wrapper.plan(*indptr, last, QO_HEADS, KV_HEADS, case.dim, case.page, **common)
            got = wrapper.run(q, pages)
        elif case.layout == "holistic":
            holistic = flashinfer.BatchAttention("NHD")
            kv_len = torch.tensor(KV_LENS, dtype=torch.int32, device="cuda")
            holistic.plan(
                qo_indptr,
                *indptr,
                kv_len,
                QO_HEADS,
                KV_HEADS,
                case.dim,
                case.dim,
                case.page,
                causal=True,
                sm_scale=sm_scale,
                logits_soft_cap=case.cap,
                q_data_type=q_type,
                kv_data_type=kv_type,
            )
            got, _ = holistic.run(q, pages, logits_soft_cap=case.cap or 0.0)
        else:
            extra: tuple[Any, ...] = ()  # the sink variant's additional run() arguments
            if case.layout == "sink":
                wrapper = flashinfer.BatchAttentionWithAttentionSinkWrapper(
                    workspace,
                    "NHD",
                    backend="fa2",
                    q_data_type=q_type,
                    kv_data_type=kv_type,
                    head_dim_qk=case.dim,
                    head_dim_vo=case.dim,
                    window_left=case.window,
                )
                extra = (sink, sm_scale)
            else:
                wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                    workspace, "NHD", backend="fa2"
                )
            wrapper.plan(
                qo_indptr,
                *indptr,
                last,
                QO_HEADS,
                KV_HEADS,
                case.dim,
                case.page,
                causal=True,
                **common,
            )
            got = wrapper.run(q, pages, *extra)
    torch.cuda.synchronize()
    return compare(
        "attention",
        case.module,
        case.label,
        got,
        expected,
        ATTENTION_TOLERANCE[case.q_dtype],
        case.caller,
    )


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
    indptr = torch.tensor(offsets(counts), dtype=torch.int32, device="cuda")
    last = torch.tensor([len(k) - (c - 1) * page for k, c in zip(keys, counts, strict=True)])
    return (k_cache, v_cache), (indptr, order), last.to(torch.int32).cuda()
