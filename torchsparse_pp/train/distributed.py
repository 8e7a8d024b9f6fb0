"""torch.distributed for training: process-group setup from torchrun's environment (gloo on
the CPU, nccl on CUDA), SyncBatchNorm conversion, the DistributedDataParallel wrapper, and
result gathering."""
import gc
import inspect
import os
from dataclasses import dataclass
from typing import Any, List

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..nn import BatchNorm, SyncBatchNorm

__all__ = ["DistInfo", "init_distributed", "convert_sync_batchnorm", "wrap_ddp", "unwrap", "broadcast_buffers",
           "unsynced_norms", "average_buffers", "all_reduce_sum", "gather_objects", "cleanup"]


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device: str) -> DistInfo:
    """Joins the process group torchrun describes (WORLD_SIZE, RANK, LOCAL_RANK); a single
    process without those variables runs alone."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return DistInfo(0, 1, 0)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if device == "cuda":
        if torch.cuda.device_count() <= local_rank:
            raise RuntimeError(f"local rank {local_rank} has no GPU ({torch.cuda.device_count()} visible)")
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device == "cuda" else "gloo")
    return DistInfo(rank, world_size, local_rank)


def convert_sync_batchnorm(model: nn.Module) -> nn.Module:
    """Every sparse BatchNorm -> torchsparse_pp SyncBatchNorm and every dense BatchNorm{1,2,3}d ->
    torch.nn.SyncBatchNorm (CUDA only: torch's works on CUDA alone), sharing their state."""
    model = SyncBatchNorm.convert_sync_batchnorm(model)
    dense = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
             and not isinstance(m, (BatchNorm, SyncBatchNorm, nn.SyncBatchNorm))]
    if dense and next(model.parameters()).is_cuda:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return model


def unsynced_norms(model: nn.Module) -> List[nn.Module]:
    """The norms with running statistics that do not reduce them over the ranks (dense BatchNorm
    on the CPU; every BatchNorm when train.sync_batchnorm is off): each rank updates its own."""
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
            and not isinstance(m, (SyncBatchNorm, nn.SyncBatchNorm)) and m.track_running_stats]


def _ddp_accepts(name: str) -> bool:
    return name in inspect.signature(DistributedDataParallel.__init__).parameters


def wrap_ddp(model: nn.Module, device: torch.device) -> nn.Module:
    """``model`` in torch's DistributedDataParallel (bucketed gradient all-reduce overlapped with
    backward, ``no_sync()`` for accumulation). Parameters and buffers start as rank 0's.

    Buffers are not broadcast before every forward: SyncBatchNorm computes the same running
    statistics on every rank, and the trainer averages those of unsynchronised norms after each
    step (average_buffers), which keeps every rank's information instead of rank 0's alone."""
    broadcast_buffers(model)
    kwargs = {"forward_sync_buffers": False} if _ddp_accepts("forward_sync_buffers") else {"broadcast_buffers": False}
    device_ids = [device.index if device.index is not None else torch.cuda.current_device()] \
        if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids, **kwargs)


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside a DistributedDataParallel (or the model itself)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def broadcast_buffers(model: nn.Module) -> None:
    """Rank 0's buffers to every rank."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        for buffer in model.buffers():
            dist.broadcast(buffer.data, 0)


def average_buffers(modules: List[nn.Module]) -> None:
    """The running statistics of ``modules`` (unsynced_norms): the mean over ranks, in one
    all-reduce, so the ranks keep identical models."""
    if not modules or not (dist.is_initialized() and dist.get_world_size() > 1):
        return
    buffers = [b for m in modules for b in (m.running_mean, m.running_var) if b is not None]
    if not buffers:
        return
    flat = torch.cat([b.reshape(-1).float() for b in buffers])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for b in buffers:
        b.copy_(flat[offset:offset + b.numel()].view_as(b))
        offset += b.numel()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized() and dist.get_world_size() > 1:
        tensor = tensor.clone()
        dist.all_reduce(tensor)
    return tensor


def gather_objects(items: List[Any]) -> List[Any]:
    """Every rank's list, concatenated in rank order (on every rank)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return list(items)
    gathered: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, items)
    return [x for part in gathered for x in part]


def cleanup() -> None:
    """Destroys the process group. Callers drop their DDP-wrapped models first, and this collects
    before destroying: torch's DistributedDataParallel is in a reference cycle (a closure over
    itself), so dropping its last name frees neither it nor the group its reducer holds until a
    cyclic collection, which may come at interpreter exit; a gloo group finalised there has its
    worker threads release their last tensors without the GIL, which aborts the process."""
    if dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()
