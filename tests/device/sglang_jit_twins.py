"""On a GPU machine that has nvcc: sglang's kernels from the jit-cache wheel against their
JIT-compiled twins (sglang's own load_jit compiling with nvcc), bit for bit, on the same
seeded inputs. Not a test of the suite (it needs a GPU): run it on the device.

    python sglang_jit_twins.py aot OUT.pt   # prebuilt; no nvcc on PATH, JIT refused
    python sglang_jit_twins.py jit OUT.pt   # sglang compiles each kernel with nvcc
    python sglang_jit_twins.py compare A.pt B.pt
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from typing import Any

import torch

import sm120_build.sglang_kernels as sglang_kernels


def outputs(mode: str) -> dict[str, torch.Tensor]:
    sglang_kernels.evaluate("sglang.jit_kernel.utils:None", torch.cuda.get_device_capability())
    utils: Any = sys.modules["sglang.jit_kernel.utils"]
    if mode == "jit":
        utils._prebuilt_module = lambda name: None  # as if the wheel held none
    else:
        os.environ["SGLANG_DISABLE_JIT"] = "1"
    os.environ["TVM_FFI_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"tvm-ffi-{mode}-")
    from sglang.jit_kernel import kvcache, norm, rope

    started = time.perf_counter()
    for loader in (
        lambda: kvcache._jit_kvcache_module(2048),
        lambda: norm._jit_qknorm_module(128, torch.bfloat16),
        rope._jit_apply_rope_pos_ids_cos_sin_cache_module,
    ):
        loader()
    loaded = time.perf_counter() - started
    compiled = os.listdir(os.environ["TVM_FFI_CACHE_DIR"])
    print(f"{mode}: three kernels ready in {loaded:.3f} s; tvm-ffi builds: {compiled}")

    gen = torch.Generator(device="cuda").manual_seed(1234)
    result: dict[str, torch.Tensor] = {}
    # KV-cache store: 1024 bf16 = 2048 bytes a row (Llama-3.1-8B at TP 1).
    tokens, row = 333, 1024
    k = torch.randn(tokens, row, generator=gen, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(tokens, row, generator=gen, device="cuda", dtype=torch.bfloat16)
    k_cache = torch.zeros(4096, row, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.zeros_like(k_cache)
    indices = torch.randperm(4096, generator=gen, device="cuda")[:tokens].to(torch.int64)
    kvcache.store_cache(k, v, k_cache, v_cache, indices, row_bytes=2048)
    result.update(k_cache=k_cache, v_cache=v_cache)
    # QK-norm in place, head dim 128, bf16 (Qwen3).
    q = torch.randn(tokens, 32, 128, generator=gen, device="cuda", dtype=torch.bfloat16)
    kk = torch.randn(tokens, 4, 128, generator=gen, device="cuda", dtype=torch.bfloat16)
    qw = torch.rand(128, generator=gen, device="cuda", dtype=torch.bfloat16) + 0.5
    kw = torch.rand(128, generator=gen, device="cuda", dtype=torch.bfloat16) + 0.5
    norm.fused_inplace_qknorm(q, kk, qw, kw, 1e-6, head_dim=128)
    result.update(q_normed=q, k_normed=kk)
    # RoPE with a cos/sin cache (neox layout), positions out of order, as
    # layers/rotary_embedding.py:365 calls it: in place, then with the KV store fused.
    positions = torch.randint(0, 8192, (tokens,), generator=gen, device="cuda")
    inv_freq = 1.0 / (500000 ** (torch.arange(0, 128, 2, device="cuda").float() / 128))
    angles = torch.arange(8192, device="cuda").float()[:, None] * inv_freq[None, :]
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1)
    q_out = torch.randn(tokens, 32 * 128, generator=gen, device="cuda", dtype=torch.bfloat16)
    k_out = torch.randn(tokens, 8 * 128, generator=gen, device="cuda", dtype=torch.bfloat16)
    rope.apply_rope_with_cos_sin_cache_inplace(
        positions=positions, query=q_out, key=k_out, head_size=128, cos_sin_cache=cos_sin
    )
    q_fused, k_fused = q_out.clone(), k_out.clone()
    value = torch.randn(tokens, 8 * 128, generator=gen, device="cuda", dtype=torch.bfloat16)
    k_buffer = torch.zeros(4096, 8 * 128, device="cuda", dtype=torch.bfloat16)
    v_buffer = torch.zeros_like(k_buffer)
    rope.apply_rope_with_cos_sin_cache_inplace(
        positions=positions,
        query=q_fused,
        key=k_fused,
        head_size=128,
        cos_sin_cache=cos_sin,
        fused_set_kv_buffer_arg=rope.FusedSetKVBufferArg(
            value=value,
            k_buffer=k_buffer,
            v_buffer=v_buffer,
            k_scale=None,
            v_scale=None,
            cache_loc=indices,
        ),
    )
    result.update(q_fused=q_fused, k_fused=k_fused, k_buffer=k_buffer, v_buffer=v_buffer)
    torch.cuda.synchronize()
    result.update(q_rope=q_out, k_rope=k_out)
    return {name: tensor.cpu() for name, tensor in result.items()}


def main() -> int:
    if sys.argv[1] == "compare":
        a, b = torch.load(sys.argv[2]), torch.load(sys.argv[3])
        same = {name: torch.equal(a[name], b[name]) for name in a}
        for name, equal in same.items():
            print(f"{name:<10} {'bit-identical' if equal else 'DIFFERENT'} {tuple(a[name].shape)}")
        return 0 if all(same.values()) and set(a) == set(b) else 1
    torch.save(outputs(sys.argv[1]), sys.argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main())
