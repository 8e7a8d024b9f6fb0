"""torch.distributed for training: process-group setup from torchrun's environment (gloo on
the CPU, nccl on CUDA), SyncBatchNorm conversion, gradient averaging and result gathering."""
import os
from dataclasses import dataclass
from typing import Any, List

import torch
import torch.distributed as dist
from torch import nn

from ..nn import BatchNorm, SyncBatchNorm

__all__ = ["DistInfo", "init_distributed", "convert_sync_batchnorm", "average_gradients", "broadcast_model",
           "all_reduce_sum", "gather_objects", "cleanup"]


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


def broadcast_model(model: nn.Module) -> None:
    """Rank 0's parameters and buffers to every rank."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        for tensor in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(tensor.data, 0)


def average_gradients(model: nn.Module) -> None:
    """Mean of the gradients over ranks, in one flat all-reduce (identical on every rank)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for p in params:
        n = p.numel()
        p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
        offset += n


def average_buffers(model: nn.Module) -> None:
    """Running statistics of norms that were not synchronised (dense BN on the CPU): the mean
    over ranks, so the ranks keep identical models."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return
    for buffer in model.buffers():
        if buffer.is_floating_point():
            dist.all_reduce(buffer.data)
            buffer.data /= dist.get_world_size()


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
    if dist.is_initialized():
        dist.destroy_process_group()
