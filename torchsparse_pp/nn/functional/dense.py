"""Conversions between SparseTensor and dense ``[B, C, X, Y, Z]`` tensors (differentiable)."""
import math
from typing import Optional, Sequence

import torch

from ...kmap.geometry import IntOr3, triple
from ...kmap.torch_ops import _check_memory
from ...tensor import SparseTensor


def to_dense(input: SparseTensor, spatial_range: Optional[Sequence[int]] = None,
             batch_size: Optional[int] = None) -> torch.Tensor:
    """Scatters features into a zero ``[B, C, X, Y, Z]`` grid at this tensor's stride.

    The grid size is ``spatial_range``, else the tensor's own, else ``max(coord) + 1`` per axis.
    Coordinates must be non-negative and inside the grid.
    """
    coords = input.C.long()
    if torch.compiler.is_compiling():
        return _to_dense_traced(input, coords, spatial_range, batch_size)
    lo = coords[:, 1:].amin(0)
    if bool((lo < 0).any()):
        raise ValueError(f"dense() needs non-negative coordinates, got minimum {lo.tolist()}; "
                         "shift the coordinates or crop first")
    hi = coords.amax(0).tolist()
    size = spatial_range if spatial_range is not None else input.spatial_range
    size = triple(size, "spatial_range", 1) if size is not None else tuple(h + 1 for h in hi[1:])
    if any(h >= n for h, n in zip(hi[1:], size)):
        raise ValueError(f"coordinates reach {hi[1:]}, outside the dense grid {tuple(size)}")
    batch = hi[0] + 1 if batch_size is None else int(batch_size)
    if hi[0] >= batch:
        raise ValueError(f"batch index {hi[0]} does not fit batch_size {batch}")
    grid = [batch, input.num_channels, *size]
    # The zero grid, its filled copy (index_put) and the permuted result.
    _check_memory(3 * math.prod(grid) * input.F.element_size(), f"dense(): the [B, C, X, Y, Z] grid {grid} of "
                  f"{str(input.F.dtype).replace('torch.', '')} (three copies while it is filled and permuted)",
                  input.F.device)
    out = input.F.new_zeros(batch, *size, input.num_channels)
    out = out.index_put((coords[:, 0], coords[:, 1], coords[:, 2], coords[:, 3]), input.F)
    return out.permute(0, 4, 1, 2, 3).contiguous()


def _to_dense_traced(input: SparseTensor, coords: torch.Tensor, spatial_range, batch_size) -> torch.Tensor:
    """to_dense inside a torch.compile / export graph: the grid size and the batch size must be
    known (the tensor's or the arguments'), since reading them from the coordinates would be a
    host sync; the bounds are checked in the graph."""
    size = spatial_range if spatial_range is not None else input.spatial_range
    if size is None or batch_size is None:
        raise ValueError("to_dense in a compiled or exported graph needs the grid and the batch size (a tensor "
                         "with spatial_range, or spatial_range= and batch_size=): reading them from the "
                         "coordinates would synchronise the host")
    size = triple(size, "spatial_range", 1)
    limit = torch.tensor([int(batch_size), *size], device=coords.device)
    torch._assert_async(((coords >= 0) & (coords < limit)).all(),
                        f"to_dense: coordinates outside the grid {tuple(size)} or batch_size {int(batch_size)}")
    out = input.F.new_zeros(int(batch_size), *size, input.num_channels)
    out = out.index_put((coords[:, 0], coords[:, 1], coords[:, 2], coords[:, 3]), input.F)
    return out.permute(0, 4, 1, 2, 3).contiguous()


def from_dense(dense: torch.Tensor, stride: IntOr3 = 1) -> SparseTensor:
    """The sites of ``dense [B, C, X, Y, Z]`` where any channel is non-zero, as a SparseTensor
    with ``spatial_range = (X, Y, Z)``; gradients flow back to the dense values."""
    if not isinstance(dense, torch.Tensor) or dense.dim() != 5:
        raise ValueError("from_dense expects a [B, C, X, Y, Z] tensor, got "
                         f"{list(dense.shape) if isinstance(dense, torch.Tensor) else type(dense).__name__}")
    channels_last = dense.permute(0, 2, 3, 4, 1)
    occupied = (channels_last != 0).any(-1)
    coords = occupied.nonzero().int()
    if coords.shape[0] == 0:
        raise ValueError("from_dense got a tensor with no non-zero site")
    feats = channels_last[occupied]
    return SparseTensor(feats, coords, stride=triple(stride, "stride", 1), spatial_range=tuple(dense.shape[2:]))
