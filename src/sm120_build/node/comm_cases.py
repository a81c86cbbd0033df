"""verify_gpu's trtllm_comm cases and their fp32 references, built from fixed seeds so every
rank computes all ranks' inputs without communicating."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

# Tolerances: |out - ref| <= atol + rtol * |ref|, against an fp32 reference.
# bf16 keeps 8 significant bits (2^-8 ~ 3.9e-3 relative), fp16 11 bits (2^-11 ~ 4.9e-4);
# outputs are rounded once from fp32 accumulation, so 2-4 ulps of headroom is ample while a
# missed rank, a stale lamport buffer or a race is off by O(1).
TOLERANCES = {"bfloat16": (1.6e-2, 1.6e-2), "float16": (2e-3, 2e-3)}


MOE_TOP_K = 4
MOE_REDUCTION_EXPERTS = 4
CUSTOM_ALLREDUCE_TOKENS = 8  # at most 16 tokens and hidden >= 256 take the lamport kernel

PATTERNS = (
    "allreduce",
    "residual_rmsnorm",
    "moe_finalize",
    "moe_reduction",
    "custom_lamport_norm",
    "pdl_race",
)


@dataclass(frozen=True)
class Case:
    pattern: str  # one of PATTERNS
    dtype: str
    oneshot: bool
    pdl: bool
    tokens: int
    hidden: int

    @property
    def name(self) -> str:
        shot = "oneshot" if self.oneshot else "twoshot"
        pdl = "pdl" if self.pdl else "nopdl"
        return f"{self.pattern}/{self.dtype}/{shot}/{pdl}/t{self.tokens}/h{self.hidden}"


def default_cases(world_size: int) -> list[Case]:
    cases = []
    for hidden in (4096, 7168):
        for tokens in (16, 1024):
            for pattern in ("allreduce", "residual_rmsnorm"):
                for dtype in ("bfloat16", "float16"):
                    for oneshot in (True, False):
                        if not oneshot and tokens <= world_size:
                            continue  # two-shot needs more tokens than ranks
                        for pdl in (True, False):
                            cases.append(Case(pattern, dtype, oneshot, pdl, tokens, hidden))
        # MoE finalize fusion (one-shot only): top-k gather, scale, shared expert, allreduce,
        # residual add and RMSNorm in one kernel.
        for tokens in (16, 256):
            for dtype in ("bfloat16", "float16"):
                for pdl in (True, False):
                    cases.append(Case("moe_finalize", dtype, True, pdl, tokens, hidden))
        # MoE reduction fusion (patch 0004's third launcher): per-token expert outputs scaled
        # and summed, plus the FC2 output, allreduced, residual add and RMSNorm.
        for tokens in (8, 64):
            for dtype in ("bfloat16", "float16"):
                for pdl in (True, False):
                    cases.append(Case("moe_reduction", dtype, True, pdl, tokens, hidden))
        for dtype in ("bfloat16", "float16"):
            for pdl in (True, False):
                cases.append(
                    Case("custom_lamport_norm", dtype, True, pdl, CUSTOM_ALLREDUCE_TOKENS, hidden)
                )
            for oneshot in (True, False):
                cases.append(Case("pdl_race", dtype, oneshot, True, 16, hidden))
    return cases


def _seeded_generator(case: Case, offset: int) -> Any:
    """A torch generator seeded from the case's name (the same in every rank's process)
    plus `offset`, one per kind of input."""
    import torch

    return torch.Generator().manual_seed((zlib.crc32(case.name.encode()) & 0xFFFF) + offset)


def case_inputs(case: Case, world_size: int) -> tuple[list[Any], Any, Any]:
    import torch

    def draw(offset: int, *shape: int) -> Any:
        return torch.randn(*shape, generator=_seeded_generator(case, offset), dtype=torch.float32)

    rows = case.tokens * (MOE_TOP_K if case.pattern == "moe_finalize" else 1)
    shards = [draw(rank, rows, case.hidden) for rank in range(world_size)]
    residual = draw(1000, case.tokens, case.hidden)
    gamma = 1.0 + 0.1 * draw(2000, case.hidden)
    return shards, residual, gamma


def case_bias(case: Case) -> Any:
    """The custom allreduce's bias, added before the residual."""
    import torch

    return 0.1 * torch.randn(case.hidden, generator=_seeded_generator(case, 4000))


def moe_reduction_inputs(case: Case, rank: int) -> tuple[Any, Any, Any]:
    """One rank's expert outputs [experts, tokens, hidden], their fp32 scales [experts,
    tokens] and the FC2 output [tokens, hidden]."""
    import torch

    generator = _seeded_generator(case, 5000 + rank)
    experts = torch.randn(MOE_REDUCTION_EXPERTS, case.tokens, case.hidden, generator=generator)
    scales = torch.rand(MOE_REDUCTION_EXPERTS, case.tokens, generator=generator)
    fc2 = torch.randn(case.tokens, case.hidden, generator=generator)
    return experts, scales, fc2


def _moe_reduction_reference(case: Case, rank: int) -> Any:
    """One rank's reduction as the kernel computes it: each fp32 product rounded to the dtype
    and accumulated in the dtype, then the FC2 output added in the dtype."""
    import torch

    dtype = getattr(torch, case.dtype)
    experts, scales, fc2 = moe_reduction_inputs(case, rank)
    accumulator = torch.zeros(case.tokens, case.hidden, dtype=dtype)
    for expert, scale in zip(experts, scales, strict=True):
        term = (expert.to(dtype).float() * scale[:, None]).to(dtype)
        accumulator = (accumulator.float() + term.float()).to(dtype)
    return (accumulator.float() + fc2.to(dtype).float()).to(dtype).float()


def moe_routing(case: Case, world_size: int) -> list[tuple[Any, Any, Any]]:
    """Per rank: a permutation of the expanded rows (some dropped as -1), expert scales
    and a shared-expert output."""
    import torch

    routing = []
    for rank in range(world_size):
        generator = _seeded_generator(case, 3000 + rank)
        rows = case.tokens * MOE_TOP_K
        permuted = torch.randperm(rows, generator=generator).to(torch.int32)
        permuted[torch.rand(rows, generator=generator) < 0.1] = -1  # dropped tokens
        scales = torch.rand(case.tokens, MOE_TOP_K, generator=generator)
        shared = torch.randn(case.tokens, case.hidden, generator=generator)
        routing.append((permuted.view(case.tokens, MOE_TOP_K), scales, shared))
    return routing


def _moe_finalize_reference(case: Case, shard: Any, permuted: Any, scales: Any, shared: Any) -> Any:
    """One rank's finalize as the kernel computes it: products rounded to the dtype and
    accumulated in the dtype, then the shared expert output added."""
    import torch

    dtype = getattr(torch, case.dtype)
    rows = shard.to(dtype).float()
    scale = scales.to(dtype).float()
    accumulator = torch.zeros(case.tokens, case.hidden, dtype=dtype)
    for k in range(MOE_TOP_K):
        index = permuted[:, k].long()
        term = rows[index.clamp(min=0)] * scale[:, k : k + 1]
        term[index < 0] = 0.0
        accumulator = (accumulator.float() + term.to(dtype).float()).to(dtype)
    return (accumulator.float() + shared.to(dtype).float()).to(dtype).float()


def case_reference(case: Case, world_size: int, eps: float) -> dict[str, Any]:
    import torch

    dtype = getattr(torch, case.dtype)
    shards, residual, gamma = case_inputs(case, world_size)
    if case.pattern == "moe_finalize":
        total = sum(
            _moe_finalize_reference(case, shard, *routing)
            for shard, routing in zip(shards, moe_routing(case, world_size), strict=True)
        )
    elif case.pattern == "moe_reduction":
        total = sum(_moe_reduction_reference(case, rank) for rank in range(world_size))
    else:
        # Round the inputs to the tested dtype first: the kernel sees these values.
        total = sum(shard.to(dtype).float() for shard in shards)
    if case.pattern == "allreduce":
        return {"allreduce_out": total}
    summed = total + residual.to(dtype).float()
    if case.pattern == "custom_lamport_norm":
        summed = summed + case_bias(case).to(dtype).float()
    variance = summed.pow(2).mean(dim=-1, keepdim=True)
    normed = summed * torch.rsqrt(variance + eps) * gamma.to(dtype).float()
    expected = {"residual_out": summed, "norm_out": normed}
    if case.pattern == "moe_reduction":
        expected["allreduce_out"] = total
    return expected
