"""Bird's-eye view: height compression of the 3-D backbone output and a small 2-D backbone/neck."""
from typing import Sequence

import torch
from torch import nn

from ...nn.functional import to_dense
from ...tensor import SparseTensor


def height_compression(x: SparseTensor, batch_size: int) -> torch.Tensor:
    """Dense BEV map ``[B, C * D, Y, X]`` of a sparse tensor on a (X, Y, D) grid: channel
    ``c * D + d`` holds channel c of z layer d; rows are y, columns x (as OpenPCDet's maps)."""
    if x.spatial_range is None:
        raise ValueError("height compression needs a tensor with spatial_range set")
    dense = to_dense(x, batch_size=batch_size)  # [B, C, X, Y, D]
    b, c, nx, ny, nz = dense.shape
    return dense.permute(0, 1, 4, 3, 2).reshape(b, c * nz, ny, nx)


def _conv_bn_relu_2d(c_in: int, c_out: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False),
                         nn.BatchNorm2d(c_out, eps=1e-3, momentum=0.01), nn.ReLU(inplace=True))


class BEVBackbone(nn.Module):
    """Blocks of 3x3 convs at increasing strides; each block's output is brought back to the
    first block's resolution (deconv, or a 1x1 conv when it is already there) and concatenated."""

    def __init__(self, in_channels: int, layer_nums: Sequence[int], strides: Sequence[int],
                 filters: Sequence[int], upsample_strides: Sequence[int], upsample_filters: Sequence[int]):
        super().__init__()
        if not (len(layer_nums) == len(strides) == len(filters) == len(upsample_strides) == len(upsample_filters)):
            raise ValueError("layer_nums, strides, filters, upsample_strides and upsample_filters differ in length")
        self.blocks, self.deblocks = nn.ModuleList(), nn.ModuleList()
        c_in = in_channels
        for num, stride, c_out, up, c_up in zip(layer_nums, strides, filters, upsample_strides, upsample_filters):
            layers = [_conv_bn_relu_2d(c_in, c_out, stride)]
            layers += [_conv_bn_relu_2d(c_out, c_out) for _ in range(num)]
            self.blocks.append(nn.Sequential(*layers))
            resample = (nn.Conv2d(c_out, c_up, 1, bias=False) if up == 1 else
                        nn.ConvTranspose2d(c_out, c_up, up, stride=up, bias=False))
            self.deblocks.append(nn.Sequential(resample, nn.BatchNorm2d(c_up, eps=1e-3, momentum=0.01),
                                               nn.ReLU(inplace=True)))
            c_in = c_out
        self.out_channels = sum(upsample_filters)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = []
        for block, deblock in zip(self.blocks, self.deblocks):
            x = block(x)
            outs.append(deblock(x))
        return torch.cat(outs, dim=1)
