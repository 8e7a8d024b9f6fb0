"""Conv3d module."""
import math
import numbers
from typing import Optional, Tuple

import torch
from torch import nn

from ...kmap import DOWNSAMPLE_MODES, ConvGeometry
from ...kmap.geometry import IntOr3
from ...tensor import SparseTensor
from ..functional.config import ConfigLike, PassConfigs
from ..functional.conv import conv3d_with_geometry
from ..functional.epilogue import Epilogue
from ..functional.norm import fold_batchnorm
from .norm import BatchNorm, SyncBatchNorm


class Conv3d(nn.Module):
    """Sparse 3-D convolution with weight ``kernel [K, C_in, C_out]`` for every kernel size.

    stride 1 is submanifold (outputs on the input coordinates); stride > 1 is strided with the
    output set of ``downsample_mode`` ('spconv' or 'minkowski'); ``transposed`` inverts the
    strided conv of the same geometry that made the input's coordinates; ``generative`` (with
    ``transposed``) creates every site conv_transpose3d writes. ``padding=None`` centres odd
    kernels. A 1x1x1 stride-1 conv is one dense GEMM and needs no kernel map. ``config`` (also
    settable later as ``conv.config``) is a ConvConfig for all passes or per-pass configs.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntOr3 = 3,
                 stride: IntOr3 = 1, padding: Optional[IntOr3] = None, dilation: IntOr3 = 1,
                 bias: bool = False, transposed: bool = False, generative: bool = False,
                 downsample_mode: str = "spconv", config: Optional[ConfigLike] = None):
        super().__init__()
        for name, value in (("in_channels", in_channels), ("out_channels", out_channels)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError(f"{name} must be an int, got {value!r}")
        in_channels, out_channels = int(in_channels), int(out_channels)
        if in_channels < 1 or out_channels < 1:
            raise ValueError(f"channel counts must be positive, got {in_channels} -> {out_channels}")
        if generative and not transposed:
            raise ValueError("generative=True needs transposed=True")
        if downsample_mode not in DOWNSAMPLE_MODES:
            raise ValueError(f"downsample_mode must be one of {DOWNSAMPLE_MODES}, got {downsample_mode!r}")
        self.geometry = ConvGeometry.make(kernel_size, stride, dilation, padding)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.transposed, self.generative = transposed, generative
        self.downsample_mode = downsample_mode
        self.config = config
        self.kernel = nn.Parameter(torch.empty(self.geometry.volume, in_channels, out_channels))
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        self.reset_parameters()

    @property
    def config(self) -> Optional[PassConfigs]:
        """Dataflow configs of this conv's forward, dgrad and wgrad; None follows the global default."""
        return self._config

    @config.setter
    def config(self, value: Optional[ConfigLike]) -> None:
        self._config = None if value is None else PassConfigs.of(value)

    @property
    def kernel_size(self) -> Tuple[int, int, int]:
        return self.geometry.kernel_size

    @property
    def stride(self) -> Tuple[int, int, int]:
        return self.geometry.stride

    @property
    def dilation(self) -> Tuple[int, int, int]:
        return self.geometry.dilation

    @property
    def padding(self) -> Tuple[int, int, int]:
        return self.geometry.padding

    def reset_parameters(self) -> None:
        fan = (self.out_channels if self.transposed else self.in_channels) * self.geometry.volume
        bound = 1.0 / math.sqrt(fan)
        nn.init.uniform_(self.kernel, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, input: SparseTensor, norm: Optional[nn.Module] = None,
                residual: Optional[SparseTensor] = None, relu: bool = False) -> SparseTensor:
        """The conv of ``input``. Blocks may pass the BatchNorm that follows it (``norm``, one of
        ours), a ``residual`` added after the norm and ``relu``: in inference (eval, no autograd,
        eager or compiled) the norm is folded into the kernel for this call and the add and ReLU
        run in the conv's output epilogue, as nn.fuse makes permanent; otherwise the norm runs
        them in its own pass."""
        if norm is None:
            if residual is not None or relu:
                raise ValueError("Conv3d takes residual / relu only with the norm that follows it (norm=...)")
            return self._conv(input, self.kernel, self.bias)
        if not isinstance(norm, (BatchNorm, SyncBatchNorm)):
            raise TypeError(f"Conv3d's norm must be a torchsparse_pp BatchNorm or SyncBatchNorm, got "
                            f"{type(norm).__name__}")
        if residual is not None and not isinstance(residual, SparseTensor):
            raise TypeError(f"the residual must be a SparseTensor, got {type(residual).__name__}")
        if norm.num_features != self.out_channels:
            raise ValueError(f"channel mismatch: the norm has {norm.num_features} channels, the conv outputs "
                             f"{self.out_channels}")
        if self._folds(norm, input, residual):
            kernel, bias = self._folded(norm)
            epilogue = None
            if residual is not None or relu:
                epilogue = Epilogue(None if residual is None else residual.F, relu)
            return self._conv(input, kernel, bias, epilogue)
        return norm(self._conv(input, self.kernel, self.bias), residual=residual, relu=relu)

    def _conv(self, input: SparseTensor, kernel: torch.Tensor, bias: Optional[torch.Tensor],
              epilogue: Optional[Epilogue] = None) -> SparseTensor:
        return conv3d_with_geometry(input, kernel, self.geometry, bias, self.transposed, self.generative,
                                    self.downsample_mode, self.config, epilogue=epilogue)

    def _folded(self, norm) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(kernel, bias) with ``norm`` folded in, kept until the norm, a parameter or a running
        statistic changes (tensor identity, in-place version and storage), so repeated inference
        calls do not fold again (nor, under autocast, cast again). A compiled graph folds in the
        graph (the cache is Python state)."""
        if torch.compiler.is_compiling():
            return fold_batchnorm(self.kernel, self.bias, norm)
        tensors = (self.kernel, self.bias, norm.weight, norm.bias, norm.running_mean, norm.running_var)
        # The data pointer too: `p.data = ...` swaps a parameter's storage without a new version.
        key = (norm, norm.eps, norm.affine) + tuple((t, None if t is None else (t._version, t.data_ptr()))
                                                    for t in tensors)
        cached = self.__dict__.get("_folded_cache")
        if cached is None or not all((a[0] is b[0] and a[1] == b[1]) if isinstance(a, tuple) else a == b
                                     for a, b in zip(cached[0], key)):
            cached = (key, *fold_batchnorm(self.kernel, self.bias, norm), {})
            self.__dict__["_folded_cache"] = cached
        _, kernel, bias, casts = cached
        # Under autocast the conv would cast the folded tensors on every call: keep the casts too.
        device_type = kernel.device.type
        if torch.is_autocast_enabled(device_type):
            dtype = torch.get_autocast_dtype(device_type)
            if dtype not in casts:
                casts[dtype] = (kernel.to(dtype), None if bias is None else bias.to(dtype))
            return casts[dtype]
        return kernel, bias

    def __getstate__(self):
        # The folded-kernel cache is derived state: copies and pickles (torch.save(model)) leave it
        # out instead of carrying extra tensors.
        state = dict(super().__getstate__())
        state.pop("_folded_cache", None)
        return state

    def _folds(self, norm, input: SparseTensor, residual: Optional[SparseTensor]) -> bool:
        """Whether this call runs with ``norm`` folded: inference on running statistics, and a
        residual (if any) on the output's coordinates."""
        return (not norm.training and norm.track_running_stats and norm.running_mean is not None
                and norm.running_var is not None and not torch.is_grad_enabled()
                and (residual is None or (residual.C is input.C and self.geometry.is_unit_stride
                                          and not self.transposed)))

    def extra_repr(self) -> str:
        g = self.geometry
        text = f"{self.in_channels}, {self.out_channels}, kernel_size={g.kernel_size}, stride={g.stride}"
        if g.dilation != (1, 1, 1):
            text += f", dilation={g.dilation}"
        text += f", padding={g.padding}"
        if self.bias is not None:
            text += ", bias=True"
        if self.transposed:
            text += ", transposed=True"
        if self.generative:
            text += ", generative=True"
        if not g.is_unit_stride and not self.transposed:
            text += f", downsample_mode={self.downsample_mode!r}"
        if self.config is not None:
            text += f", config={self.config}"
        return text
