"""torchsparse 2.1's voxelization helpers: ``spvoxelize`` (mean per voxel) and ``spcount``."""
import torch


def spcount(coords: torch.Tensor, num: int) -> torch.Tensor:
    """int32 ``[num]``: how many entries of ``coords`` (row indices, -1 for none) name each row."""
    idx = coords.long().view(-1)
    return torch.bincount(idx[idx >= 0], minlength=int(num)).int()


def spvoxelize(feats: torch.Tensor, coords: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``out[r] = sum of feats[i] / counts[r]`` over the i with ``coords[i] == r``; ``len(counts)``
    rows, zero where ``counts`` is 0. Differentiable in ``feats``."""
    idx = coords.long().view(-1)
    keep = idx >= 0
    total = feats.new_zeros(counts.shape[0], feats.shape[1]).index_add(0, idx[keep], feats[keep])
    return total / counts.to(feats.dtype).clamp(min=1).unsqueeze(1)
