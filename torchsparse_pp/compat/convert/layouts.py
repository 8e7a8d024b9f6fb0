"""Weight layouts of the peers and of torchsparse_pp, and the exact conversions between them.

torchsparse_pp: ``[K, C_in, C_out]``, offsets z-fastest (docs/semantics.md), 1x1x1 too.
torchsparse 2.1: ``[K, C_in, C_out]``, offsets x-fastest for odd kernel volumes; a 1x1x1
stride-1 kernel is ``[C_in, C_out]``.
spconv 2.x: ``[C_out, *k, C_in]`` over its own axis order; a kernel of volume 1 at stride 1
is applied as the stored memory read as ``[C_in, C_out]``, so that is what it means.
"""
from typing import Sequence, Tuple

import torch

from ..torchsparse.nn.functional.conv import offset_order

# spconv axis orders: position of our x, y, z among spconv's three spatial axes.
AXES = {"xyz": (0, 1, 2), "zyx": (2, 1, 0)}


def torchsparse_to_native(weight: torch.Tensor, kernel_size: Tuple[int, int, int]) -> torch.Tensor:
    if weight.dim() == 2:
        return weight.unsqueeze(0)
    return weight.index_select(0, offset_order(kernel_size))


def native_to_torchsparse(kernel: torch.Tensor, kernel_size, stride) -> torch.Tensor:
    if tuple(kernel_size) == (1, 1, 1) and tuple(stride) == (1, 1, 1):
        return kernel[0]
    order = offset_order(tuple(kernel_size))
    return kernel.index_select(0, torch.argsort(order))


def spconv_to_native(weight: torch.Tensor, axes: str, pointwise: bool) -> torch.Tensor:
    c_out, c_in = weight.shape[0], weight.shape[-1]
    if pointwise:
        return weight.reshape(1, c_in, c_out)
    ours = weight.permute(0, *[1 + a for a in AXES[axes]], 4)  # [C_out, x, y, z, C_in]
    return ours.permute(1, 2, 3, 4, 0).reshape(-1, c_in, c_out)


def native_to_spconv(kernel: torch.Tensor, kernel_size: Sequence[int], axes: str, pointwise: bool) -> torch.Tensor:
    c_in, c_out = kernel.shape[1], kernel.shape[2]
    if pointwise:
        return kernel.reshape(c_out, 1, 1, 1, c_in)
    xyz = kernel.reshape(*kernel_size, c_in, c_out).permute(4, 0, 1, 2, 3)  # [C_out, x, y, z, C_in]
    order = AXES[axes]
    return xyz.permute(0, *[1 + order.index(j) for j in range(3)], 4).contiguous()
