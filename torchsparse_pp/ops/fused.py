"""Eval-time fused convolution: torch.ops.torchsparse_pp.fetch_on_demand_forward_fused (CPU)."""
from typing import Optional

import torch

from .gather_scatter import forward_fake

_ops = torch.ops.torchsparse_pp


def fetch_on_demand_forward_fused(feats: torch.Tensor, weight: torch.Tensor, src_idx: torch.Tensor,
                                  dst_idx: torch.Tensor, offsets: torch.Tensor, identity: torch.Tensor, num_dst: int,
                                  bias: Optional[torch.Tensor], residual: Optional[torch.Tensor],
                                  relu: bool) -> torch.Tensor:
    """``act(conv(feats) + bias + residual)`` by fetch_on_demand, the epilogue applied to each
    block of output rows while it is in cache. Pairs sorted by destination; no autograd."""
    return _ops.fetch_on_demand_forward_fused(feats, weight, src_idx, dst_idx, offsets, identity, num_dst, bias,
                                              residual, relu)


def cpu_bf16_dot() -> bool:
    """Whether the CPU kernels multiply bfloat16 tiles with the CPU's bf16 dot-product
    instructions (AVX512-BF16); otherwise they convert to float32 tiles."""
    return _ops.cpu_bf16_dot()


def cpu_register_kernels() -> bool:
    """Whether fetch_on_demand and implicit GEMM run their register kernels on this CPU
    (AVX-512 or AVX2 + FMA; torchsparse_pp.backends.cpu_kernels); otherwise they multiply
    float tiles."""
    return _ops.cpu_register_kernels()


def cpu_register_isa() -> str:
    """The instruction set of the CPU register kernels: "avx512", "avx2" or "none"."""
    return ("none", "avx2", "avx512")[_ops.cpu_register_isa()]


def cpu_set_register_isa(isa: str) -> None:
    """Chooses the CPU register kernels' instruction set (see torchsparse_pp.backends.cpu_kernels)."""
    _ops.cpu_set_register_isa(isa)


@torch.library.register_fake("torchsparse_pp::fetch_on_demand_forward_fused")
def _fused_fake(feats, weight, src_idx, dst_idx, offsets, identity, num_dst, bias, residual, relu):
    return forward_fake(feats, weight, num_dst, False)
