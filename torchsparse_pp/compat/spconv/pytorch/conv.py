"""spconv's convolution modules over torchsparse_pp's conv3d.

Parameters keep spconv's names and layout: ``weight [C_out, *kernel, C_in]`` and ``bias``, so
spconv checkpoints load with ``strict=True``. Outputs keep spconv's row order (its CPU order).
Like spconv, a 1x1 conv (kernel volume 1, stride 1) multiplies by ``weight`` read as
``[C_in, C_out]`` (a reshape of the stored ``[C_out, 1.., C_in]``), which is what spconv-trained
1x1 weights expect.
"""
import math
from typing import Optional

import numpy as np
import torch
from torch import nn

from ....nn import functional as F
from ....nn.functional.conv import conv3d_over_map
from ..core import ConvAlgo
from . import run
from .algo import as_algo, config_of, default_algo
from .modules import SparseModule
from .tensor import IndiceData, SparseConvTensor, expand_nd

MAX_VOXELS_BUFFER = "max_num_voxels_during_training"


def _library_kernel(weight: torch.Tensor, ndim: int) -> torch.Tensor:
    """[C_out, *k, C_in] -> [prod(k), C_in, C_out], the last axis fastest (as our offsets are)."""
    c_out, c_in = weight.shape[0], weight.shape[-1]
    return weight.permute(*range(1, ndim + 1), ndim + 1, 0).reshape(-1, c_in, c_out)


def _reject(condition: bool, message: str, error=NotImplementedError) -> None:
    if condition:
        raise error(message)


class SparseConvolution(SparseModule):
    """spconv's SparseConvolution (SubMConvNd, SparseConvNd, SparseInverseConvNd,
    SparseConvTransposeNd are its presets).

    ``config`` (a torchsparse_pp ConvConfig / PassConfigs) picks the dataflow when ``algo`` is None;
    an explicit ``algo`` (or the input's ``force_algo``) maps to a dataflow (algo.py).
    """

    def __init__(self, ndim: int, in_channels: int, out_channels: int, kernel_size=3, stride=1, padding=0,
                 dilation=1, groups: int = 1, bias: bool = True, subm: bool = False, output_padding=0,
                 transposed: bool = False, inverse: bool = False, indice_key: Optional[str] = None,
                 algo: Optional[ConvAlgo] = None, fp32_accum: Optional[bool] = None,
                 record_voxel_count: bool = False, act_type=None, act_alpha: float = 0, act_beta: float = 0,
                 large_kernel_fast_algo: bool = False, name=None, device=None, dtype=None):
        super().__init__(name=name)
        _reject(not 1 <= ndim <= 3, f"{ndim}-D convolution: the spconv adapter supports 1-, 2- and 3-D")
        _reject(groups != 1, f"groups={groups}: grouped sparse convs are not supported (nor by spconv 2.3.8)",
                ValueError)
        _reject(act_type is not None or act_alpha != 0 or act_beta != 0,
                "fused activations (act_type / act_alpha / act_beta) are not supported; apply the "
                "activation as its own module")
        _reject(fp32_accum is False, "fp32_accum=False: torchsparse_pp accumulates half-precision convs in float32")
        self.ndim, self.in_channels, self.out_channels = ndim, in_channels, out_channels
        self.kernel_size = expand_nd(ndim, kernel_size, "kernel_size")
        self.stride = expand_nd(ndim, stride, "stride")
        self.padding = expand_nd(ndim, padding, "padding")
        self.dilation = expand_nd(ndim, dilation, "dilation")
        self.output_padding = expand_nd(ndim, output_padding, "output_padding")
        self.groups, self.subm, self.transposed, self.inverse = groups, subm, transposed, inverse
        self.indice_key, self.record_voxel_count, self.fp32_accum = indice_key, record_voxel_count, fp32_accum
        self.act_type, self.act_alpha, self.act_beta = act_type, act_alpha, act_beta
        kv = int(np.prod(self.kernel_size))
        self.conv1x1 = kv == 1 and (subm or int(np.prod(self.stride)) == 1)
        self._check_geometry()
        self._algo_given = algo is not None
        self.algo = as_algo(algo) if algo is not None else default_algo(kv, large_kernel_fast_algo)
        self.config = None
        self.weight = nn.Parameter(torch.zeros(out_channels, *self.kernel_size, in_channels, device=device,
                                               dtype=dtype))
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_channels, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        if record_voxel_count:
            self.register_buffer(MAX_VOXELS_BUFFER, torch.zeros(1, dtype=torch.int32, device=device))
        self.reset_parameters()
        self._register_load_state_dict_pre_hook(self._fill_voxel_count)

    def _check_geometry(self) -> None:
        _reject(any(self.output_padding), "output_padding is not supported")
        # A submanifold conv's stride and padding are accepted and ignored, as spconv does: its
        # outputs are its inputs and its kernel is centred. Even kernels fail when run, as in spconv.
        if not self.subm and self.conv1x1:
            _reject(any(self.padding), "padding must be zero for 1x1 conv (k=1,s=1)", ValueError)
        _reject(self.transposed and any(d != 1 for d in self.dilation),
                "dilated SparseConvTranspose is not supported (spconv's output shape ignores dilation)")
        _reject(self.record_voxel_count and (self.subm or self.inverse),
                "record_voxel_count counts the outputs of strided convs only", ValueError)
        _reject(self.inverse and self.indice_key is None, "an inverse conv needs the indice_key of its strided conv",
                ValueError)

    def reset_parameters(self) -> None:
        # Kaiming-uniform with a = sqrt(5) over fan_in = C_in * kernel volume, as spconv initialises.
        fan_in = self.in_channels * int(np.prod(self.kernel_size))
        gain = math.sqrt(2.0 / (1 + 5))
        bound = math.sqrt(3.0) * gain / math.sqrt(fan_in)
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)
            if self.bias is not None:
                self.bias.uniform_(-1 / math.sqrt(fan_in), 1 / math.sqrt(fan_in))

    def _fill_voxel_count(self, state_dict, prefix, *args) -> None:
        # spconv checkpoints made without record_voxel_count lack the buffer; start it at zero.
        name = prefix + MAX_VOXELS_BUFFER
        if hasattr(self, MAX_VOXELS_BUFFER) and name not in state_dict:
            state_dict[name] = torch.zeros(1, dtype=torch.int32)

    def get_max_num_voxels(self) -> Optional[torch.Tensor]:
        return getattr(self, MAX_VOXELS_BUFFER, None)

    def _configs(self, x: SparseConvTensor):
        if x.force_algo is not None:
            return config_of(x.force_algo)
        return config_of(self.algo) if self._algo_given else self.config

    def _library_op(self, x: SparseConvTensor, geometry, **kwargs):
        """The library conv3d with this layer's kernel (submanifold and generative layers)."""
        kernel, configs = _library_kernel(self.weight, self.ndim), self._configs(x)

        def op(inp):
            return F.conv3d(inp, kernel, geometry.kernel_size, self.bias, geometry.stride, geometry.dilation,
                            geometry.padding, downsample_mode="spconv", config=configs, **kwargs)
        return op

    def _map_op(self, x: SparseConvTensor):
        """The conv with this layer's kernel over a given map (strided and inverse layers)."""
        kernel, configs = _library_kernel(self.weight, self.ndim), self._configs(x)

        def op(inp, kmap, transposed):
            return conv3d_over_map(inp, kernel, kmap, self.bias, transposed, configs).F
        return op

    def forward(self, input: SparseConvTensor, add_input: Optional[SparseConvTensor] = None) -> SparseConvTensor:
        if not isinstance(input, SparseConvTensor):
            raise TypeError(f"{type(self).__name__} expects a SparseConvTensor, got {type(input).__name__}")
        if input.ndim != self.ndim:
            raise ValueError(f"{type(self).__name__} is {self.ndim}-D but the input indices are {input.ndim}-D")
        input.check_rows(type(self).__name__)
        if input.features.shape[1] != self.in_channels:
            raise ValueError(f"channel size mismatch: the layer takes {self.in_channels}, the input has "
                             f"{input.features.shape[1]}")
        if self.conv1x1:
            out = self._pointwise(input)
        else:
            out = self._sparse(input)
        if add_input is not None:
            out = out.replace_feature(out.features + add_input.features)
        return out

    def _pointwise(self, x: SparseConvTensor) -> SparseConvTensor:
        feats = x.features @ self.weight.reshape(self.in_channels, self.out_channels)
        if self.bias is not None:
            feats = feats + self.bias
        return SparseConvTensor._derived(x, feats, x.indices, x.spatial_shape, x.indice_dict)

    def _record(self, **fields) -> IndiceData:
        return IndiceData(is_subm=self.subm, algo=self.algo, ksize=self.kernel_size, stride=self.stride,
                          dilation=self.dilation, padding=self.padding, **fields)

    def _sparse(self, x: SparseConvTensor) -> SparseConvTensor:
        indice_dict = dict(x.indice_dict)
        datas = x.find_indice_pair(self.indice_key)
        if datas is not None and datas.algo != self.algo:
            raise ValueError(f"layers that share indice_key {self.indice_key!r} must use the same algo "
                             f"({datas.algo} there, {self.algo} here), as in spconv")
        out_shape = x.spatial_shape
        if self.inverse:
            feats, indices, out_shape = self._inverse(x, datas)
        elif self.subm:
            if datas is not None:
                self._check_subm_reuse(x, datas)
            geometry = self._subm_geometry()
            feats, indices = run.submanifold(x, self._library_op(x, geometry), datas)
            if self.indice_key is not None and datas is None:
                indice_dict[self.indice_key] = self._record(out_indices=indices, indices=x.indices,
                                                            spatial_shape=x.spatial_shape, out_spatial_shape=out_shape,
                                                            state=x._state)
        else:
            if datas is not None:
                raise ValueError(f"indice_key {self.indice_key!r} already exists in this sparse tensor "
                                 "(only submanifold convs reuse a key, as in spconv)")
            geometry = run.geometry3(self.kernel_size, self.stride, self.dilation, self.padding)
            if self.transposed:
                op = self._library_op(x, geometry, transposed=True, generative=True)
                feats, indices, kmap, order = run.transposed(x, geometry, op)
                out_shape = run.deconv_output_shape(x.spatial_shape, self.kernel_size, self.stride, self.padding)
            else:
                feats, indices, kmap, order = run.strided(x, geometry, self._map_op(x))
                out_shape = run.conv_output_shape(x.spatial_shape, self.kernel_size, self.stride, self.padding,
                                                  self.dilation)
            if self.indice_key is not None:
                indice_dict[self.indice_key] = self._record(
                    out_indices=indices, indices=x.indices, spatial_shape=x.spatial_shape,
                    out_spatial_shape=out_shape, kmap=kmap, state=x._state, order=order)
            voxels = self.get_max_num_voxels()
            if voxels is not None:
                voxels.fill_(max(int(voxels.item()), indices.shape[0]))
        return SparseConvTensor._derived(x, feats, indices, out_shape, indice_dict)

    def _subm_geometry(self):
        """Centred, stride 1, whatever ``stride`` and ``padding`` say (spconv's rule)."""
        _reject(any(k % 2 == 0 for k in self.kernel_size),
                f"submanifold convs need odd kernel sizes, got {self.kernel_size} (spconv's subm index "
                "generation asserts ksize % 2 == 1)", ValueError)
        centred = [d * (k // 2) for k, d in zip(self.kernel_size, self.dilation)]
        return run.geometry3(self.kernel_size, [1] * self.ndim, self.dilation, centred)

    def _inverse(self, x: SparseConvTensor, datas: Optional[IndiceData]):
        if datas is None:
            raise ValueError(f"inverse conv: indice_key {self.indice_key!r} was not recorded by any strided conv "
                             "or pool before it in this network pass")
        if datas.is_subm:
            raise ValueError("inverse conv can only be used with standard conv and pool ops (its key "
                             f"{self.indice_key!r} belongs to a submanifold conv)")
        if self.kernel_size != datas.ksize:
            raise ValueError(f"Inverse with same indice_key must have same kernel size, expect {datas.ksize}, "
                             f"this layer {self.kernel_size}")
        if x.spatial_shape != datas.out_spatial_shape:
            raise ValueError(f"Inverse with same indice_key must have same spatial shape, expect "
                             f"{datas.out_spatial_shape}, input {x.spatial_shape}")
        if x.indices.shape[0] != datas.out_indices.shape[0]:
            raise ValueError(f"Inverse with same indice_key must have same num of indices, expect "
                             f"{datas.out_indices.shape[0]}, input {x.indices.shape[0]}")

        feats, indices = run.inverse(x, datas, self._map_op(x))
        return feats, indices, datas.spatial_shape

    def _check_subm_reuse(self, x: SparseConvTensor, datas: IndiceData) -> None:
        if not datas.is_subm:
            raise ValueError(f"indice_key {self.indice_key!r} belongs to a strided layer; only submanifold convs "
                             "reuse a key")
        for what, mine, theirs in (("kernel size", self.kernel_size, datas.ksize),
                                   ("dilation", self.dilation, datas.dilation),
                                   ("spatial shape", x.spatial_shape, datas.spatial_shape),
                                   ("num of indices", x.indices.shape[0], datas.indices.shape[0])):
            if mine != theirs:
                raise ValueError(f"subm with same indice_key must have same {what}, expect {theirs}, "
                                 f"this layer {mine}")

    def extra_repr(self) -> str:
        text = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if any(self.padding):
            text += f", padding={self.padding}"
        if any(d != 1 for d in self.dilation):
            text += f", dilation={self.dilation}"
        if self.bias is None:
            text += ", bias=False"
        return text + f", algo={self.algo}"


def _preset(ndim: int, subm: bool = False, transposed: bool = False, inverse: bool = False):
    """A spconv conv class with a fixed dimension and kind, taking spconv's keyword arguments."""

    class Conv(SparseConvolution):
        def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                     bias=True, indice_key=None, algo=None, fp32_accum=None, record_voxel_count=False,
                     large_kernel_fast_algo=False, name=None, **kwargs):
            super().__init__(ndim, in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                             subm=subm, transposed=transposed, inverse=inverse, indice_key=indice_key, algo=algo,
                             fp32_accum=fp32_accum, record_voxel_count=record_voxel_count,
                             large_kernel_fast_algo=large_kernel_fast_algo, name=name, **kwargs)
    return Conv


def _inverse_preset(ndim: int):
    class Inverse(SparseConvolution):
        def __init__(self, in_channels, out_channels, kernel_size, indice_key, bias=True, algo=None,
                     fp32_accum=None, large_kernel_fast_algo=False, name=None, **kwargs):
            super().__init__(ndim, in_channels, out_channels, kernel_size, bias=bias, inverse=True,
                             indice_key=indice_key, algo=algo, fp32_accum=fp32_accum,
                             large_kernel_fast_algo=large_kernel_fast_algo, name=name, **kwargs)
    return Inverse


def _named(cls, name: str):
    cls.__name__ = cls.__qualname__ = name
    return cls


SubMConv1d = _named(_preset(1, subm=True), "SubMConv1d")
SubMConv2d = _named(_preset(2, subm=True), "SubMConv2d")
SubMConv3d = _named(_preset(3, subm=True), "SubMConv3d")
SparseConv1d = _named(_preset(1), "SparseConv1d")
SparseConv2d = _named(_preset(2), "SparseConv2d")
SparseConv3d = _named(_preset(3), "SparseConv3d")
SparseConvTranspose1d = _named(_preset(1, transposed=True), "SparseConvTranspose1d")
SparseConvTranspose2d = _named(_preset(2, transposed=True), "SparseConvTranspose2d")
SparseConvTranspose3d = _named(_preset(3, transposed=True), "SparseConvTranspose3d")
SparseInverseConv1d = _named(_inverse_preset(1), "SparseInverseConv1d")
SparseInverseConv2d = _named(_inverse_preset(2), "SparseInverseConv2d")
SparseInverseConv3d = _named(_inverse_preset(3), "SparseInverseConv3d")
