"""What the GPU checks and benchmarks share: a free port for the process group, joining it,
and the allreduce-fusion call as sglang makes it."""

from __future__ import annotations

import socket
from typing import Any


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def init_ranks(rank: int, world_size: int, devices: int, port: int) -> Any:
    """Join the process group: NCCL with one GPU per rank, gloo where ranks share a GPU (CUDA
    IPC works between processes on one device). Returns the group."""
    import torch
    import torch.distributed as dist

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
    return dist.group.WORLD


def allreduce_fusion(
    x: Any,
    *,
    rank: int,
    world_size: int,
    workspace: Any,
    pdl: bool,
    use_oneshot: bool | None,
    residual_in: Any = None,
    rms_gamma: Any = None,
    residual_out: Any = None,
    norm_out: Any = None,
    allreduce_out: Any = None,
    eps: float = 1e-6,
) -> None:
    """One trtllm_allreduce_fusion call as sglang makes it (layers/flashinfer_comm_fusion.py
    :194): allreduce + residual add + RMSNorm when residual_in is given, a plain allreduce
    into allreduce_out otherwise."""
    from flashinfer.comm import trtllm_ar

    fused = residual_in is not None
    tokens, hidden = x.shape
    trtllm_ar.trtllm_allreduce_fusion(
        allreduce_in=x,
        world_size=world_size,
        world_rank=rank,
        token_num=tokens,
        hidden_dim=hidden,
        workspace_ptrs=workspace,
        launch_with_pdl=pdl,
        trigger_completion_at_end=True,
        fp32_acc=True,
        pattern_code=(
            trtllm_ar.AllReduceFusionPattern.kARResidualRMSNorm
            if fused
            else trtllm_ar.AllReduceFusionPattern.kAllReduce
        ),
        use_oneshot=use_oneshot,
        allreduce_out=None if fused else allreduce_out,
        residual_in=residual_in,
        residual_out=residual_out,
        norm_out=norm_out,
        quant_out=None,
        scale_out=None,
        rms_gamma=rms_gamma,
        rms_eps=eps if fused else None,
        scale_factor=None,
        layout_code=None,
    )
