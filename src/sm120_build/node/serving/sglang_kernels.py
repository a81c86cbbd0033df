"""sglang 0.5.11+'s own JIT kernels (sglang/kernels/) from the jit-cache wheel (the stack's
loader patch), through sglang's own wrappers in sglang.kernels.ops as the serving path
calls them, against plain-torch references.

A module is recognised by the name sglang's load_jit gives it ("sgl_kernel_jit_" + the
kernel's template arguments, make_cpp_args' spelling), so each case runs the
instantiation the wheel holds: the wrapper is called with tensors whose dtypes and sizes
make it ask for exactly that module. A module whose name matches no case is reported by
verify_gpu as "no check written yet".
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from . import TOLERANCES, Row, compare
from .elementwise import _generator, _randn, _rmsnorm, _rope_reference
from .sglang import DTYPES

_KVCACHE = re.compile(r"sgl_kernel_jit_kvcache_(\d+)_(\d+)_\d+_(?:true|false)")
_FUSED_ROPE = re.compile(
    r"sgl_kernel_jit_fused_rope_(true|false)_(\d+)_(?:true|false)_(bf16|fp16)_t_(bf16|fp16)_t"
)
_QKNORM = re.compile(r"sgl_kernel_jit_qknorm_(\d+)_(?:true|false)_(bf16|fp16)_t_true")
_ACTIVATION = re.compile(r"sgl_kernel_jit_activation_(bf16|fp16)_t_(?:true|false)")
# Flat layout, fp32 scales (not UE8M0), no fused SiLU: the two instantiations sglang's
# block-FP8 linear asks for (row- and column-major scales).
_GROUP_QUANT = re.compile(
    r"sgl_kernel_jit_per_token_group_quant_(bf16|fp16)_t_fp8_e4m3_t_(\d+)_false_(true|false)_true_false_(?:true|false)_flat"
)
_TREE = re.compile(r"sgl_kernel_jit_speculative_tree")
EXACT = (0.0, 0.0)  # a copy, an index, a mask


def check(modules: list[str]) -> list[Row]:
    cases: list[tuple[re.Pattern[str], Callable[[str, re.Match[str]], list[Row]]]] = [
        (_KVCACHE, _kvcache),
        (_FUSED_ROPE, _fused_rope),
        (_QKNORM, _qknorm),
        (_ACTIVATION, _activation),
        (_GROUP_QUANT, _group_quant),
        (_TREE, _tree),
    ]
    rows: list[Row] = []
    for module in modules:
        for pattern, case in cases:
            if match := pattern.fullmatch(module):
                rows += case(module, match)
                break
    return rows


def _kvcache(module: str, match: re.Match[str]) -> list[Row]:
    """store_cache as mem_cache/memory_pool.py:175 calls it: rows scattered to their slots,
    slot 0 (CUDA graphs' padding slot) skipped, an exact copy."""
    import torch
    from sglang.kernels.ops.kvcache.kvcache import store_cache

    caller = "sglang/srt/mem_cache/memory_pool.py:175"
    k_bytes, v_bytes = int(match.group(1)), int(match.group(2))
    gen = _generator(k_bytes)
    rows: list[Row] = []
    for index_dtype in (torch.int64, torch.int32):
        k = _randn(gen, 219, k_bytes // 2, dtype="bfloat16")
        v = _randn(gen, 219, v_bytes // 2, dtype="bfloat16")
        k_cache = torch.zeros(1025, k_bytes // 2, device="cuda", dtype=torch.bfloat16)
        v_cache = torch.zeros(1025, v_bytes // 2, device="cuda", dtype=torch.bfloat16)
        slots = (torch.randperm(1024, generator=gen, device="cuda")[:219] + 1).to(index_dtype)
        slots[7] = 0  # a padded request's slot: sglang skips it
        store_cache(k, v, k_cache, v_cache, slots)
        want_k, want_v = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
        kept = slots != 0
        want_k[slots[kept].long()], want_v[slots[kept].long()] = k[kept], v[kept]
        name = str(index_dtype).removeprefix("torch.")
        rows += [
            compare("sglang_kvcache", module, f"store/k/{name}", k_cache, want_k, EXACT, caller),
            compare("sglang_kvcache", module, f"store/v/{name}", v_cache, want_v, EXACT, caller),
        ]
    return rows


def _fused_rope(module: str, match: re.Match[str]) -> list[Row]:
    """apply_rope_with_cos_sin_cache_inplace, alone and with the KV store fused, as
    sglang's rotary embedding calls it (kernels/ops/attention/rope.py:170, :213)."""
    import torch
    from sglang.kernels.ops.attention import rope

    caller = "sglang/kernels/ops/attention/rope.py:213"
    is_neox, rope_dim = match.group(1) == "true", int(match.group(2))
    dtype, q_dtype = DTYPES[match.group(3)], DTYPES[match.group(4)]
    gen = _generator(rope_dim + is_neox)
    tokens, q_heads, kv_heads = 131, 16, 4
    positions = torch.randint(0, 4096, (tokens,), generator=gen, device="cuda")
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rope_dim, 2, device="cuda").float() / rope_dim))
    angles = torch.arange(4096, device="cuda").float()[:, None] * inv_freq[None, :]
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1)
    q = _randn(gen, tokens, q_heads, rope_dim, dtype=q_dtype)
    k = _randn(gen, tokens, kv_heads, rope_dim, dtype=dtype)
    v = _randn(gen, tokens, kv_heads, rope_dim, dtype=dtype)
    want_q = _rope_reference(q, positions, cos_sin, rope_dim, is_neox)
    want_k = _rope_reference(k, positions, cos_sin, rope_dim, is_neox)
    plain_q, plain_k = q.clone(), k.clone()
    rope.apply_rope_with_cos_sin_cache_inplace(
        plain_q, plain_k, cos_sin, positions, is_neox=is_neox
    )
    k_buffer = torch.zeros(512, kv_heads * rope_dim, device="cuda", dtype=k.dtype)
    v_buffer = torch.zeros_like(k_buffer)
    slots = torch.randperm(512, generator=gen, device="cuda")[:tokens]
    fused = rope.FusedSetKVBufferArg(value=v, k_buffer=k_buffer, v_buffer=v_buffer, cache_loc=slots)
    rope.apply_rope_with_cos_sin_cache_inplace(
        q, k, cos_sin, positions, is_neox=is_neox, fused_args=fused
    )
    want_k_buffer = torch.zeros_like(k_buffer).float()
    want_v_buffer = torch.zeros_like(v_buffer)
    want_k_buffer[slots] = want_k.flatten(1)
    want_v_buffer[slots] = v.flatten(1)
    style = "neox" if is_neox else "gptj"
    rows = []
    for name, got, want, tolerance in (
        ("q", plain_q, want_q, TOLERANCES[q_dtype]),
        ("k", plain_k, want_k, TOLERANCES[dtype]),
        ("fused/q", q, want_q, TOLERANCES[q_dtype]),
        ("fused/k_buffer", k_buffer, want_k_buffer, TOLERANCES[dtype]),
        ("fused/v_buffer", v_buffer, want_v_buffer, EXACT),
    ):
        rows.append(
            compare(
                "sglang_rope", module, f"{style}/d{rope_dim}/{name}", got, want, tolerance, caller
            )
        )
    return rows


def _qknorm(module: str, match: re.Match[str]) -> list[Row]:
    """fused_inplace_qknorm as models/utils.py:521 calls it: RMSNorm per head, in place."""
    from sglang.kernels.ops.layernorm.norm import fused_inplace_qknorm

    caller = "sglang/srt/models/utils.py:521"
    head_dim, dtype = int(match.group(1)), DTYPES[match.group(2)]
    rows = []
    for tokens in (1, 77):
        gen = _generator(head_dim + tokens)
        q = _randn(gen, tokens, 32, head_dim, dtype=dtype)
        k = _randn(gen, tokens, 4, head_dim, dtype=dtype)
        q_weight = (_randn(gen, head_dim) * 0.1 + 1).to(q.dtype)
        k_weight = (_randn(gen, head_dim) * 0.1 + 1).to(q.dtype)
        want_q, want_k = _rmsnorm(q, q_weight, 1e-6), _rmsnorm(k, k_weight, 1e-6)
        fused_inplace_qknorm(q, k, q_weight, k_weight, 1e-6, head_dim=head_dim)
        for name, got, want in (("q", q, want_q), ("k", k, want_k)):
            rows.append(
                compare(
                    "sglang_qknorm",
                    module,
                    f"{name}/{dtype}/d{head_dim}/t{tokens}",
                    got,
                    want,
                    TOLERANCES[dtype],
                    caller,
                )
            )
    return rows


def _activation(module: str, match: re.Match[str]) -> list[Row]:
    """silu_and_mul as sglang's SiluAndMul calls it (kernels/ops/activation/activation.py:66):
    silu(gate) * up over the two halves of the last dimension."""
    import torch
    from sglang.kernels.ops.activation.activation import silu_and_mul

    caller = "sglang/kernels/ops/activation/activation.py:66"
    dtype = DTYPES[match.group(1)]
    rows = []
    for tokens, hidden in ((1, 4096), (83, 2560), (256, 1536)):
        gen = _generator(tokens + hidden)
        x = _randn(gen, tokens, 2 * hidden, dtype=dtype)
        gate, up = x.float().chunk(2, dim=-1)
        want = torch.nn.functional.silu(gate) * up
        got = silu_and_mul(x)
        rows.append(
            compare(
                "sglang_activation",
                module,
                f"silu_and_mul/{dtype}/{tokens}x{hidden}",
                got,
                want,
                TOLERANCES[dtype],
                caller,
            )
        )
    return rows


# float8_e4m3fn: 3 mantissa bits, so one rounding step is up to 2^-3 of the value; the
# kernel multiplies by the reciprocal scale where the reference divides, which may round the
# other way at a tie. Below 2^-6 the format is subnormal, in steps of 2^-9.
_FP8_TOLERANCE = (0.125, 2.0**-9)


def _group_quant(module: str, match: re.Match[str]) -> list[Row]:
    """per_token_group_quant as sglang's block-FP8 linear calls it (fp8_kernel.py
    per_token_group_quant_fp8): one fp32 scale per 128 values of a token, amax / 448, and
    the values divided by it in float8_e4m3fn; row- or column-major scales as the module
    was built."""
    from sglang.kernels.ops.quantization.per_token_group_quant import per_token_group_quant

    caller = "sglang/kernels/ops/quantization/per_token_group_quant.py:124"
    dtype, group = DTYPES[match.group(1)], int(match.group(2))
    column_major = match.group(3) == "false"
    layout = "col" if column_major else "row"
    rows = []
    for tokens, hidden in ((1, 2048), (57, 4096), (200, 7168)):
        gen = _generator(tokens + hidden)
        x = _randn(gen, tokens, hidden, dtype=dtype) * 3
        x[0, :group] = 0  # an all-zero group: sglang's eps keeps its scale finite
        got_q, got_s = per_token_group_quant(x, group_size=group, column_major_scales=column_major)
        groups = x.float().view(tokens, hidden // group, group)
        amax = groups.abs().amax(-1).clamp(min=1e-10)
        want_s = amax / 448.0
        want_q = (groups / want_s[..., None]).clamp(-448, 448).view(tokens, hidden)
        case = f"{layout}/{dtype}/{tokens}x{hidden}"
        rows += [
            compare(
                "sglang_group_quant", module, f"scale/{case}", got_s, want_s, (1e-6, 0.0), caller
            ),
            compare(
                "sglang_group_quant", module, f"fp8/{case}", got_q, want_q, _FP8_TOLERANCE, caller
            ),
        ]
    return rows


def _eagle_tree(
    topk: int, depth: int, draft: int, seq_lens: list[int], seed: int
) -> tuple[list[list[int]], list[list[int]]]:
    """(parent_list, selected_index) as sglang's EAGLE worker builds them
    (speculative/eagle_utils.py organize_draft_results): step 0 keeps topk tokens, each
    later step expands every kept token by topk and keeps the topk best by cumulative
    score, and the draft - 1 best of all are selected, sorted. Scores only fall along a
    branch, so a selected token's parent is selected too."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    parents, selected = [], []
    for _ in seq_lens:
        scores = (-torch.rand(topk, generator=gen)).tolist()
        kept = list(range(topk))
        parent_list = [-1, *range(topk)]
        for step in range(1, depth):
            offset = topk + topk * topk * (step - 1)
            candidates = [
                scores[kept[c // topk]] - float(torch.rand(1, generator=gen))
                for c in range(topk * topk)
            ]
            scores += candidates
            best = sorted(range(topk * topk), key=lambda c: candidates[c], reverse=True)[:topk]
            kept = [offset + c for c in best]
            if step < depth - 1:
                parent_list += kept
        order = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)
        selected.append(sorted(order[: draft - 1]))
        parents.append(parent_list)
    return parents, selected


def _built_tree(
    parent_list: list[list[int]],
    selected: list[list[int]],
    seq_lens: list[int],
    topk: int,
    draft: int,
) -> dict[str, list[Any]]:
    """build_tree_efficient (include/sgl_kernel/speculative/eagle.cuh) in plain Python, full
    mask mode, from the buffers eagle_utils.py:185-215 allocates (mask all True, the
    retrieve buffers -1)."""
    bs = len(seq_lens)
    mask = [True] * (sum(seq_lens) * draft + draft * draft * bs)
    positions = [0] * (bs * draft)
    index, next_token, next_sibling = ([-1] * (bs * draft) for _ in range(3))

    def position_of(b: int, token: int) -> int:
        return next((p for p in range(draft - 1) if selected[b][p] == token), draft - 1)

    for b, seq_len in enumerate(seq_lens):
        start = draft * draft * b + sum(seq_lens[:b]) * draft
        for tid in range(draft):
            row = start + (seq_len + draft) * tid + seq_len + 1
            mask[row - 1] = True
            for i in range(draft - 1):
                mask[row + i] = False
            if tid == 0:
                positions[b * draft] = seq_len
                for i in range(draft - 1, 0, -1):
                    index[b * draft + i] = b * draft + i
                    parent_tb = selected[b][i - 1] // topk
                    parent = position_of(b, parent_list[b][parent_tb]) + 1 if parent_tb > 0 else 0
                    if next_token[b * draft + parent] != -1:
                        next_sibling[b * draft + i] = next_token[b * draft + parent]
                    next_token[b * draft + parent] = i
                index[b * draft] = b * draft
                continue
            position, current = 0, tid - 1
            while True:
                position += 1
                mask[row + current] = True
                parent_tb = selected[b][current] // topk
                if parent_tb == 0:
                    break
                current = position_of(b, parent_list[b][parent_tb])
            positions[b * draft + tid] = position + seq_len
    return {
        "tree_mask": mask,
        "positions": positions,
        "retrive_index": index,
        "retrive_next_token": next_token,
        "retrive_next_sibling": next_sibling,
    }


def _greedy(
    tree: dict[str, list[Any]],
    candidates: list[int],
    target: list[int],
    bs: int,
    draft: int,
    spec: int,
) -> dict[str, list[int]]:
    """VerifyTreeGreedy (eagle.cuh) in plain Python: follow the tree from the root, taking
    at each depth the child whose draft token is the target's prediction."""
    predicts = [0] * (bs * draft)
    accept_index = [-1] * (bs * spec)
    accept_num = [0] * bs
    index, next_token, next_sibling = (
        tree["retrive_index"],
        tree["retrive_next_token"],
        tree["retrive_next_sibling"],
    )
    for b in range(bs):
        last = index[b * draft]
        accept_index[b * spec] = last
        accepted, current = 0, 0
        for _ in range(1, spec):
            current = next_token[b * draft + current]
            while current != -1:
                if candidates[b * draft + current] == target[last]:
                    predicts[last] = target[last]
                    accepted += 1
                    accept_index[b * spec + accepted] = index[b * draft + current]
                    last = index[b * draft + current]
                    break
                current = next_sibling[b * draft + current]
            if current == -1:
                break
        accept_num[b] = accepted
        predicts[last] = target[last]
    return {"predicts": predicts, "accept_index": accept_index, "accept_token_num": accept_num}


def _tree(module: str, _: re.Match[str]) -> list[Row]:
    """build_tree_kernel_efficient as speculative/eagle_utils.py:213 calls it (full mask),
    then verify_tree_greedy on the tree it built, for MTP's chain (topk 1) and a branching
    EAGLE tree (topk 4), each against the kernels' own algorithm in plain Python."""
    import torch
    from sglang.kernels.ops.speculative import tree

    caller = "sglang/srt/speculative/eagle_utils.py:213"
    rows = []
    for topk, depth, draft in ((1, 3, 4), (4, 4, 8)):
        seq_lens = [7, 130, 1]
        bs = len(seq_lens)
        parents, chosen = _eagle_tree(topk, depth, draft, seq_lens, seed=topk)
        parent_list = torch.tensor(parents, device="cuda")
        selected = torch.tensor(chosen, device="cuda")
        want = _built_tree(parents, chosen, seq_lens, topk, draft)
        # The full-mask buffer as eagle_utils.py allocates it: all True, of the reference's size.
        mask = torch.ones(len(want["tree_mask"]), dtype=torch.bool, device="cuda")
        positions = torch.empty(bs * draft, dtype=torch.long, device="cuda")
        index, next_token, next_sibling = torch.full(
            (3, bs, draft), -1, dtype=torch.long, device="cuda"
        )
        lens = torch.tensor(seq_lens, device="cuda")
        tree.build_tree_kernel_efficient(
            parent_list,
            selected,
            lens,
            mask,
            positions,
            index,
            next_token,
            next_sibling,
            topk,
            depth,
            draft,
            0,
        )
        shape = f"topk{topk}/depth{depth}/draft{draft}"
        for name, got in (
            ("tree_mask", mask),
            ("positions", positions),
            ("retrive_index", index),
            ("retrive_next_token", next_token),
            ("retrive_next_sibling", next_sibling),
        ):
            expected = torch.tensor(want[name]).view(got.shape)
            rows.append(
                compare(
                    "sglang_tree", module, f"build/{shape}/{name}", got, expected, EXACT, caller
                )
            )
        gen = torch.Generator().manual_seed(draft)
        candidates = torch.randint(0, 3, (bs, draft), generator=gen)
        target = torch.randint(0, 3, (bs, draft), generator=gen)
        spec = depth + 1
        predicts = torch.zeros(bs * draft, dtype=torch.int32, device="cuda")
        accept_index = torch.full((bs, spec), -1, dtype=torch.int32, device="cuda")
        accept_num = torch.zeros(bs, dtype=torch.int32, device="cuda")
        tree.verify_tree_greedy(
            predicts,
            accept_index,
            accept_num,
            candidates.cuda(),
            index,
            next_token,
            next_sibling,
            target.cuda(),
        )
        greedy = _greedy(
            want, candidates.flatten().tolist(), target.flatten().tolist(), bs, draft, spec
        )
        for name, got in (
            ("predicts", predicts),
            ("accept_index", accept_index),
            ("accept_token_num", accept_num),
        ):
            expected = torch.tensor(greedy[name]).view(got.shape)
            rows.append(
                compare(
                    "sglang_tree",
                    module,
                    f"verify_greedy/{shape}/{name}",
                    got,
                    expected,
                    EXACT,
                    caller,
                )
            )
    return rows
