"""Operations on several SparseTensors."""
from typing import Sequence

import torch

from .tensor import SparseTensor, require_same_coords


def cat(inputs: Sequence[SparseTensor]) -> SparseTensor:
    """Joins the channels of tensors that share coordinates (same points, same order)."""
    inputs = list(inputs)
    if not inputs or not all(isinstance(x, SparseTensor) for x in inputs):
        raise TypeError("cat expects a non-empty sequence of SparseTensors")
    for other in inputs[1:]:
        require_same_coords(inputs[0], other, "cat")
    return inputs[0].replace_feats(torch.cat([x.F for x in inputs], dim=1))
