"""verify_gpu's pcie_ipc_comm checks: FlashInfer 0.7's PCIe all-reduce, prebuilt, computes
the sum of every rank's tensor.

Each rank builds FlashInfer's own workspace (flashinfer.comm.PcieIpcAllReduceWorkspace, as
sglang 0.5.23's PcieIpcCommunicator does) and all-reduces seeded bf16 and fp16 tensors of
several sizes, each size twice in a row (the workspace alternates two halves of its
scratch between calls). Every rank builds all ranks' inputs from the seeds, so the fp32
reference needs no communication and never goes through the kernels under test. One rank
per GPU over NCCL; on one GPU two ranks share it over gloo, as the trtllm_comm checks do.
"""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass
from typing import Any

from .ranks import free_port, init_ranks

# Element counts: a few 16-byte packs, one hidden row of Llama-3.1-8B, a batch of them,
# and one that is not a multiple of the kernels' own block size.
SIZES = (64, 4096, 8 * 4096, 4096 * 3 + 8)
DTYPES = ("bfloat16", "float16")
REPEATS = 2
# A sum of bf16 values rounded once to bf16 (fp16 likewise): half a unit in the last place
# of the result, relative; inputs are of order 1.
TOLERANCE = {"bfloat16": 2.0**-8, "float16": 2.0**-11}


@dataclass
class PcieResult:
    case: str
    rank: int
    max_abs_error: float
    max_allowed: float
    passed: bool


def rank_input(numel: int, dtype: str, rank: int, repeat: int) -> Any:
    """Rank `rank`'s tensor for one call, on the CPU, from its own seed."""
    import torch

    seed = zlib.crc32(f"{numel} {dtype} {rank} {repeat}".encode())
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(numel, generator=generator, dtype=torch.float32).to(getattr(torch, dtype))


def reference(numel: int, dtype: str, world_size: int, repeat: int) -> Any:
    import torch

    shards = [rank_input(numel, dtype, r, repeat).float() for r in range(world_size)]
    return torch.stack(shards).sum(dim=0)


def _rank(rank: int, world_size: int, devices: int, port: int, queue: Any) -> None:
    import torch
    from flashinfer.comm import pcie_ipc_ar

    group = init_ranks(rank, world_size, devices, port)
    results = []
    for dtype in DTYPES:
        workspace = pcie_ipc_ar.PcieIpcAllReduceWorkspace(
            group=group, max_numel=max(SIZES), dtype=getattr(torch, dtype)
        )
        try:
            for numel in SIZES:
                for repeat in range(REPEATS):
                    x = rank_input(numel, dtype, rank, repeat).cuda()
                    case = f"pcie_ipc_allreduce {dtype} numel={numel} call={repeat + 1}"
                    if not workspace.supports(x):
                        results.append(PcieResult(case, rank, float("nan"), 0.0, False))
                        continue
                    out = workspace.all_reduce(x)
                    torch.cuda.synchronize()
                    want = reference(numel, dtype, world_size, repeat)
                    error = float((out.float().cpu() - want).abs().max())
                    allowed = TOLERANCE[dtype] * float(want.abs().max())
                    results.append(PcieResult(case, rank, error, allowed, error <= allowed))
        finally:
            workspace.destroy()
    queue.put([asdict(result) for result in results])


def run_pcie_checks(world_size: int) -> list[dict[str, Any]]:
    """Every rank's results, one row per rank and case."""
    import torch
    import torch.multiprocessing as mp

    devices = torch.cuda.device_count()
    context = mp.get_context("spawn")
    queue = context.Queue()
    port = free_port()
    processes = [
        context.Process(target=_rank, args=(rank, world_size, devices, port, queue))
        for rank in range(world_size)
    ]
    for process in processes:
        process.start()
    rows: list[dict[str, Any]] = []
    for _ in processes:
        rows += queue.get(timeout=600)
    for process in processes:
        process.join(timeout=60)
    failed = [p.exitcode for p in processes if p.exitcode]
    if failed:
        rows.append(
            {
                "case": "pcie_ipc ranks",
                "rank": -1,
                "max_abs_error": float("nan"),
                "max_allowed": 0.0,
                "passed": False,
                "exit_codes": failed,
            }
        )
    return rows
