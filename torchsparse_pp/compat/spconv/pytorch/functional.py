"""spconv.pytorch.functional helpers that model code calls directly."""
import torch

from .tensor import SparseConvTensor


def sparse_add(*tens: SparseConvTensor) -> SparseConvTensor:
    """Sum of sparse tensors on the union of their indices, rows sorted by (batch, spatial...)
    as spconv's coalesced result is. The indice_dict of the largest input is kept when the union
    adds no site to it."""
    first = tens[0]
    for t in tens:
        if (t.spatial_shape != first.spatial_shape or t.batch_size != first.batch_size
                or t.features.shape[1] != first.features.shape[1]):
            raise ValueError("sparse_add needs equal spatial_shape, batch_size and channel count")
    indices = torch.cat([t.indices for t in tens])
    union, rows = torch.unique(indices, dim=0, return_inverse=True)
    feats = torch.cat([t.features for t in tens])
    summed = feats.new_zeros(union.shape[0], feats.shape[1]).index_add(0, rows, feats)
    out = SparseConvTensor(summed, union.int(), first.spatial_shape, first.batch_size)
    largest = max(tens, key=lambda t: t.indices.shape[0])
    if union.shape[0] == largest.indices.shape[0]:
        out.indice_dict = largest.indice_dict
    return out
