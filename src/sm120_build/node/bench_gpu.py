"""`nox -s bench_gpu`: latency of the fused allreduce + residual add + RMSNorm kernel against
NCCL all_reduce followed by a separate residual add + RMSNorm, one rank per GPU.

A benchmark, not a test. Each figure is the median of many CUDA-event-timed replays of a
CUDA graph holding 10 calls, after warm-up. Needs at least two GPUs: ranks that share one
GPU would time contention, not an interconnect.

--launch-cost instead times what eager (no CUDA graph) decode pays on the host per call of
each launcher patch 0004 changed: the median wall time of one call, which returns once the
kernel is queued. Two ranks, sharing a GPU when there is only one: the host side is what is
measured.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import UserError, exit_status
from .install import add_node_options, install_checked
from .ranks import allreduce_fusion, free_port, init_ranks

SIZES = [(tokens, hidden) for hidden in (4096, 7168) for tokens in (16, 128, 1024)]
CALLS_PER_GRAPH = 10
LAUNCH_COST_TOKENS = 8
LAUNCH_COST_HIDDENS = (4096, 7168)
LAUNCH_COST_CALLS = 2000


def _time_graph(torch: Any, run: Callable[[], None], replays: int) -> float:
    """Median microseconds per call of `run`, captured CALLS_PER_GRAPH times in a graph."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            run()  # warm-up outside the graph (NCCL and lamport state)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(CALLS_PER_GRAPH):
            run()
    for _ in range(5):
        graph.replay()
    samples = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1000 / CALLS_PER_GRAPH)
    return float(statistics.median(samples))


def _fused_call(
    x: Any,
    residual: Any,
    gamma: Any,
    residual_out: Any,
    norm_out: Any,
    rank: int,
    world_size: int,
    workspace: Any,
    *,
    use_oneshot: bool | None,
) -> Callable[[], None]:
    """One call of the fused allreduce + residual add + RMSNorm (bf16, PDL), ready to time."""
    return functools.partial(
        allreduce_fusion,
        x,
        rank=rank,
        world_size=world_size,
        workspace=workspace,
        pdl=True,
        use_oneshot=use_oneshot,
        residual_in=residual,
        rms_gamma=gamma,
        residual_out=residual_out,
        norm_out=norm_out,
    )


def _measure(
    rank: int, world_size: int, workspace: Any, tokens: int, hidden: int, replays: int
) -> dict[str, float]:
    import torch
    import torch.distributed as dist

    x = torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda")
    residual = torch.randn_like(x)
    gamma = torch.ones(hidden, dtype=torch.bfloat16, device="cuda")
    residual_out, norm_out, reduced = torch.empty_like(x), torch.empty_like(x), torch.empty_like(x)

    fused = _fused_call(
        x, residual, gamma, residual_out, norm_out, rank, world_size, workspace, use_oneshot=None
    )

    def unfused() -> None:
        reduced.copy_(x)
        dist.all_reduce(reduced)
        residual_out.copy_(reduced + residual)
        normed = torch.nn.functional.rms_norm(residual_out.float(), (hidden,), eps=1e-6)
        norm_out.copy_(normed.to(x.dtype) * gamma)

    return {
        "tokens": tokens,
        "hidden": hidden,
        "fused_us": _time_graph(torch, fused, replays),
        "unfused_us": _time_graph(torch, unfused, replays),
    }


def _rank(rank: int, world_size: int, port: int, replays: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from flashinfer.comm import trtllm_ar

    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        device_id=torch.device("cuda", rank),
    )
    rows = []
    for hidden in sorted({h for _, h in SIZES}):
        max_tokens = max(t for t, h in SIZES if h == hidden)
        handles, workspace = trtllm_ar.trtllm_create_ipc_workspace_for_all_reduce_fusion(
            rank, world_size, max_tokens, hidden, group=dist.group.WORLD
        )
        for tokens in sorted(t for t, h in SIZES if h == hidden):
            rows.append(_measure(rank, world_size, workspace, tokens, hidden, replays))
        dist.barrier()
        trtllm_ar.trtllm_destroy_ipc_workspace_for_all_reduce_fusion(handles, dist.group.WORLD)
    if rank == 0:
        Path(out).write_text(json.dumps(rows))
    dist.destroy_process_group()


def _host_microseconds(torch: Any, run: Callable[[], None], calls: int) -> tuple[float, float]:
    """Median and 90th percentile host wall time of one call of `run`, in microseconds,
    after warm-up (the first call fills any per-kernel cache)."""
    import time

    for _ in range(20):
        run()
    torch.cuda.synchronize()
    samples = []
    for index in range(calls):
        started = time.perf_counter_ns()
        run()
        samples.append((time.perf_counter_ns() - started) / 1000)
        if index % 200 == 199:
            torch.cuda.synchronize()  # keep the launch queue short
    torch.cuda.synchronize()
    samples.sort()
    return float(statistics.median(samples)), samples[int(len(samples) * 0.9)]


def _launch_cost_rank(rank: int, world_size: int, devices: int, port: int, out: str) -> None:
    import torch.distributed as dist

    group = init_ranks(rank, world_size, devices, port)
    rows = []
    for hidden in LAUNCH_COST_HIDDENS:
        rows += _launch_costs(rank, world_size, group, hidden)
    if rank == 0:
        Path(out).write_text(json.dumps(rows))
    dist.destroy_process_group()


def _launch_costs(rank: int, world_size: int, group: Any, hidden: int) -> list[dict[str, Any]]:
    import torch
    import torch.distributed as dist
    from flashinfer.comm import trtllm_ar

    tokens = LAUNCH_COST_TOKENS
    rows = []
    handles, fusion = trtllm_ar.trtllm_create_ipc_workspace_for_all_reduce_fusion(
        rank, world_size, tokens, hidden, group=group
    )
    custom = trtllm_ar.trtllm_create_ipc_workspace_for_all_reduce(
        rank, world_size, tokens, hidden, group=group
    )
    custom_pointers = [torch.tensor(custom[i], dtype=torch.int64) for i in range(7)]
    x = torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda")
    residual, gamma = torch.randn_like(x), torch.ones(hidden, dtype=x.dtype, device="cuda")
    out_a, out_b, out_c = torch.empty_like(x), torch.empty_like(x), torch.empty_like(x)
    experts = torch.randn(4, tokens, hidden, dtype=x.dtype, device="cuda")
    expert_scales = torch.rand(4, tokens, device="cuda")
    flag = [0]

    fusion_call = _fused_call(
        x, residual, gamma, out_a, out_b, rank, world_size, fusion, use_oneshot=True
    )

    def moe_reduction_call() -> None:
        trtllm_ar.trtllm_moe_allreduce_fusion(
            world_size=world_size,
            world_rank=rank,
            token_num=tokens,
            hidden_dim=hidden,
            workspace_ptrs=fusion,
            launch_with_pdl=True,
            residual_in=residual,
            rms_gamma=gamma,
            rms_eps=1e-6,
            scale_factor=1.0,
            moe_reduction_device_num_experts=4,
            moe_reduction_scale_input=expert_scales,
            moe_reduction_active_experts_token_input=experts,
            moe_reduction_token_input=x,
            layout_code=None,
            moe_allreduce_out=out_c,
            residual_out=out_a,
            norm_out=out_b,
            quant_out=None,
            scale_out=None,
        )

    def custom_lamport_call() -> None:
        flag[0] += 1
        trtllm_ar.trtllm_custom_all_reduce(
            inp=x,
            out=out_b,
            tp_size=world_size,
            tp_rank=rank,
            token_num=tokens,
            fusion_op_code=trtllm_ar.AllReduceFusionOp.RESIDUAL_RMS_NORM,
            strategy_code=trtllm_ar.AllReduceStrategyType.ONESHOT,
            config_code=0,
            launch_with_pdl=True,
            flag_value=flag[0],
            peer_comm_buffer_ptrs=custom_pointers[0],
            peer_barrier_ptrs_in=custom_pointers[2],
            peer_barrier_ptrs_out=custom_pointers[3],
            bias=None,
            residual=residual,
            weight=gamma,
            weight_pre_residual_norm=None,
            eps=1e-6,
            intermediate_buffer=out_a,
            lamport_peer_comm_buffer_ptrs_0=custom_pointers[4],
            lamport_peer_comm_buffer_ptrs_1=custom_pointers[5],
            lamport_peer_comm_buffer_ptrs_2=custom_pointers[6],
        )

    for launcher, call in (
        ("allreduce_fusion", fusion_call),
        ("moe_reduction", moe_reduction_call),
        ("custom_lamport_norm", custom_lamport_call),
    ):
        dist.barrier(group)
        median, p90 = _host_microseconds(torch, call, LAUNCH_COST_CALLS)
        rows.append(
            {
                "launcher": launcher,
                "tokens": tokens,
                "hidden": hidden,
                "median_us": median,
                "p90_us": p90,
            }
        )
    dist.barrier(group)
    trtllm_ar.trtllm_destroy_ipc_workspace_for_all_reduce(custom, group)
    trtllm_ar.trtllm_destroy_ipc_workspace_for_all_reduce_fusion(handles, group)
    return rows


def launch_cost(json_path: Path | None) -> int:
    import torch
    import torch.multiprocessing as mp

    devices = torch.cuda.device_count()
    if devices == 0:
        raise UserError("no CUDA GPU is visible: run this on a GPU node")
    world_size = 2
    print(
        f"{devices} x {torch.cuda.get_device_name(0)}, torch {torch.__version__}; "
        f"{world_size} ranks on {min(devices, world_size)} GPU(s), eager, "
        f"{LAUNCH_COST_CALLS} calls each"
    )
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench_gpu-launch-{os.getpid()}.json"
    mp.spawn(
        _launch_cost_rank,
        args=(world_size, devices, free_port(), str(out)),
        nprocs=world_size,
        join=True,
    )
    rows = json.loads(out.read_text())
    out.unlink()
    print(f"\n{'launcher':<20} {'tokens':>6} {'hidden':>6} {'median us':>9} {'p90 us':>7}")
    for row in rows:
        print(
            f"{row['launcher']:<20} {row['tokens']:>6} {row['hidden']:>6} "
            f"{row['median_us']:>9.1f} {row['p90_us']:>7.1f}"
        )
    if json_path:
        json_path.write_text(json.dumps({"launch_cost": rows}, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_gpu", description=__doc__)
    parser.add_argument(
        "--world-size",
        type=int,
        action="append",
        help="ranks, one per GPU (default: 2, 4, 8 up to the GPU count)",
    )
    parser.add_argument(
        "--replays", type=int, default=200, help="CUDA-graph replays per figure (default 200)"
    )
    parser.add_argument(
        "--launch-cost",
        action="store_true",
        help="time each 0004 launcher's host cost per eager call instead (one GPU is enough)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    add_node_options(parser)
    args = parser.parse_args(argv)
    return exit_status(lambda: _bench(args), args.verbose)


def _bench(args: argparse.Namespace) -> int:
    if args.install is not None:
        install_checked(args.install, trust_key=args.trust_key)
    if args.launch_cost:
        return launch_cost(args.json)
    import torch
    import torch.multiprocessing as mp

    devices = torch.cuda.device_count()
    sizes = args.world_size or [n for n in (2, 4, 8) if n <= devices]
    if not sizes or max(sizes) > devices:
        raise UserError(f"needs one GPU per rank; this machine has {devices}")
    name = torch.cuda.get_device_name(0)
    print(f"{devices} x {name}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    results = {}
    for world_size in sizes:
        out = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench_gpu-{os.getpid()}.json"
        mp.spawn(
            _rank,
            args=(world_size, free_port(), args.replays, str(out)),
            nprocs=world_size,
            join=True,
        )
        results[world_size] = json.loads(out.read_text())
        out.unlink()
    print(
        f"\n{'ranks':>5} {'tokens':>6} {'hidden':>6} {'fused us':>9} {'unfused us':>10} "
        f"{'fused/unfused':>13}"
    )
    for world_size, rows in results.items():
        for row in rows:
            print(
                f"{world_size:>5} {row['tokens']:>6} {row['hidden']:>6} "
                f"{row['fused_us']:>9.1f} {row['unfused_us']:>10.1f} "
                f"{row['fused_us'] / row['unfused_us']:>13.2f}"
            )
    if args.json:
        args.json.write_text(json.dumps({"gpu": name, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
