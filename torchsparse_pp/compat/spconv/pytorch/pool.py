"""spconv's pooling modules over torchsparse_pp's pooling (same output sets as strided convs).

Max pooling starts from zero as spconv's CPU kernel does, so an output whose present inputs are
all negative is 0 (not their maximum). Average pooling divides by the number of present inputs
(spconv runs it on GPUs only; here it runs on every device, rows in spconv's CPU conv order).
"""
from typing import Optional

import numpy as np
import torch

from .... import ops
from ..core import ConvAlgo
from . import run
from .algo import as_algo, default_algo
from .conv import MAX_VOXELS_BUFFER
from .modules import SparseModule
from .tensor import IndiceData, SparseConvTensor, expand_nd


class _SparsePool(SparseModule):
    reduce = "max"

    def __init__(self, ndim: int, kernel_size=3, stride=None, padding=0, dilation=1,
                 indice_key: Optional[str] = None, algo: Optional[ConvAlgo] = None,
                 record_voxel_count: bool = False, name=None):
        super().__init__(name=name)
        if not 1 <= ndim <= 3:
            raise NotImplementedError(f"{ndim}-D pooling: the spconv adapter supports 1-, 2- and 3-D")
        self.ndim = ndim
        self.kernel_size = expand_nd(ndim, kernel_size, "kernel_size")
        self.stride = list(self.kernel_size) if stride is None else expand_nd(ndim, stride, "stride")
        self.padding = expand_nd(ndim, padding, "padding")
        self.dilation = expand_nd(ndim, dilation, "dilation")
        self.indice_key = indice_key
        kv = int(np.prod(self.kernel_size))
        if self.reduce == "avg":
            if algo is not None and as_algo(algo) != ConvAlgo.MaskImplicitGemm:
                raise ValueError("spconv's average pooling has only the MaskImplicitGemm algo")
            self.algo = ConvAlgo.MaskImplicitGemm
        else:
            self.algo = as_algo(algo) if algo is not None else default_algo(kv, True)
        self.record_voxel_count = record_voxel_count
        if record_voxel_count:
            self.register_buffer(MAX_VOXELS_BUFFER, torch.zeros(1, dtype=torch.int32))

    def get_max_num_voxels(self) -> Optional[torch.Tensor]:
        return getattr(self, MAX_VOXELS_BUFFER, None)

    def _pool(self, inp, kmap, transposed):
        """Pooled features over the layer's map (a strided map of any stride, as in spconv)."""
        pairs = kmap.pairs
        if self.reduce == "max":
            feats, _ = ops.pool_pairs_max(inp.F, pairs.in_idx, pairs.out_idx, kmap.num_out)
            return feats.clamp_min(0)
        return ops.pool_pairs_mean(inp.F, pairs.in_idx, pairs.out_idx, kmap.num_out)

    def forward(self, input: SparseConvTensor) -> SparseConvTensor:
        if not isinstance(input, SparseConvTensor):
            raise TypeError(f"{type(self).__name__} expects a SparseConvTensor, got {type(input).__name__}")
        if input.ndim != self.ndim:
            raise ValueError(f"{type(self).__name__} is {self.ndim}-D but the input indices are {input.ndim}-D")
        input.check_rows(type(self).__name__)
        indice_dict = dict(input.indice_dict)
        if self.indice_key is not None and self.indice_key in indice_dict:
            raise ValueError(f"indice key {self.indice_key!r} exists")
        geometry = run.geometry3(self.kernel_size, self.stride, self.dilation, self.padding)
        feats, indices, kmap, order = run.strided(input, geometry, self._pool)
        out_shape = run.conv_output_shape(input.spatial_shape, self.kernel_size, self.stride, self.padding,
                                          self.dilation)
        if self.indice_key is not None:
            indice_dict[self.indice_key] = IndiceData(
                out_indices=indices, indices=input.indices, spatial_shape=input.spatial_shape,
                out_spatial_shape=out_shape, is_subm=False, algo=self.algo, ksize=self.kernel_size,
                stride=self.stride, dilation=self.dilation, padding=self.padding, kmap=kmap, state=input._state,
                order=order)
        voxels = self.get_max_num_voxels()
        if voxels is not None:
            voxels.fill_(max(int(voxels.item()), indices.shape[0]))
        return SparseConvTensor._derived(input, feats, indices, out_shape, indice_dict)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, algo={self.algo}"


class SparseMaxPool(_SparsePool):
    reduce = "max"


class SparseAvgPool(_SparsePool):
    reduce = "avg"


def _preset(base, ndim: int, name: str):
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, indice_key=None, algo=None,
                 record_voxel_count=False, name=None):
        base.__init__(self, ndim, kernel_size, stride, padding, dilation, indice_key, algo, record_voxel_count, name)
    return type(name, (base,), {"__init__": __init__})


SparseMaxPool1d = _preset(SparseMaxPool, 1, "SparseMaxPool1d")
SparseMaxPool2d = _preset(SparseMaxPool, 2, "SparseMaxPool2d")
SparseMaxPool3d = _preset(SparseMaxPool, 3, "SparseMaxPool3d")
SparseAvgPool1d = _preset(SparseAvgPool, 1, "SparseAvgPool1d")
SparseAvgPool2d = _preset(SparseAvgPool, 2, "SparseAvgPool2d")
SparseAvgPool3d = _preset(SparseAvgPool, 3, "SparseAvgPool3d")


class SparseGlobalMaxPool(SparseModule):
    """Per-sample channel maximum: ``[batch_size, C]``."""

    def forward(self, input: SparseConvTensor) -> torch.Tensor:
        batch = input.indices[:, 0].long()
        return torch.stack([input.features[batch == b].max(0)[0] for b in range(input.batch_size)])


class SparseGlobalAvgPool(SparseModule):
    def __init__(self, name=None):
        raise NotImplementedError("spconv 2.3.8's SparseGlobalAvgPool returns one number per sample (the mean "
                                  "of channel 0 only), which is not reproduced; use torchsparse_pp.nn."
                                  "GlobalAvgPool, or x.features averaged per batch index")
