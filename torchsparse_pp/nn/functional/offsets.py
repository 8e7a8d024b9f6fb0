"""Kernel offsets in the library's one order."""
import torch

from ...kmap.geometry import IntOr3, triple


def kernel_offsets(kernel_size: IntOr3, dilation: IntOr3 = 1, device=None) -> torch.Tensor:
    """``[K, 3]`` int32 offsets ``delta * d`` with ``delta = (i, j, l)`` in ``[0, k)^3``.

    Row ``(i * k_y + j) * k_z + l`` (z fastest) holds offset ``delta * d``; output q of a conv
    reads input ``q * s - pad + delta * d`` through weight row ``kernel[(i * k_y + j) * k_z + l]``.
    """
    kx, ky, kz = triple(kernel_size, "kernel_size", 1)
    dx, dy, dz = triple(dilation, "dilation", 1)
    grid = torch.stack(torch.meshgrid(torch.arange(kx) * dx, torch.arange(ky) * dy,
                                      torch.arange(kz) * dz, indexing="ij"), dim=-1)
    return grid.reshape(-1, 3).to(dtype=torch.int32, device=device)
