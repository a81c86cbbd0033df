"""On an sm_90 GPU: sglang 0.5.23's KV-cache store kernel, as the 0.5.23 stack's 9.0a build
put it in the jit-cache wheel, against a torch reference. Not a test of the suite (it needs a
GPU): run it on the device, where sglang itself is not installed (its import closure is 73
distributions), so the module is loaded with tvm-ffi as sglang's loader loads it and called
with the arguments sglang's wrapper passes (sglang/kernels/ops/kvcache/kvcache.py
store_cache: k, v, k_cache, v_cache, indices, size_limit, reserved_skip_index).

    python sglang0523_store_cache.py JIT_CACHE_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import tvm_ffi

# Llama-3.1-8B at TP 1: 8 KV heads of 128 in bf16, 2048 bytes a row (the profile's module).
NAME = "sgl_kernel_jit_kvcache_2048_2048_128_true"
WIDTH = 8 * 128


def case(module: object, dtype: torch.dtype, tokens: int, slots: int, index: torch.dtype) -> str:
    generator = torch.Generator(device="cuda").manual_seed(tokens * 1000 + slots)
    k = torch.randn(tokens, WIDTH, dtype=torch.float32, device="cuda", generator=generator)
    v = torch.randn(tokens, WIDTH, dtype=torch.float32, device="cuda", generator=generator)
    k, v = k.to(dtype), v.to(dtype)
    k_cache = torch.full((slots, WIDTH), 7.0, dtype=dtype, device="cuda")
    v_cache = torch.full((slots, WIDTH), 7.0, dtype=dtype, device="cuda")
    # Distinct slots, the reserved padding slot 0 among them: it must stay untouched.
    indices = torch.randperm(slots, device="cuda", generator=generator)[:tokens].to(index)
    indices[0] = 0
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    keep = indices != 0
    expected_k[indices[keep].long()] = k[keep]
    expected_v[indices[keep].long()] = v[keep]
    module.store_cache(k, v, k_cache, v_cache, indices, slots, 0)  # type: ignore[attr-defined]
    torch.cuda.synchronize()
    same = torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)
    label = f"{str(dtype).split('.')[-1]} tokens={tokens} slots={slots} {str(index).split('.')[-1]}"
    return f"{'PASS' if same else 'FAIL'} {label}"


def main() -> int:
    path = Path(sys.argv[1]) / NAME / f"{NAME}.so"
    module = tvm_ffi.load_module(str(path))
    major, minor = torch.cuda.get_device_capability()
    print(f"loaded {path.name} on {torch.cuda.get_device_name()} (sm_{major}{minor})")
    rows = [
        case(module, dtype, tokens, slots, index)
        for dtype in (torch.bfloat16, torch.float16)
        for tokens in (1, 7, 256, 4096)
        for slots in (4097, 65536)
        for index in (torch.int64, torch.int32)
    ]
    print("\n".join(rows))
    failed = sum(row.startswith("FAIL") for row in rows)
    print(f"{len(rows) - failed} of {len(rows)} rows passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
