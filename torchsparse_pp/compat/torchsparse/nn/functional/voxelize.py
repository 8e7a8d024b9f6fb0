"""torchsparse 2.1's voxelization helpers: ``spvoxelize`` (mean per voxel) and ``spcount``."""
import torch


def _rows(coords: torch.Tensor) -> torch.Tensor:
    if not isinstance(coords, torch.Tensor) or coords.is_floating_point() or coords.dtype == torch.bool:
        raise TypeError(f"row indices must be an integer tensor, got {getattr(coords, 'dtype', type(coords).__name__)}")
    return coords.long().view(-1)


def spcount(coords: torch.Tensor, num: int) -> torch.Tensor:
    """int32 ``[num]``: how many entries of ``coords`` (int32 row indices, -1 for none) name each
    row. An index >= ``num`` raises (2.1's kernels would count out of bounds)."""
    if not isinstance(coords, torch.Tensor) or coords.dtype != torch.int32:
        raise TypeError(f"spcount takes int32 row indices, got {getattr(coords, 'dtype', type(coords).__name__)}")
    idx, num = _rows(coords), int(num)
    if idx.numel() and int(idx.max()) >= num:
        raise IndexError(f"spcount: row index {int(idx.max())} is not below num={num}")
    return torch.bincount(idx[idx >= 0], minlength=num).int()


def spvoxelize(feats: torch.Tensor, coords: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``out[r] = sum of feats[i] / counts[r]`` over the i with ``coords[i] == r``; ``len(counts)``
    rows, zero where ``counts`` is 0. Entries outside ``[0, len(counts))`` (-1: no voxel) are
    skipped, as 2.1's GPU kernel skips them. Differentiable in ``feats``."""
    idx = _rows(coords)
    keep = (idx >= 0) & (idx < counts.shape[0])
    total = feats.new_zeros(counts.shape[0], feats.shape[1]).index_add(0, idx[keep], feats[keep])
    count = counts.to(feats.dtype).unsqueeze(1)
    return (total / count.clamp(min=1)).masked_fill(count == 0, 0)
