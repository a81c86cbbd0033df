"""`nox -s verify_gpu`: prove that the installed AOT trtllm_comm kernels load without JIT
and compute the right thing on this machine's GPUs.

Run inside an environment that has torch and the wheelhouse's flashinfer-python and
flashinfer-jit-cache installed, with FLASHINFER_DISABLE_JIT=1. One rank per GPU over NCCL;
on a single GPU two ranks share it over gloo (CUDA IPC works between processes on one
device). Every rank builds all ranks' inputs from fixed seeds, so the fp32 reference needs
no communication and never goes through the kernels under test.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# Tolerances: |out - ref| <= atol + rtol * |ref|, against an fp32 reference.
# bf16 keeps 8 significant bits (2^-8 ~ 3.9e-3 relative), fp16 11 bits (2^-11 ~ 4.9e-4);
# outputs are rounded once from fp32 accumulation, so 2-4 ulps of headroom is ample while a
# missed rank, a stale lamport buffer or a race is off by O(1).
TOLERANCES = {"bfloat16": (1.6e-2, 1.6e-2), "float16": (2e-3, 2e-3)}


MOE_TOP_K = 4


@dataclass(frozen=True)
class Case:
    pattern: str  # "allreduce", "residual_rmsnorm" or "moe_finalize"
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


@dataclass
class Result:
    case: str
    rank: int
    output: str
    max_abs_error: float
    max_allowed: float
    passed: bool


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
    return cases


def _inputs(case: Case, world_size: int) -> tuple[list[Any], Any, Any]:
    import torch

    def draw(seed: int, *shape: int) -> Any:
        generator = torch.Generator().manual_seed(seed)
        return torch.randn(*shape, generator=generator, dtype=torch.float32)

    base = zlib.crc32(case.name.encode()) & 0xFFFF  # same in every rank's process
    rows = case.tokens * (MOE_TOP_K if case.pattern == "moe_finalize" else 1)
    shards = [draw(base + rank, rows, case.hidden) for rank in range(world_size)]
    residual = draw(base + 1000, case.tokens, case.hidden)
    gamma = 1.0 + 0.1 * draw(base + 2000, case.hidden)
    return shards, residual, gamma


def _moe_routing(case: Case, world_size: int) -> list[tuple[Any, Any, Any]]:
    """Per rank: a permutation of the expanded rows (some dropped as -1), expert scales
    and a shared-expert output."""
    import torch

    base = zlib.crc32(case.name.encode()) & 0xFFFF
    routing = []
    for rank in range(world_size):
        generator = torch.Generator().manual_seed(base + 3000 + rank)
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


def _reference(case: Case, world_size: int, eps: float) -> dict[str, Any]:
    import torch

    dtype = getattr(torch, case.dtype)
    shards, residual, gamma = _inputs(case, world_size)
    if case.pattern == "moe_finalize":
        total = sum(
            _moe_finalize_reference(case, shard, *routing)
            for shard, routing in zip(shards, _moe_routing(case, world_size), strict=True)
        )
    else:
        # Round the inputs to the tested dtype first: the kernel sees these values.
        total = sum(shard.to(dtype).float() for shard in shards)
    if case.pattern == "allreduce":
        return {"allreduce_out": total}
    summed = total + residual.to(dtype).float()
    variance = summed.pow(2).mean(dim=-1, keepdim=True)
    normed = summed * torch.rsqrt(variance + eps) * gamma.to(dtype).float()
    return {"residual_out": summed, "norm_out": normed}


def _run_rank(
    rank: int, world_size: int, devices: int, port: int, cases: list[Case], results_path: str
) -> None:
    import torch
    import torch.distributed as dist
    from flashinfer.comm import trtllm_ar

    device = rank % devices
    torch.cuda.set_device(device)
    backend = "nccl" if devices >= world_size else "gloo"
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        device_id=torch.device("cuda", device) if backend == "nccl" else None,
    )
    group = dist.group.WORLD
    eps = 1e-6
    results: list[Result] = []
    for hidden in sorted({case.hidden for case in cases}):
        max_tokens = max(case.tokens for case in cases if case.hidden == hidden)
        ipc_handles, workspace = trtllm_ar.trtllm_create_ipc_workspace_for_all_reduce_fusion(
            rank, world_size, max_tokens, hidden, group=group
        )
        for case in (c for c in cases if c.hidden == hidden):
            dtype = getattr(torch, case.dtype)
            shards, residual, gamma = _inputs(case, world_size)
            x = shards[rank].to(dtype).cuda()
            outputs = {
                name: torch.full(
                    (case.tokens, case.hidden), float("nan"), dtype=dtype, device="cuda"
                )
                for name in ("allreduce_out", "residual_out", "norm_out")
            }
            dist.barrier(group)
            if case.pattern == "moe_finalize":
                permuted, scales, shared = _moe_routing(case, world_size)[rank]
                trtllm_ar.trtllm_moe_finalize_allreduce_fusion(
                    allreduce_in=x,
                    residual_in=residual.to(dtype).cuda(),
                    norm_weight=gamma.to(dtype).cuda(),
                    expanded_idx_to_permuted_idx=permuted.cuda(),
                    norm_out=outputs["norm_out"],
                    residual_out=outputs["residual_out"],
                    workspace_ptrs=workspace,
                    launch_with_pdl=case.pdl,
                    world_rank=rank,
                    world_size=world_size,
                    eps=eps,
                    shared_expert_output=shared.to(dtype).cuda(),
                    expert_scale_factor=scales.to(dtype).cuda(),
                )
                torch.cuda.synchronize()
                results += _compare(case, rank, outputs, world_size, eps)
                continue
            pattern = (
                trtllm_ar.AllReduceFusionPattern.kAllReduce
                if case.pattern == "allreduce"
                else trtllm_ar.AllReduceFusionPattern.kARResidualRMSNorm
            )
            trtllm_ar.trtllm_allreduce_fusion(
                allreduce_in=x,
                world_size=world_size,
                world_rank=rank,
                token_num=case.tokens,
                hidden_dim=case.hidden,
                workspace_ptrs=workspace,
                launch_with_pdl=case.pdl,
                trigger_completion_at_end=True,
                fp32_acc=True,
                pattern_code=pattern,
                use_oneshot=case.oneshot,
                allreduce_out=outputs["allreduce_out"] if case.pattern == "allreduce" else None,
                residual_in=residual.to(dtype).cuda() if case.pattern != "allreduce" else None,
                residual_out=outputs["residual_out"] if case.pattern != "allreduce" else None,
                norm_out=outputs["norm_out"] if case.pattern != "allreduce" else None,
                quant_out=None,
                scale_out=None,
                rms_gamma=gamma.to(dtype).cuda() if case.pattern != "allreduce" else None,
                rms_eps=eps if case.pattern != "allreduce" else None,
                scale_factor=None,
                layout_code=None,
            )
            torch.cuda.synchronize()
            results += _compare(case, rank, outputs, world_size, eps)
        dist.barrier(group)
        trtllm_ar.trtllm_destroy_ipc_workspace_for_all_reduce_fusion(ipc_handles, group)
    Path(results_path).with_suffix(f".rank{rank}.json").write_text(
        json.dumps([asdict(result) for result in results])
    )
    dist.destroy_process_group()


def _compare(
    case: Case, rank: int, outputs: dict[str, Any], world_size: int, eps: float
) -> list[Result]:
    import torch

    rtol, atol = TOLERANCES[case.dtype]
    results = []
    for name, expected in _reference(case, world_size, eps).items():
        got = outputs[name].float().cpu()
        error = (got - expected).abs()
        allowed = atol + rtol * expected.abs()
        ok = bool(torch.isfinite(got).all()) and bool((error <= allowed).all())
        results.append(
            Result(
                case.name, rank, name, float(error.nan_to_num(1e30).max()), float(allowed.max()), ok
            )
        )
    return results


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def check_aot_load() -> tuple[str, float]:
    """Load trtllm_comm with JIT disabled; return where it came from and how long it took."""
    from flashinfer.comm import trtllm_ar
    from flashinfer.jit.comm import gen_trtllm_comm_module

    spec = gen_trtllm_comm_module()
    started = time.perf_counter()
    trtllm_ar.get_trtllm_comm_module()
    elapsed = time.perf_counter() - started
    return str(spec.aot_path), elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="verify_gpu", description=__doc__)
    parser.add_argument(
        "--world-size", type=int, help="ranks (default: one per GPU, two on a single GPU)"
    )
    parser.add_argument("--json", type=Path, help="also write all results to this file")
    args = parser.parse_args(argv)

    if os.environ.get("FLASHINFER_DISABLE_JIT") != "1":
        print(
            "error: run with FLASHINFER_DISABLE_JIT=1 (nox -s verify_gpu sets it), so a "
            "missing prebuilt module fails instead of compiling",
            file=sys.stderr,
        )
        return 2
    import torch
    import torch.multiprocessing as mp

    devices = torch.cuda.device_count()
    if devices == 0:
        print("error: no CUDA GPU is visible", file=sys.stderr)
        return 2
    world_size = args.world_size or (2 if devices == 1 else devices)
    names = {torch.cuda.get_device_name(d) for d in range(devices)}
    capability = torch.cuda.get_device_capability(0)
    print(
        f"GPUs: {devices} x {', '.join(sorted(names))} (sm_{capability[0]}{capability[1]}); "
        f"torch {torch.__version__}, CUDA {torch.version.cuda}; world size {world_size}"
    )

    so_path, load_seconds = check_aot_load()
    import flashinfer_jit_cache

    from_package = Path(so_path).is_relative_to(flashinfer_jit_cache.get_jit_cache_dir())
    print(
        f"trtllm_comm: loaded from {so_path} in {load_seconds:.3f} s with JIT disabled "
        f"({'inside' if from_package else 'OUTSIDE'} the flashinfer-jit-cache package)"
    )

    cases = default_cases(world_size)
    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"verify_gpu-{os.getpid()}"
    mp.spawn(
        _run_rank,
        args=(world_size, devices, _free_port(), cases, str(scratch)),
        nprocs=world_size,
        join=True,
    )
    results = []
    for rank in range(world_size):
        path = scratch.with_suffix(f".rank{rank}.json")
        results += [Result(**item) for item in json.loads(path.read_text())]
        path.unlink()

    # One row per (case, output): the worst error over the ranks.
    rows: dict[tuple[str, str], list[Result]] = {}
    for result in results:
        rows.setdefault((result.case, result.output), []).append(result)
    print(f"\n{'case':<52} {'output':<14} {'max |err|':>10} {'allowed':>9}  result")
    failed = 0
    for (case, output), per_rank in rows.items():
        passed = all(r.passed for r in per_rank)
        failed += not passed
        error = max(r.max_abs_error for r in per_rank)
        allowed = max(r.max_allowed for r in per_rank)
        print(
            f"{case:<52} {output:<14} {error:>10.2e} {allowed:>9.2e}  "
            f"{'PASS' if passed else 'FAIL'}"
        )
    print(
        f"\n{len(rows) - failed} passed, {failed} failed "
        f"(each row checked on all {world_size} ranks); AOT load {load_seconds:.3f} s"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "gpus": sorted(names),
                    "devices": devices,
                    "world_size": world_size,
                    "torch": torch.__version__,
                    "cuda": torch.version.cuda,
                    "aot_so": so_path,
                    "aot_load_seconds": load_seconds,
                    "results": [asdict(r) for r in results],
                },
                indent=2,
            )
        )
    return 1 if failed or not from_package else 0


if __name__ == "__main__":
    sys.exit(main())
