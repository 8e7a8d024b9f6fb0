"""Normalisation layers for SparseTensors.

BatchNorm normalises over all points of the batch; SyncBatchNorm does so across processes
(any backend, gloo on the CPU included); GroupNorm and InstanceNorm normalise over the points
of each sample separately, as their dense counterparts do per image.
"""
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

from ...tensor import SparseTensor, require_same_coords
from ..functional.norm import batch_norm_act as batch_norm_act_features
from ..functional.norm import sample_group_norm
from .feature_wise import FeatureWise


def _check_channels(module: nn.Module, input: SparseTensor, channels: int) -> None:
    if not isinstance(input, SparseTensor):
        raise TypeError(f"{type(module).__name__} expects a SparseTensor, got {type(input).__name__}")
    if input.num_channels != channels:
        raise ValueError(f"channel mismatch: {type(module).__name__} has {channels} channels, the input "
                         f"has {input.num_channels}")


def _check_traced_points(module: nn.Module, input: SparseTensor) -> None:
    """Under torch.compile / export the point count after a strided conv is an unbacked size:
    tell the compiler what batch_norm needs of it (more than one point when training, as eager
    BatchNorm raises otherwise), checked when the graph runs."""
    if torch.compiler.is_compiling() and module.training:
        torch._check(input.num_points > 1, lambda: "batch norm needs more than one point per channel when training")


def batch_norm_act(module: nn.modules.batchnorm._BatchNorm, input: SparseTensor,
                   residual: Optional[SparseTensor] = None, relu: bool = False) -> SparseTensor:
    """``act(module(input) + residual)`` for a BatchNorm-like module on this process's points
    (act: ReLU when ``relu``), with torch.nn.BatchNorm1d's bookkeeping: batch statistics when
    training or without running ones, running statistics updated with ``momentum`` (None: a
    cumulative average). Blocks pass their residual and ReLU here so they run in the norm's pass."""
    _check_channels(module, input, module.num_features)
    _check_traced_points(module, input)
    if residual is not None:
        if not isinstance(residual, SparseTensor):
            raise TypeError(f"the residual must be a SparseTensor, got {type(residual).__name__}")
        require_same_coords(input, residual, "+")
        residual_feats = residual.F
    else:
        residual_feats = None
    momentum = 0.0 if module.momentum is None else module.momentum
    if module.training and module.track_running_stats and module.num_batches_tracked is not None:
        module.num_batches_tracked.add_(1)
        momentum = 1.0 / float(module.num_batches_tracked) if module.momentum is None else module.momentum
    use_batch_stats = module.training or (module.running_mean is None and module.running_var is None)
    tracked = not module.training or module.track_running_stats
    feats = batch_norm_act_features(input.F, module.running_mean if tracked else None,
                                    module.running_var if tracked else None, module.weight, module.bias,
                                    use_batch_stats, momentum, module.eps, residual_feats, relu)
    return input.replace_feats(feats)


class BatchNorm(FeatureWise, nn.BatchNorm1d):
    """torch.nn.BatchNorm1d over the features of all points in the batch."""

    def forward(self, input: SparseTensor, residual: Optional[SparseTensor] = None,
                relu: bool = False) -> SparseTensor:
        """The normalised input; blocks may pass ``residual`` (added after the norm) and ``relu``
        (applied last), which run in the norm's own pass on the CPU."""
        return batch_norm_act(self, input, residual, relu)


class _AllReduceSum(torch.autograd.Function):
    """Sum over processes; its gradient is again a sum over processes."""

    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        tensor = tensor.clone()
        dist.all_reduce(tensor, group=group)
        return tensor

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class SyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm whose training statistics are reduced over all processes of ``process_group``.

    Unlike torch.nn.SyncBatchNorm it runs on any device and backend (gloo on the CPU too).
    Outside training, or without an initialised process group of size > 1, it is BatchNorm.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1,
                 affine: bool = True, track_running_stats: bool = True, process_group=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_group = process_group

    def _check_input_dim(self, input):
        if input.dim() != 2:
            raise ValueError(f"expected [N, C] features, got {list(input.shape)}")

    def _world_size(self) -> int:
        if not (dist.is_available() and dist.is_initialized()):
            return 1
        return dist.get_world_size(self.process_group)

    def forward(self, input: SparseTensor, residual: Optional[SparseTensor] = None,
                relu: bool = False) -> SparseTensor:
        """As BatchNorm.forward, with statistics over all processes when training."""
        if not self.training or self._world_size() == 1:
            return batch_norm_act(self, input, residual, relu)
        out = self._synced_norm(input)
        if residual is not None:
            out = out + residual
        return out.replace_feats(torch.relu(out.F)) if relu else out

    def _synced_norm(self, input: SparseTensor) -> SparseTensor:
        _check_channels(self, input, self.num_features)
        feats = input.F
        x = feats.to(torch.promote_types(feats.dtype, torch.float32))
        count = torch.tensor([float(x.shape[0])], dtype=x.dtype, device=x.device)
        totals = _AllReduceSum.apply(torch.cat([x.sum(0), count]), self.process_group)
        n = totals[-1]
        mean = totals[:-1] / n
        centred = x - mean
        var = _AllReduceSum.apply(centred.square().sum(0), self.process_group) / n
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked += 1
                momentum = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                            else self.momentum)
                unbiased = var * (n / (n - 1).clamp(min=1))
                self.running_mean.lerp_(mean.to(self.running_mean.dtype), momentum)
                self.running_var.lerp_(unbiased.to(self.running_var.dtype), momentum)
        out = centred * torch.rsqrt(var + self.eps)
        if self.affine:
            out = out * self.weight + self.bias
        return input.replace_feats(out.to(feats.dtype))

    @classmethod
    def convert_sync_batchnorm(cls, module: nn.Module, process_group=None) -> nn.Module:
        """Returns ``module`` with every BatchNorm replaced by a SyncBatchNorm holding its state."""
        if isinstance(module, BatchNorm):
            sync = cls(module.num_features, module.eps, module.momentum, module.affine,
                       module.track_running_stats, process_group)
            # Reuse the very parameters and buffers, so optimizers built before keep working.
            for name, param in module.named_parameters(recurse=False):
                setattr(sync, name, param)
            for name, buffer in module.named_buffers(recurse=False):
                setattr(sync, name, buffer)
            sync.train(module.training)
            return sync
        for name, child in module.named_children():
            converted = cls.convert_sync_batchnorm(child, process_group)
            if converted is not child:
                setattr(module, name, converted)
        return module


class GroupNorm(nn.Module):
    """torch.nn.GroupNorm semantics per sample: each (sample, group) is normalised over the
    sample's points and the group's channels."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True):
        super().__init__()
        if num_groups < 1 or num_channels % num_groups:
            raise ValueError(f"num_channels ({num_channels}) must be divisible by num_groups ({num_groups})")
        self.num_groups, self.num_channels, self.eps, self.affine = num_groups, num_channels, eps, affine
        self.weight = nn.Parameter(torch.ones(num_channels)) if affine else None
        self.bias = nn.Parameter(torch.zeros(num_channels)) if affine else None

    def forward(self, input: SparseTensor) -> SparseTensor:
        _check_channels(self, input, self.num_channels)
        feats = sample_group_norm(input.F, input.C[:, 0], None, self.num_groups, self.weight, self.bias, self.eps)
        return input.replace_feats(feats)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"


class InstanceNorm(GroupNorm):
    """Per-sample, per-channel normalisation (torch.nn.InstanceNorm1d over each sample's points)."""

    def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = False):
        super().__init__(num_features, num_features, eps, affine)
