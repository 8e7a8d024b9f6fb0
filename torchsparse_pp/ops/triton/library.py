"""The Triton kernels' entry points as torch.library custom ops (``torchsparse_pp::triton_*``),
with fake kernels, so that torch.compile / torch.export put each launch in the graph as one
opaque node instead of tracing into Python that launches kernels.

Importing this module does not import triton: an op imports its kernel module (``load``) when it
first runs, after ``runtime.require`` has checked that triton can run on the tensors' device.
"""
from typing import Optional

import torch

from . import load, runtime

_NS = "torchsparse_pp"


def _module(name: str, device: torch.device):
    runtime.require(device)
    return load(name)


def _forward_fake(feats, weight, num_dst, transpose_weight):
    return feats.new_empty(num_dst, weight.shape[1] if transpose_weight else weight.shape[2])


def _wgrad_fake(feats, grad, volume):
    return feats.new_empty(volume, feats.shape[1], grad.shape[1])


@torch.library.custom_op(f"{_NS}::triton_fetch_on_demand_forward", mutates_args=())
def fetch_on_demand_forward(feats: torch.Tensor, weight: torch.Tensor, src_idx: torch.Tensor, dst_idx: torch.Tensor,
                            offsets: torch.Tensor, num_dst: int, transpose_weight: bool, tile: Optional[str],
                            allow_tf32: bool) -> torch.Tensor:
    """ops/triton/fetch_on_demand.py forward: one fused launch, atomic float adds."""
    return _module("fetch_on_demand", feats.device).forward(feats, weight, src_idx, dst_idx, offsets, num_dst,
                                                            transpose_weight, tile, allow_tf32)


@fetch_on_demand_forward.register_fake
def _(feats, weight, src_idx, dst_idx, offsets, num_dst, transpose_weight, tile, allow_tf32):
    return _forward_fake(feats, weight, num_dst, transpose_weight)


@torch.library.custom_op(f"{_NS}::triton_fetch_on_demand_forward_owned", mutates_args=())
def fetch_on_demand_forward_owned(feats: torch.Tensor, weight: torch.Tensor, table: torch.Tensor, num_dst: int,
                                  transpose_weight: bool, tile: Optional[str], allow_tf32: bool) -> torch.Tensor:
    """The deterministic forward over the output-stationary table (each row owned by one program)."""
    return _module("fetch_on_demand", feats.device).forward_owned(feats, weight, table, num_dst, transpose_weight,
                                                                  tile, allow_tf32)


@fetch_on_demand_forward_owned.register_fake
def _(feats, weight, table, num_dst, transpose_weight, tile, allow_tf32):
    return _forward_fake(feats, weight, num_dst, transpose_weight)


@torch.library.custom_op(f"{_NS}::triton_fetch_on_demand_wgrad", mutates_args=())
def fetch_on_demand_wgrad(feats: torch.Tensor, grad: torch.Tensor, src_idx: torch.Tensor, dst_idx: torch.Tensor,
                          offsets: torch.Tensor, tile: Optional[str], allow_tf32: bool,
                          deterministic: bool) -> torch.Tensor:
    return _module("fetch_on_demand", feats.device).wgrad(feats, grad, src_idx, dst_idx, offsets, tile, allow_tf32,
                                                          deterministic)


@fetch_on_demand_wgrad.register_fake
def _(feats, grad, src_idx, dst_idx, offsets, tile, allow_tf32, deterministic):
    return _wgrad_fake(feats, grad, offsets.shape[0] - 1)


@torch.library.custom_op(f"{_NS}::triton_implicit_gemm_forward", mutates_args=())
def implicit_gemm_forward(feats: torch.Tensor, weight: torch.Tensor, table: torch.Tensor, num_dst: int,
                          transpose_weight: bool, bounds: torch.Tensor, order: torch.Tensor, tile_masks: torch.Tensor,
                          tile_rows: int, tile: Optional[str], allow_tf32: bool) -> torch.Tensor:
    return _module("implicit_gemm", feats.device).forward(feats, weight, table, num_dst, transpose_weight, bounds,
                                                          order, tile_masks, tile_rows, tile, allow_tf32)


@implicit_gemm_forward.register_fake
def _(feats, weight, table, num_dst, transpose_weight, bounds, order, tile_masks, tile_rows, tile, allow_tf32):
    return _forward_fake(feats, weight, num_dst, transpose_weight)


@torch.library.custom_op(f"{_NS}::triton_implicit_gemm_wgrad", mutates_args=())
def implicit_gemm_wgrad(feats: torch.Tensor, grad: torch.Tensor, table: torch.Tensor, bounds: torch.Tensor,
                        order: torch.Tensor, tile_masks: torch.Tensor, tile_rows: int, tile: Optional[str],
                        allow_tf32: bool, deterministic: bool) -> torch.Tensor:
    return _module("implicit_gemm", feats.device).wgrad(feats, grad, table, bounds, order, tile_masks, tile_rows, tile,
                                                        allow_tf32, deterministic)


@implicit_gemm_wgrad.register_fake
def _(feats, grad, table, bounds, order, tile_masks, tile_rows, tile, allow_tf32, deterministic):
    return _wgrad_fake(feats, grad, table.shape[1])


@torch.library.custom_op(f"{_NS}::triton_gather_scatter_forward", mutates_args=())
def gather_scatter_forward(feats: torch.Tensor, weight: torch.Tensor, src_idx: torch.Tensor, dst_idx: torch.Tensor,
                           offsets: torch.Tensor, identity: torch.Tensor, num_dst: int, transpose_weight: bool,
                           epsilon: float, mm_thresh: int) -> torch.Tensor:
    """Triton gathers and scatter-adds around torch GEMMs; the loop over offsets runs on the host
    (host ``offsets`` / ``identity`` are read for free, device ones once)."""
    return _module("gather_scatter", feats.device).forward(feats, weight, src_idx, dst_idx, offsets, identity, num_dst,
                                                           transpose_weight, epsilon, mm_thresh)


@gather_scatter_forward.register_fake
def _(feats, weight, src_idx, dst_idx, offsets, identity, num_dst, transpose_weight, epsilon, mm_thresh):
    return _forward_fake(feats, weight, num_dst, transpose_weight)


@torch.library.custom_op(f"{_NS}::triton_gather_scatter_wgrad", mutates_args=())
def gather_scatter_wgrad(feats: torch.Tensor, grad: torch.Tensor, src_idx: torch.Tensor, dst_idx: torch.Tensor,
                         offsets: torch.Tensor, identity: torch.Tensor) -> torch.Tensor:
    return _module("gather_scatter", feats.device).wgrad(feats, grad, src_idx, dst_idx, offsets, identity)


@gather_scatter_wgrad.register_fake
def _(feats, grad, src_idx, dst_idx, offsets, identity):
    return _wgrad_fake(feats, grad, identity.shape[0])
