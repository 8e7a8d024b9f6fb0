"""torchsparse 2.1's collation: per-sample SparseTensors with ``[N, 3]`` coordinates become one
batch with ``(batch, x, y, z)`` coordinates."""
from typing import Any, List

import numpy as np
import torch

from ..tensor import SparseTensor


def sparse_collate(inputs: List[SparseTensor]) -> SparseTensor:
    coords, feats = [], []
    stride = inputs[0].stride
    for k, x in enumerate(inputs):
        c = torch.as_tensor(x.coords) if isinstance(x.coords, np.ndarray) else x.coords
        f = torch.as_tensor(x.feats) if isinstance(x.feats, np.ndarray) else x.feats
        if not isinstance(c, torch.Tensor) or not isinstance(f, torch.Tensor):
            raise TypeError(f"sample {k}: coords and feats must be tensors or arrays")
        if x.stride != stride:
            raise ValueError(f"sample {k} has stride {x.stride}, sample 0 has {stride}")
        if c.dim() != 2 or c.shape[1] != 3:
            raise ValueError(f"sample {k}: sparse_collate adds the batch column to per-sample [N, 3] coords, "
                             f"got {tuple(c.shape)}")
        batch = torch.full((c.shape[0], 1), k, dtype=torch.int32, device=c.device)
        coords.append(torch.cat([batch, c.int()], 1))
        feats.append(f)
    return SparseTensor(torch.cat(feats), torch.cat(coords), stride)


def sparse_collate_fn(inputs: List[Any]) -> Any:
    """collate_fn for dict samples: SparseTensors collated, arrays and tensors stacked, dicts
    recursively, anything else gathered into lists."""
    if not isinstance(inputs[0], dict):
        return inputs
    output = {}
    for name in inputs[0]:
        values = [sample[name] for sample in inputs]
        if isinstance(values[0], dict):
            output[name] = sparse_collate_fn(values)
        elif isinstance(values[0], np.ndarray):
            output[name] = torch.stack([torch.as_tensor(v) for v in values])
        elif isinstance(values[0], torch.Tensor):
            output[name] = torch.stack(values)
        elif isinstance(values[0], SparseTensor):
            output[name] = sparse_collate(values)
        else:
            output[name] = values
    return output
