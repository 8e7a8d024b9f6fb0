"""torchsparse 2.1's Conv3d: parameters ``kernel`` in 2.1's layout (``[K, C_in, C_out]`` in
2.1's offset order; ``[C_in, C_out]`` for a 1x1x1 stride-1 conv) and ``bias``, so 2.1
checkpoints load with strict=True; semantics of nn.functional.conv3d."""
import math

import torch
from torch import nn

from ...tensor import SparseTensor
from ...utils.utils import make_ntuple
from .. import functional as F


class Conv3d(nn.Module):
    """Padding: at stride 1 an odd kernel axis is centred, whatever ``padding`` says (as in 2.1);
    elsewhere ``padding`` is used as given (0 by default, also for odd kernels)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size=3, stride=1, padding=0, dilation=1,
                 bias: bool = False, transposed: bool = False, generative: bool = False, config=None):
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = make_ntuple(kernel_size, 3)
        self.stride = make_ntuple(stride, 3)
        self.dilation = dilation
        if make_ntuple(dilation, 3) != (1, 1, 1):
            raise NotImplementedError(f"dilation={dilation}: torchsparse 2.1 ignores dilation in its kernel maps; "
                                      "use torchsparse_pp.nn.Conv3d(dilation=...)")
        if generative and not transposed:
            raise ValueError("generative=True needs transposed=True")
        if generative:
            raise NotImplementedError("generative convs need torchsparse 2.1's 'hashmap' kmap mode, which the "
                                      "adapter does not implement; use torchsparse_pp.nn.Conv3d(transposed=True, "
                                      "generative=True)")
        given = make_ntuple(padding, 3)
        self.padding = tuple((k - 1) // 2 if k % 2 == 1 and s == 1 else p
                             for k, s, p in zip(self.kernel_size, self.stride, given))
        self.transposed, self.generative = transposed, generative
        self._config = config
        self.kernel_volume = self.kernel_size[0] * self.kernel_size[1] * self.kernel_size[2]
        if self.kernel_volume > 1 or self.stride != (1, 1, 1):
            self.kernel = nn.Parameter(torch.zeros(self.kernel_volume, in_channels, out_channels))
        else:
            self.kernel = nn.Parameter(torch.zeros(in_channels, out_channels))
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_channels))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        std = 1 / math.sqrt((self.out_channels if self.transposed else self.in_channels) * self.kernel_volume)
        with torch.no_grad():
            self.kernel.uniform_(-std, std)
            if self.bias is not None:
                self.bias.uniform_(-std, std)

    def forward(self, input: SparseTensor) -> SparseTensor:
        return F.conv3d(input, self.kernel, self.kernel_size, self.bias, self.stride, self.padding, self.dilation,
                        self._config, self.transposed, self.generative, self.training)

    def extra_repr(self) -> str:
        text = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}"
        if self.stride != (1, 1, 1):
            text += f", stride={self.stride}"
        if self.bias is None:
            text += ", bias=False"
        if self.transposed:
            text += ", transposed=True"
        return text
