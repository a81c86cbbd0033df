"""sglang 0.5.9's own JIT kernels (sglang/jit_kernel/) from the jit-cache wheel (patch
0003), through sglang's own wrappers as the serving path calls them, against plain-torch
references; a later sglang's (sglang/kernels/) are checked by serving/sglang_kernels.py."""

from __future__ import annotations

import re

from ... import sglang_kernels
from . import TOLERANCES, Row, compare
from .elementwise import _generator, _randn, _rmsnorm, _rope_reference

_KVCACHE = re.compile(r"sgl_kernel_jit_kvcache_(\d+)_(true|false)")
_QKNORM = re.compile(r"sgl_kernel_jit_qknorm_(\d+)_(true|false)_(bf16|fp16)_t")
_ROPE = "sgl_kernel_jit_apply_rope_pos_ids_cos_sin_cache"
# make_cpp_args' spelling of a dtype in a module name (both kernel layouts).
DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def check(modules: list[str]) -> list[Row]:
    import torch

    if sglang_kernels.has_kernels_package(sglang_kernels.installed_root()):
        from . import sglang_kernels as kernels_package

        return kernels_package.check(modules)

    sglang_kernels.evaluate("sglang.jit_kernel.utils:None", torch.cuda.get_device_capability())
    rows: list[Row] = []
    for module in modules:
        if match := _KVCACHE.fullmatch(module):
            rows += _kvcache(module, int(match.group(1)))
        elif match := _QKNORM.fullmatch(module):
            rows += _qknorm(module, int(match.group(1)), DTYPES[match.group(3)])
        elif module == _ROPE:
            rows += _rope(module)
    return rows


def _kvcache(module: str, row_bytes: int) -> list[Row]:
    """store_cache as mem_cache/memory_pool.py:103 calls it: rows scattered to their slots,
    an exact copy."""
    import torch
    from sglang.jit_kernel import kvcache

    caller = "sglang/srt/mem_cache/memory_pool.py:103"
    gen = _generator(row_bytes)
    row = row_bytes // 2
    k, v = _randn(gen, 219, row, dtype="bfloat16"), _randn(gen, 219, row, dtype="bfloat16")
    k_cache = torch.zeros(1024, row, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.zeros_like(k_cache)
    indices = torch.randperm(1024, generator=gen, device="cuda")[:219]
    kvcache.store_cache(k, v, k_cache, v_cache, indices, row_bytes=row_bytes)
    want_k, want_v = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
    want_k[indices], want_v[indices] = k, v
    exact = (0.0, 0.0)  # a copy
    return [
        compare(
            "sglang_kvcache", module, f"store_cache/k/{row_bytes}B", k_cache, want_k, exact, caller
        ),
        compare(
            "sglang_kvcache", module, f"store_cache/v/{row_bytes}B", v_cache, want_v, exact, caller
        ),
    ]


def _qknorm(module: str, head_dim: int, dtype: str) -> list[Row]:
    """fused_inplace_qknorm as models/utils.py:241 calls it: RMSNorm per head, in place."""
    from sglang.jit_kernel import norm

    caller = "sglang/srt/models/utils.py:241"
    gen = _generator(head_dim)
    q, k = _randn(gen, 77, 32, head_dim, dtype=dtype), _randn(gen, 77, 4, head_dim, dtype=dtype)
    q_weight = (_randn(gen, head_dim) * 0.1 + 1).to(q.dtype)
    k_weight = (_randn(gen, head_dim) * 0.1 + 1).to(q.dtype)
    want_q, want_k = _rmsnorm(q, q_weight, 1e-6), _rmsnorm(k, k_weight, 1e-6)
    norm.fused_inplace_qknorm(q, k, q_weight, k_weight, 1e-6, head_dim=head_dim)
    tolerance = TOLERANCES[dtype]
    return [
        compare(
            "sglang_qknorm", module, f"qknorm/q/{dtype}/d{head_dim}", q, want_q, tolerance, caller
        ),
        compare(
            "sglang_qknorm", module, f"qknorm/k/{dtype}/d{head_dim}", k, want_k, tolerance, caller
        ),
    ]


def _rope(module: str) -> list[Row]:
    """apply_rope_with_cos_sin_cache_inplace as layers/rotary_embedding.py:365 calls it, and
    with the KV store fused (FusedSetKVBufferArg)."""
    import torch
    from sglang.jit_kernel import rope

    caller = "sglang/srt/layers/rotary_embedding.py:365"
    rows: list[Row] = []
    for dtype in ("bfloat16", "float16"):
        gen = _generator(5)
        positions = torch.randint(0, 4096, (131,), generator=gen, device="cuda")
        inv_freq = 1.0 / (500000 ** (torch.arange(0, 128, 2, device="cuda").float() / 128))
        angles = torch.arange(4096, device="cuda").float()[:, None] * inv_freq[None, :]
        cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1)
        q, k = _randn(gen, 131, 32 * 128, dtype=dtype), _randn(gen, 131, 8 * 128, dtype=dtype)
        value = _randn(gen, 131, 8 * 128, dtype=dtype)
        want_q = _rope_reference(q, positions, cos_sin, 128)
        want_k = _rope_reference(k, positions, cos_sin, 128)
        plain_q, plain_k = q.clone(), k.clone()
        rope.apply_rope_with_cos_sin_cache_inplace(
            positions=positions, query=plain_q, key=plain_k, head_size=128, cos_sin_cache=cos_sin
        )
        k_buffer = torch.zeros(512, 8 * 128, device="cuda", dtype=q.dtype)
        v_buffer = torch.zeros_like(k_buffer)
        slots = torch.randperm(512, generator=gen, device="cuda")[:131]
        rope.apply_rope_with_cos_sin_cache_inplace(
            positions=positions,
            query=q,
            key=k,
            head_size=128,
            cos_sin_cache=cos_sin,
            fused_set_kv_buffer_arg=rope.FusedSetKVBufferArg(
                value=value,
                k_buffer=k_buffer,
                v_buffer=v_buffer,
                k_scale=None,
                v_scale=None,
                cache_loc=slots,
            ),
        )
        tolerance = TOLERANCES[dtype]
        want_buffer_k, want_buffer_v = (
            torch.zeros_like(k_buffer).float(),
            torch.zeros_like(v_buffer),
        )
        want_buffer_k[slots], want_buffer_v[slots] = want_k, value
        for name, got, want, tol in (
            ("q", plain_q, want_q, tolerance),
            ("k", plain_k, want_k, tolerance),
            ("fused/q", q, want_q, tolerance),
            ("fused/k_buffer", k_buffer, want_buffer_k, tolerance),
            ("fused/v_buffer", v_buffer, want_buffer_v, (0.0, 0.0)),  # a copy
        ):
            rows.append(
                compare("sglang_rope", module, f"neox/{dtype}/{name}", got, want, tol, caller)
            )
    return rows
