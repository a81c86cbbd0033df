"""verify_gpu's trtllm_comm checks: the installed AOT trtllm_comm kernels load without JIT
and compute the right thing on this machine's GPUs.

What runs: the allreduce fusion (one-shot lamport and two-shot, with and without PDL), the
MoE finalize and MoE reduction fusions, the custom allreduce's lamport one-shot norm at 8
tokens (patches 0001 and 0003), and a PDL race check (patch 0010): a producer kernel lets
the fusion launch early, then writes residual_in late; a fusion that loads residual_in before
its grid-dependency wait reads the stale buffer and fails the comparison.

Run inside an environment that has torch and the wheelhouse's flashinfer-python and
flashinfer-jit-cache installed, with FLASHINFER_DISABLE_JIT=1. One rank per GPU over NCCL;
on a single GPU two ranks share it over gloo (CUDA IPC works between processes on one
device). Every rank builds all ranks' inputs from fixed seeds, so the fp32 reference needs
no communication and never goes through the kernels under test.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import UserError
from .comm_cases import (
    CUSTOM_ALLREDUCE_TOKENS,
    MOE_REDUCTION_EXPERTS,
    PATTERNS,
    TOLERANCES,
    Case,
    case_bias,
    case_inputs,
    case_reference,
    default_cases,
    moe_reduction_inputs,
    moe_routing,
)
from .ranks import allreduce_fusion, free_port, init_ranks

CASE_TIMEOUT = 60  # seconds; every case takes well under one

# The PDL race check's producer, compiled by torch's own NVRTC (jiterator), so the node needs
# no nvcc: each thread first lets dependent kernels launch, then waits 2 ms before it writes.
PDL_PRODUCER = r"""
template <typename T> T pdl_delayed_copy(T x) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < 2000000ull);
  return x;
}
"""


@dataclass
class Result:
    case: str
    rank: int
    output: str
    max_abs_error: float
    max_allowed: float
    passed: bool


@dataclass
class Workspaces:
    """One hidden size's IPC workspaces: the allreduce fusion's and the custom allreduce's."""

    fusion: Any
    custom: list[list[int]]
    custom_flag: int = 0  # the custom allreduce's barrier flag, one more per call


def _run_case(
    case: Case, rank: int, world_size: int, workspaces: Workspaces, eps: float
) -> dict[str, Any]:
    """Run one case on this rank; return its outputs (NaN where a kernel wrote nothing)."""
    import torch
    from flashinfer.comm import trtllm_ar

    dtype = getattr(torch, case.dtype)
    shards, residual, gamma = case_inputs(case, world_size)
    x = shards[rank].to(dtype).cuda()
    residual_in = residual.to(dtype).cuda()
    rms_gamma = gamma.to(dtype).cuda()
    outputs = {
        name: torch.full((case.tokens, case.hidden), float("nan"), dtype=dtype, device="cuda")
        for name in ("allreduce_out", "residual_out", "norm_out")
    }
    if case.pattern == "moe_finalize":
        permuted, scales, shared = moe_routing(case, world_size)[rank]
        trtllm_ar.trtllm_moe_finalize_allreduce_fusion(
            allreduce_in=x,
            residual_in=residual_in,
            norm_weight=rms_gamma,
            expanded_idx_to_permuted_idx=permuted.cuda(),
            norm_out=outputs["norm_out"],
            residual_out=outputs["residual_out"],
            workspace_ptrs=workspaces.fusion,
            launch_with_pdl=case.pdl,
            world_rank=rank,
            world_size=world_size,
            eps=eps,
            shared_expert_output=shared.to(dtype).cuda(),
            expert_scale_factor=scales.to(dtype).cuda(),
            **_unused_newer_parameters(
                trtllm_ar.trtllm_moe_finalize_allreduce_fusion,
                ("quant_out", "scale_out", "routed_scaling_factor"),
            ),
        )
    elif case.pattern == "moe_reduction":
        experts, expert_scales, fc2 = moe_reduction_inputs(case, rank)
        trtllm_ar.trtllm_moe_allreduce_fusion(
            world_size=world_size,
            world_rank=rank,
            token_num=case.tokens,
            hidden_dim=case.hidden,
            workspace_ptrs=workspaces.fusion,
            launch_with_pdl=case.pdl,
            residual_in=residual_in,
            rms_gamma=rms_gamma,
            rms_eps=eps,
            scale_factor=1.0,
            moe_reduction_device_num_experts=MOE_REDUCTION_EXPERTS,
            moe_reduction_scale_input=expert_scales.cuda(),
            moe_reduction_active_experts_token_input=experts.to(dtype).cuda(),
            moe_reduction_token_input=fc2.to(dtype).cuda(),
            layout_code=None,
            moe_allreduce_out=outputs["allreduce_out"],
            residual_out=outputs["residual_out"],
            norm_out=outputs["norm_out"],
            quant_out=None,
            scale_out=None,
        )
    elif case.pattern == "custom_lamport_norm":
        workspaces.custom_flag += 1

        def pointers(index: int) -> Any:
            return torch.tensor(workspaces.custom[index], dtype=torch.int64)

        trtllm_ar.trtllm_custom_all_reduce(
            inp=x,
            out=outputs["norm_out"],
            tp_size=world_size,
            tp_rank=rank,
            token_num=case.tokens,
            fusion_op_code=trtllm_ar.AllReduceFusionOp.RESIDUAL_RMS_NORM,
            strategy_code=trtllm_ar.AllReduceStrategyType.ONESHOT,
            config_code=0,
            launch_with_pdl=case.pdl,
            flag_value=workspaces.custom_flag,
            peer_comm_buffer_ptrs=pointers(0),
            peer_barrier_ptrs_in=pointers(2),
            peer_barrier_ptrs_out=pointers(3),
            bias=case_bias(case).to(dtype).cuda(),
            residual=residual_in,
            weight=rms_gamma,
            weight_pre_residual_norm=None,
            eps=eps,
            intermediate_buffer=outputs["residual_out"],
            lamport_peer_comm_buffer_ptrs_0=pointers(4),
            lamport_peer_comm_buffer_ptrs_1=pointers(5),
            lamport_peer_comm_buffer_ptrs_2=pointers(6),
        )
    else:
        if case.pattern == "pdl_race":
            residual_in = _late_residual(residual_in)
        fused = case.pattern != "allreduce"
        allreduce_fusion(
            x,
            rank=rank,
            world_size=world_size,
            workspace=workspaces.fusion,
            pdl=case.pdl,
            use_oneshot=case.oneshot,
            residual_in=residual_in if fused else None,
            rms_gamma=rms_gamma if fused else None,
            residual_out=outputs["residual_out"] if fused else None,
            norm_out=outputs["norm_out"] if fused else None,
            allreduce_out=None if fused else outputs["allreduce_out"],
            eps=eps,
        )
    torch.cuda.synchronize()
    return outputs


def _unused_newer_parameters(function: Any, names: tuple[str, ...]) -> dict[str, None]:
    """None for each of `names` that this FlashInfer's `function` takes (FlashInfer 0.7
    added them without defaults), as sglang passes them only where the signature has them."""
    import inspect

    taken = inspect.signature(function).parameters
    return {name: None for name in names if name in taken}


def _late_residual(residual: Any) -> Any:
    """A copy of `residual` that PDL_PRODUCER writes 2 ms after it let dependent kernels
    launch, into memory that held NaN: whatever reads it before its grid-dependency wait
    reads NaN. The NaN block is freed just before the copy is allocated, so torch's caching
    allocator hands the same memory to the copy."""
    import torch

    _pdl_producer()(residual[:1])  # NVRTC compiles per dtype on first use: not in between
    poisoned = torch.full_like(residual, float("nan"))
    poisoned_at = poisoned.data_ptr()
    del poisoned
    late = _pdl_producer()(residual)
    if late.data_ptr() != poisoned_at:
        raise RuntimeError("pdl_race: the producer's output did not reuse the NaN block")
    return late


@functools.cache
def _pdl_producer() -> Any:
    import torch

    return torch.cuda.jiterator._create_jit_fn(PDL_PRODUCER)


def has_custom_allreduce() -> bool:
    """FlashInfer 0.7 dropped the custom allreduce (trtllm_custom_all_reduce); its cases
    run where the installed FlashInfer still has it."""
    from flashinfer.comm import trtllm_ar

    return hasattr(trtllm_ar, "trtllm_custom_all_reduce")


def _fusion_workspace(
    rank: int, world_size: int, max_tokens: int, hidden: int, group: Any
) -> tuple[Any, Callable[[], None]]:
    """The allreduce fusion's workspace pointers as the stack's sglang makes them, and what
    frees them. sglang 0.5.9 calls trtllm_create_ipc_workspace_for_all_reduce_fusion (CUDA
    IPC, FlashInfer 0.6). Where FlashInfer allocates that workspace from torch's symmetric
    memory instead (0.7), which refuses ranks that share a GPU, sglang 0.5.23 calls
    create_allreduce_fusion_workspace (flashinfer_comm_fusion.py), whose TRT-LLM workspace
    is symmetric device memory (cuMem with POSIX file descriptors): so does this."""
    import importlib.util

    import torch
    from flashinfer.comm import trtllm_ar

    if importlib.util.find_spec("flashinfer.comm.torch_symmetric_memory") is None:
        handles, pointers = trtllm_ar.trtllm_create_ipc_workspace_for_all_reduce_fusion(
            rank, world_size, max_tokens, hidden, group=group
        )
        return pointers, lambda: trtllm_ar.trtllm_destroy_ipc_workspace_for_all_reduce_fusion(
            handles, group
        )
    from flashinfer.comm.allreduce import create_allreduce_fusion_workspace

    workspace = create_allreduce_fusion_workspace(
        backend="trtllm",
        world_size=world_size,
        rank=rank,
        max_token_num=max_tokens,
        hidden_dim=hidden,
        dtype=torch.bfloat16,  # fp16 and bf16 share it; only fp32 needs fp32 lamport buffers
        group=group,
    )
    return workspace.workspace_tensor, workspace.destroy


def _hung(rank: int, case: Case) -> None:
    print(
        f"rank {rank}: {case.name} did not finish in {CASE_TIMEOUT} s (custom flag or lamport "
        "buffers out of step between ranks, or a kernel that waits on a peer that never wrote)",
        flush=True,
    )
    os._exit(3)


def _run_rank(
    rank: int, world_size: int, devices: int, port: int, cases: list[Case], results_path: str
) -> None:
    import torch.distributed as dist
    from flashinfer.comm import trtllm_ar

    group = init_ranks(rank, world_size, devices, port)
    eps = 1e-6
    results: list[Result] = []
    for hidden in sorted({case.hidden for case in cases}):
        max_tokens = max(case.tokens for case in cases if case.hidden == hidden)
        fusion, destroy_fusion = _fusion_workspace(rank, world_size, max_tokens, hidden, group)
        custom = (
            trtllm_ar.trtllm_create_ipc_workspace_for_all_reduce(
                rank, world_size, CUSTOM_ALLREDUCE_TOKENS, hidden, group=group
            )
            if has_custom_allreduce()
            else []
        )
        workspaces = Workspaces(fusion, custom)
        for case in (c for c in cases if c.hidden == hidden):
            if rank == 0:
                print(f"[{cases.index(case) + 1}/{len(cases)}] {case.name}", flush=True)
            dist.barrier(group)
            # A rank waiting on a peer that never writes spins forever: name the case and stop.
            watchdog = threading.Timer(CASE_TIMEOUT, _hung, args=(rank, case))
            watchdog.start()
            outputs = _run_case(case, rank, world_size, workspaces, eps)
            watchdog.cancel()
            results += _compare(case, rank, outputs, world_size, eps)
        dist.barrier(group)
        if custom:
            trtllm_ar.trtllm_destroy_ipc_workspace_for_all_reduce(custom, group)
        destroy_fusion()
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
    for name, expected in case_reference(case, world_size, eps).items():
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


def check_aot_load() -> tuple[str, float]:
    """Load trtllm_comm with JIT disabled; return where it came from and how long it took."""
    from flashinfer.comm import trtllm_ar
    from flashinfer.jit.comm import gen_trtllm_comm_module

    spec = gen_trtllm_comm_module()
    started = time.perf_counter()
    trtllm_ar.get_trtllm_comm_module()
    elapsed = time.perf_counter() - started
    return str(spec.aot_path), elapsed


def verify_comm(
    world_size: int | None, patterns: list[str], json_path: Path | None
) -> tuple[int, int]:
    """The trtllm_comm checks over ranks; returns how many rows passed and how many failed
    (one more when the module did not come from the jit-cache package)."""
    import torch
    import torch.multiprocessing as mp

    devices = torch.cuda.device_count()
    if devices == 0:
        raise UserError("no CUDA GPU is visible: run this on a GPU node")
    world_size = world_size or (2 if devices == 1 else devices)
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

    cases = [c for c in default_cases(world_size) if c.pattern in (patterns or PATTERNS)]
    if not has_custom_allreduce():
        print("custom_lamport_norm: not run; this FlashInfer has no custom allreduce")
        cases = [c for c in cases if c.pattern != "custom_lamport_norm"]
    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"verify_gpu-{os.getpid()}"
    mp.spawn(
        _run_rank,
        args=(world_size, devices, free_port(), cases, str(scratch)),
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
    if json_path:
        json_path.write_text(
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
    return len(rows) - failed, failed + (not from_package)
