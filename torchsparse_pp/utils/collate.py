"""Batching of SparseTensors and of dataset samples that contain them."""
from typing import Any, Dict, List, Sequence

import numpy as np
import torch

from ..tensor import SparseTensor


def sparse_collate(inputs: Sequence[SparseTensor]) -> SparseTensor:
    """One batched SparseTensor: sample i gets batch index i (inputs must use batch 0)."""
    inputs = list(inputs)
    if not inputs or not all(isinstance(x, SparseTensor) for x in inputs):
        raise TypeError("sparse_collate expects a non-empty sequence of SparseTensors")
    first = inputs[0]
    for i, x in enumerate(inputs):
        if x.num_channels != first.num_channels or x.dtype != first.dtype or x.device != first.device:
            raise ValueError(f"sample {i} has {x.num_channels} channels ({x.dtype}, {x.device}) but sample 0 "
                             f"has {first.num_channels} ({first.dtype}, {first.device})")
        if x.s != first.s or x.spatial_range != first.spatial_range:
            raise ValueError(f"sample {i} has stride {x.s} / spatial_range {x.spatial_range}, sample 0 has "
                             f"{first.s} / {first.spatial_range}")
        if bool((x.C[:, 0] != 0).any()):
            raise ValueError(f"sample {i} already has batch indices other than 0; collate single samples")
    coords = torch.cat([x.C for x in inputs])
    sizes = torch.tensor([x.num_points for x in inputs], device=coords.device)
    coords[:, 0] = torch.repeat_interleave(torch.arange(len(inputs), device=coords.device, dtype=torch.int32),
                                           sizes)
    return SparseTensor(torch.cat([x.F for x in inputs]), coords, first.s, first.spatial_range)


def sparse_collate_fn(samples: List[Dict[str, Any]]) -> Dict[str, Any]:
    """DataLoader collate_fn for dict samples: SparseTensors are batched with sparse_collate,
    tensors and arrays of equal shape are stacked, other values are gathered into lists."""
    if not samples or not all(isinstance(s, dict) for s in samples):
        raise TypeError("sparse_collate_fn expects a non-empty list of dicts")
    keys = samples[0].keys()
    for i, s in enumerate(samples):
        if s.keys() != keys:
            raise ValueError(f"sample {i} has keys {sorted(s)}, sample 0 has {sorted(keys)}")
    batch: Dict[str, Any] = {}
    for key in keys:
        values = [s[key] for s in samples]
        if isinstance(values[0], SparseTensor):
            batch[key] = sparse_collate(values)
        elif isinstance(values[0], dict):
            batch[key] = sparse_collate_fn(values)
        elif isinstance(values[0], (torch.Tensor, np.ndarray)) and len({tuple(v.shape) for v in values}) == 1:
            batch[key] = torch.stack([torch.as_tensor(v) for v in values])
        else:
            batch[key] = values
    return batch
