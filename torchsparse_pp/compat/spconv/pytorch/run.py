"""The four ways a spconv layer runs on the library: submanifold, strided (conv or pool, any
stride, outputs in spconv's row order), inverse (through the strided layer's ``indice_key``) and
transposed (generative). Submanifold and transposed layers take a function that applies the
library op to a library SparseTensor; strided and inverse ones a function that computes features
over a kernel map (spconv's regular stride-1 conv is a strided map of stride 1, which the
library's conv3d, whose stride 1 is submanifold, would not pick)."""
from typing import Callable, List, Optional, Tuple

import torch

from ....kmap import ConvGeometry, KernelMap, generative_map, strided_map
from ....tensor import SparseTensor
from .order import generative_order, strided_order
from .tensor import IndiceData, SparseConvTensor, pad3

LibraryOp = Callable[[SparseTensor], SparseTensor]
# (input, map, transposed) -> features on the map's outputs (on its inputs when transposed)
MapOp = Callable[[SparseTensor, KernelMap, bool], torch.Tensor]


def geometry3(ksize, stride, dilation, padding) -> ConvGeometry:
    return ConvGeometry.make(pad3(ksize, 1), pad3(stride, 1), pad3(dilation, 1), pad3(padding, 0))


def conv_output_shape(shape: List[int], ksize, stride, padding, dilation) -> List[int]:
    return [(n + 2 * p - d * (k - 1) - 1) // s + 1 for n, k, s, p, d in zip(shape, ksize, stride, padding, dilation)]


def deconv_output_shape(shape: List[int], ksize, stride, padding) -> List[int]:
    return [(n - 1) * s - 2 * p + k for n, k, s, p in zip(shape, ksize, stride, padding)]


def submanifold(x: SparseConvTensor, op: LibraryOp, reuse: Optional[IndiceData]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Features on the input indices (or, with a reused key, on that key's indices)."""
    if reuse is None:
        return op(x.library_tensor()).F, x.indices
    out = op(x.library_tensor(indices=reuse.indices, state=reuse.state))
    return out.F, reuse.out_indices


def strided(x: SparseConvTensor, geometry: ConvGeometry, op: MapOp):
    """Features and indices of a strided layer in spconv's order, and the map's record."""
    inp = x.library_tensor()
    kmap = strided_map(inp.cache, inp.C, geometry, "spconv", inp.spatial_range)
    order = strided_order(kmap.out_in, kmap.num_out, kmap.num_in)
    indices = x._state.indices_of(kmap.out_coords[order], x.ndim)
    return op(inp, kmap, False)[order], indices, kmap, order


def inverse(x: SparseConvTensor, datas: IndiceData, op: MapOp):
    """The exact transpose of the layer that recorded ``datas``, back on its input indices: a
    strided layer's map run backwards, a transposed layer's (generative, fine -> coarse) forwards."""
    kmap = datas.kmap
    backwards = kmap.mode == "spconv"
    # spconv row j holds the layer's output order[j]: the map's outputs, or a generative map's inputs.
    feats = x.features.index_select(0, torch.argsort(datas.order))
    if backwards:
        source = SparseTensor._derive(feats, kmap.out_coords, kmap.geometry.stride, kmap.out_range, datas.state.cache)
    else:
        source = SparseTensor._derive(feats, kmap.in_coords, (1, 1, 1), kmap.in_range, datas.state.cache)
    return op(source, kmap, backwards), datas.indices


def transposed(x: SparseConvTensor, geometry: ConvGeometry, op: LibraryOp):
    """A generative transposed conv's features and indices in spconv's order, and its map."""
    inp = x.library_tensor(stride=geometry.stride)
    out = op(inp)
    kmap = generative_map(inp.cache, inp.C, geometry, inp.spatial_range)
    order = generative_order(kmap.out_in, kmap.num_out, kmap.num_in)
    indices = x._state.indices_of(kmap.in_coords[order], x.ndim)
    return out.F[order], indices, kmap, order

