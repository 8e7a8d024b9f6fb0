"""torchsparse 2.1's devoxelization: ``calc_ti_weights`` and ``spdevoxelize``."""
import torch

from .....point.ops import gather_weighted


def calc_ti_weights(coords: torch.Tensor, idx_query: torch.Tensor, scale: float = 1) -> torch.Tensor:
    """Trilinear weights ``[N, 8]`` of points ``coords [N, 3]`` over the corners of their cell of
    edge ``scale`` (corner order z fastest, as ``get_kernel_offsets(2)``), zero where
    ``idx_query`` is -1, divided by their sum + 1e-8 (as in 2.1). No gradient."""
    with torch.no_grad():
        # 2.1 takes the cell corners in float32: float64 points keep float64 weights, half ones
        # get float32 weights.
        low = (torch.floor(coords / scale) * scale if scale != 1 else torch.floor(coords)).float()
        high = low + scale
        to_high, to_low = high - coords, coords - low  # per axis: weight of the low / high corner
        w = torch.stack([(to_low if bx else to_high)[:, 0] * (to_low if by else to_high)[:, 1]
                         * (to_low if bz else to_high)[:, 2]
                         for bx in (0, 1) for by in (0, 1) for bz in (0, 1)], 1)
        if scale != 1:
            w = w / scale ** 3
        w[idx_query == -1] = 0
        return w / (w.sum(1, keepdim=True) + 1e-8)


def spdevoxelize(feats: torch.Tensor, coords: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``out[i] = sum_k weights[i, k] * feats[coords[i, k]]`` over ``coords`` (row indices ``[N, 8]``,
    -1 for none), in ``feats``' dtype; differentiable in ``feats`` (2.1 gives ``weights`` no
    gradient)."""
    if coords.dim() != 2 or coords.shape[1] != 8 or weights.shape != coords.shape:
        raise ValueError(f"spdevoxelize takes [N, 8] corner indices and weights, got {tuple(coords.shape)} and "
                         f"{tuple(weights.shape)}")
    if coords.numel() and int(coords.max()) >= feats.shape[0]:
        raise IndexError(f"corner index {int(coords.max())} is not a row of the {feats.shape[0]} voxel features")
    return gather_weighted(feats, coords.long(), weights.detach())
