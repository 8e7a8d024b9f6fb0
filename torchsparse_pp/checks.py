"""Argument checks that turn bad user input into clear exceptions before any kernel runs."""
import math
from typing import Optional, Sequence

import torch

from . import backends
from .kmap.geometry import Triple, triple

BATCH_MAX = (1 << 15) - 1
SPATIAL_MIN = -(1 << 15)
SPATIAL_MAX = (1 << 15) - 1
COORD_RANGE_TEXT = f"batch in [0, {BATCH_MAX}], x/y/z in [{SPATIAL_MIN}, {SPATIAL_MAX}]"


def check_sparse_tensor(coords: torch.Tensor, feats: torch.Tensor, spatial_range: Optional[Triple]) -> None:
    """A SparseTensor's parts: every check of check_coords and check_feats, with the values read
    back in one host copy (the coordinates' bounds and the features' min / max together: one
    synchronisation on a GPU)."""
    _check_coords_form(coords)
    if coords.device.type == "meta" or torch.compiler.is_compiling():
        check_coords(coords, spatial_range)
        check_feats(feats, coords.shape[0])
        return
    _check_feats_form(feats, coords.shape[0])
    if feats.device.type == "meta":
        return check_coords(coords, spatial_range)
    check_same_device(feats, coords)
    coord_bounds = torch.stack(torch.aminmax(coords, dim=0)).to(torch.float64).flatten()
    feat_bounds = (torch.stack(torch.aminmax(feats)).to(torch.float64) if feats.numel()
                   else torch.zeros(2, dtype=torch.float64, device=feats.device))
    parts = [coord_bounds, feat_bounds]
    if backends.decision_device_type(coords.device) != "cpu":
        # The GPU's map builders find neighbours in a hash table that cannot report a repeated
        # coordinate without a host read of its own: the check rides on this read instead.
        parts.append(_repeated_rows(coords).to(torch.float64).view(1))
    values = torch.cat(parts).tolist()
    _check_coord_bounds([int(v) for v in values[:4]], [int(v) for v in values[4:8]], spatial_range)
    if not all(math.isfinite(v) for v in values[8:10]):
        raise ValueError("feats contain NaN or Inf values")
    if len(values) > 10 and values[10]:
        raise ValueError(f"coords hold {int(values[10])} repeated rows: the coordinates of a SparseTensor must be "
                         "unique (torchsparse_pp.utils.sparse_quantize removes duplicates)")


def _repeated_rows(coords: torch.Tensor) -> torch.Tensor:
    """How many rows repeat an earlier one (on the device; keys packed after an offset into the
    supported range, so any row the range check passes packs uniquely)."""
    low, place = torch.tensor([[0, SPATIAL_MIN, SPATIAL_MIN, SPATIAL_MIN], [1 << 48, 1 << 32, 1 << 16, 1]],
                              dtype=torch.int64, device=coords.device)
    keys = ((coords.to(torch.int64) - low) * place).sum(1)
    ordered = torch.sort(keys).values
    return (ordered[1:] == ordered[:-1]).sum()


def _check_coords_form(coords: torch.Tensor) -> None:
    if not isinstance(coords, torch.Tensor):
        raise TypeError(f"coords must be a torch.Tensor, got {type(coords).__name__}")
    if coords.dtype != torch.int32:
        hint = (" (quantize points first, e.g. torchsparse_pp.utils.sparse_quantize)"
                if coords.is_floating_point() else " (convert with .int() once values are in range)")
        raise TypeError(f"coords must be int32 (batch, x, y, z), got {coords.dtype}{hint}")
    if coords.dim() != 2 or coords.shape[1] != 4:
        raise ValueError(f"coords must have shape [N, 4] (batch, x, y, z), got {list(coords.shape)}")
    if coords.shape[0] == 0:
        raise ValueError("coords are empty: a SparseTensor needs at least one point")


def check_coords(coords: torch.Tensor, spatial_range: Optional[Triple] = None) -> None:
    _check_coords_form(coords)
    if coords.device.type == "meta":
        return
    if torch.compiler.is_compiling():
        # Traced (torch.compile / export): the range check runs inside the graph, with no host read.
        low, high = [0] + [SPATIAL_MIN] * 3, [BATCH_MAX] + [SPATIAL_MAX] * 3
        if spatial_range is not None:
            low, high = [0] * 4, [BATCH_MAX] + [r - 1 for r in spatial_range]
        inside = (coords >= torch.tensor(low, dtype=coords.dtype, device=coords.device)) & (
            coords <= torch.tensor(high, dtype=coords.dtype, device=coords.device))
        torch._assert_async(inside.all(),
                            f"coords outside the supported range ({COORD_RANGE_TEXT})"
                            + ("" if spatial_range is None else f" or spatial_range {tuple(spatial_range)}"))
        return
    lo, hi = torch.stack(torch.aminmax(coords, dim=0)).tolist()  # one pass (amin + amax took two), one read
    _check_coord_bounds(lo, hi, spatial_range)


def _check_coord_bounds(lo, hi, spatial_range: Optional[Triple]) -> None:
    if lo[0] < 0 or hi[0] > BATCH_MAX or min(lo[1:]) < SPATIAL_MIN or max(hi[1:]) > SPATIAL_MAX:
        raise ValueError(f"coords span batch [{lo[0]}, {hi[0]}], x [{lo[1]}, {hi[1]}], y [{lo[2]}, "
                         f"{hi[2]}], z [{lo[3]}, {hi[3]}]; the supported range is {COORD_RANGE_TEXT}")
    if spatial_range is not None:
        if min(lo[1:]) < 0 or any(h >= r for h, r in zip(hi[1:], spatial_range)):
            raise ValueError(f"coords span x [{lo[1]}, {hi[1]}], y [{lo[2]}, {hi[2]}], z [{lo[3]}, {hi[3]}], "
                             f"outside spatial_range {tuple(spatial_range)} (each axis must lie in [0, size))")


def _check_feats_form(feats: torch.Tensor, num_points: Optional[int]) -> None:
    if not isinstance(feats, torch.Tensor):
        raise TypeError(f"feats must be a torch.Tensor, got {type(feats).__name__}")
    if not feats.is_floating_point():
        raise TypeError(f"feats must be a floating-point tensor, got {feats.dtype}")
    if feats.dim() != 2:
        raise ValueError(f"feats must have shape [N, C], got {list(feats.shape)}"
                         + (" (use feats[:, None] for one channel)" if feats.dim() == 1 else ""))
    if num_points is not None and feats.shape[0] != num_points:
        raise ValueError(f"feats have {feats.shape[0]} rows but coords have {num_points}: "
                         "they must describe the same points")
    if feats.shape[1] == 0:
        raise ValueError("feats have zero channels")


def check_feats(feats: torch.Tensor, num_points: Optional[int] = None) -> None:
    _check_feats_form(feats, num_points)
    if feats.device.type == "meta":
        return
    if torch.compiler.is_compiling():
        torch._assert_async(torch.isfinite(feats).all(), "feats contain NaN or Inf values")
    elif not all_finite(feats):
        raise ValueError("feats contain NaN or Inf values")


def all_finite(values: torch.Tensor) -> bool:
    """Whether no value is NaN or +-Inf: one min/max pass (NaN propagates into both), about 10x
    faster on the CPU than isfinite(values).all(), which runs several passes and temporaries."""
    if values.numel() == 0:
        return True
    low, high = torch.aminmax(values)
    return bool(torch.isfinite(low) & torch.isfinite(high))


def check_same_device(feats: torch.Tensor, coords: torch.Tensor) -> None:
    if feats.device != coords.device:
        raise ValueError(f"feats are on {feats.device} but coords are on {coords.device}; "
                         "move both to one device")


def check_spatial_range(spatial_range: Optional[Sequence[int]]) -> Optional[Triple]:
    if spatial_range is None:
        return None
    return triple(spatial_range, "spatial_range", 1)
