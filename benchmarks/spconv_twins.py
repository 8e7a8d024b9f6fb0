"""MinkUNet and VoxelResBackBone8x written with spconv 2.3.8 (spconv.pytorch), layer for layer the
same as torchsparse_pp.models, plus the copy of our weights into them.

Same layer lists, in the same registration order, so that our Conv3d / BatchNorm / Linear modules
and these pair up one to one (``copy_weights`` checks every pair's shape). Submanifold convs that
run on one coordinate set share an ``indice_key`` (spconv's map reuse, as our SparseTensor cache
does); every transposed conv names the key of the strided conv it inverts.

Coordinates are (batch, x, y, z) for both libraries, spatial shapes [x, y, z].
"""
from typing import List, Tuple

import torch
from torch import nn

import spconv.pytorch as spconv
from spconv.constants import FILTER_HWIO

from torchsparse_pp.models.centerpoint.backbone import (BACKBONE_DOWNSAMPLING, BACKBONE_OUT_CHANNELS,
                                                        STAGE_CHANNELS)
from torchsparse_pp.models.minkunet import minkunet_channels
from torchsparse_pp.nn import BatchNorm, Conv3d


def conv_bn_relu(conv: spconv.SparseModule, channels: int) -> spconv.SparseSequential:
    """Conv (no bias), BatchNorm1d, ReLU: torchsparse_pp.models.blocks.conv_bn_relu."""
    return spconv.SparseSequential(conv, nn.BatchNorm1d(channels), nn.ReLU(True))


class ResidualBlock(spconv.SparseModule):
    """Two submanifold 3^3 convs with BN (ReLU between), shortcut = identity or 1^3 conv + BN,
    ReLU after the sum: torchsparse_pp.models.blocks.ResidualBlock."""

    def __init__(self, in_channels: int, out_channels: int, indice_key: str):
        super().__init__()
        self.body = spconv.SparseSequential(
            spconv.SubMConv3d(in_channels, out_channels, 3, bias=False, indice_key=indice_key),
            nn.BatchNorm1d(out_channels),
            nn.ReLU(True),
            spconv.SubMConv3d(out_channels, out_channels, 3, bias=False, indice_key=indice_key),
            nn.BatchNorm1d(out_channels),
        )
        if in_channels == out_channels:
            self.shortcut = None
        else:
            self.shortcut = spconv.SparseSequential(spconv.SubMConv3d(in_channels, out_channels, 1, bias=False),
                                                    nn.BatchNorm1d(out_channels))
        self.relu = nn.ReLU(True)

    def forward(self, x: spconv.SparseConvTensor) -> spconv.SparseConvTensor:
        y = self.body(x)
        skip = x.features if self.shortcut is None else self.shortcut(x).features
        return y.replace_feature(self.relu(y.features + skip))


class SpconvMinkUNet(nn.Module):
    """torchsparse_pp.models.MinkUNet: stem, 4 encoder stages (k2 s2 conv, 2 residual blocks),
    4 decoder stages (k2 s2 inverse conv onto the skip's coordinates, concat, 2 residual blocks),
    linear classifier. Returns logits in the input's row order."""

    def __init__(self, in_channels: int = 4, num_classes: int = 19, cr: float = 1.0):
        super().__init__()
        cs = minkunet_channels(cr)
        self.stem = spconv.SparseSequential(
            conv_bn_relu(spconv.SubMConv3d(in_channels, cs[0], 3, bias=False, indice_key="subm0"), cs[0]),
            conv_bn_relu(spconv.SubMConv3d(cs[0], cs[0], 3, bias=False, indice_key="subm0"), cs[0]))
        # Level i + 1 is the coordinate set after i + 1 downsamples.
        self.encoder = nn.ModuleList(
            spconv.SparseSequential(
                conv_bn_relu(spconv.SparseConv3d(cs[i], cs[i], 2, stride=2, padding=0, bias=False,
                                                 indice_key=f"down{i}"), cs[i]),
                ResidualBlock(cs[i], cs[i + 1], f"subm{i + 1}"), ResidualBlock(cs[i + 1], cs[i + 1], f"subm{i + 1}"))
            for i in range(4))
        self.up = nn.ModuleList(
            conv_bn_relu(spconv.SparseInverseConv3d(cs[4 + i], cs[5 + i], 2, indice_key=f"down{3 - i}", bias=False),
                         cs[5 + i])
            for i in range(4))
        self.decoder = nn.ModuleList(
            spconv.SparseSequential(ResidualBlock(cs[5 + i] + cs[3 - i], cs[5 + i], f"subm{3 - i}"),
                                    ResidualBlock(cs[5 + i], cs[5 + i], f"subm{3 - i}"))
            for i in range(4))
        self.classifier = nn.Linear(cs[8], num_classes)

    def forward(self, x: spconv.SparseConvTensor) -> torch.Tensor:
        skips = [self.stem(x)]
        for stage in self.encoder:
            skips.append(stage(skips[-1]))
        y = skips.pop()
        for up, decoder in zip(self.up, self.decoder):
            y = up(y)
            skip = skips.pop()
            y = decoder(y.replace_feature(torch.cat([y.features, skip.features], 1)))
        return self.classifier(y.features)


class SpconvVoxelResBackBone8x(nn.Module):
    """torchsparse_pp.models.VoxelResBackBone8x (CenterPoint's sparse 3-D backbone) in spconv."""

    def __init__(self, in_channels: int):
        super().__init__()
        c = STAGE_CHANNELS
        self.conv_input = conv_bn_relu(spconv.SubMConv3d(in_channels, c[0], 3, bias=False, indice_key="subm0"), c[0])
        stages = [spconv.SparseSequential(ResidualBlock(c[0], c[0], "subm0"), ResidualBlock(c[0], c[0], "subm0"))]
        for i, ((kernel_size, stride, padding), c_in, c_out) in enumerate(zip(BACKBONE_DOWNSAMPLING[:3], c[:-1], c[1:])):
            stages.append(spconv.SparseSequential(
                conv_bn_relu(spconv.SparseConv3d(c_in, c_out, kernel_size, stride=stride, padding=padding, bias=False,
                                                 indice_key=f"down{i}"), c_out),
                ResidualBlock(c_out, c_out, f"subm{i + 1}"), ResidualBlock(c_out, c_out, f"subm{i + 1}")))
        self.stages = nn.ModuleList(stages)
        kernel_size, stride, padding = BACKBONE_DOWNSAMPLING[3]
        self.conv_out = conv_bn_relu(spconv.SparseConv3d(c[-1], BACKBONE_OUT_CHANNELS, kernel_size, stride=stride,
                                                         padding=padding, bias=False, indice_key="down3"),
                                     BACKBONE_OUT_CHANNELS)

    def forward(self, x: spconv.SparseConvTensor) -> spconv.SparseConvTensor:
        x = self.conv_input(x)
        for stage in self.stages:
            x = stage(x)
        return self.conv_out(x)


# --- weights ------------------------------------------------------------------------------------

SPCONV_CONVS = (spconv.SubMConv3d, spconv.SparseConv3d, spconv.SparseInverseConv3d)


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _layers(model: nn.Module, conv_types) -> List[nn.Module]:
    return [m for m in model.modules() if isinstance(m, (*conv_types, nn.BatchNorm1d, nn.Linear))]


def ours_kernel_to_spconv(kernel: torch.Tensor, sp_conv: spconv.SparseModule) -> torch.Tensor:
    """Our [K, C_in, C_out] (z fastest) as the tensor ``sp_conv.weight`` must hold.

    spconv's weight is [C_out, kx, ky, kz, C_in]; but its 1x1x1 stride-1 path multiplies by
    ``weight.view(C_in, C_out)`` (FILTER_HWIO off), i.e. reads the memory as [C_in, C_out], so
    there our kernel's memory goes in unchanged."""
    kx, ky, kz = sp_conv.kernel_size
    c_in, c_out = sp_conv.in_channels, sp_conv.out_channels
    if tuple(kernel.shape) != (kx * ky * kz, c_in, c_out):
        raise ValueError(f"kernel {list(kernel.shape)} does not fit spconv conv {sp_conv}")
    if sp_conv.conv1x1 and not FILTER_HWIO:
        return kernel.reshape(c_in, c_out).contiguous().view(sp_conv.weight.shape)
    return kernel.reshape(kx, ky, kz, c_in, c_out).permute(4, 0, 1, 2, 3).contiguous()


def copy_weights(ours: nn.Module, theirs: nn.Module) -> int:
    """Copies every conv kernel, BatchNorm (affine, running stats, eps, momentum) and Linear of
    ``ours`` into the matching module of ``theirs`` (same order). Returns the layers copied."""
    mine = _layers(ours, (Conv3d,))
    other = _layers(theirs, SPCONV_CONVS)
    if len(mine) != len(other):
        raise ValueError(f"layer lists differ: {len(mine)} ours vs {len(other)} spconv")
    with torch.no_grad():
        for a, b in zip(mine, other):
            if isinstance(a, Conv3d):
                if not isinstance(b, SPCONV_CONVS) or a.bias is not None:
                    raise ValueError(f"layer mismatch: {a} vs {b}")
                if tuple(b.kernel_size) != a.kernel_size or a.transposed != isinstance(b, spconv.SparseInverseConv3d):
                    raise ValueError(f"geometry mismatch: {a} vs {b}")
                # Strided: same stride and padding (an inverse conv takes both from its indice_key).
                if isinstance(b, spconv.SparseConv3d) and (tuple(b.stride), tuple(b.padding)) != (a.stride, a.padding):
                    raise ValueError(f"stride / padding mismatch: {a} vs {b}")
                if isinstance(b, spconv.SubMConv3d) and a.stride != (1, 1, 1):
                    raise ValueError(f"submanifold vs strided: {a} vs {b}")
                b.weight.copy_(ours_kernel_to_spconv(a.kernel, b))
            elif isinstance(a, BatchNorm):
                if not isinstance(b, nn.BatchNorm1d) or a.num_features != b.num_features:
                    raise ValueError(f"layer mismatch: {a} vs {b}")
                for name in ("weight", "bias", "running_mean", "running_var"):
                    getattr(b, name).copy_(getattr(a, name))
                b.eps, b.momentum = a.eps, a.momentum
            elif isinstance(a, nn.Linear):
                if not isinstance(b, nn.Linear) or a.weight.shape != b.weight.shape:
                    raise ValueError(f"layer mismatch: {a} vs {b}")
                b.weight.copy_(a.weight)
                b.bias.copy_(a.bias)
            else:
                raise ValueError(f"unexpected layer {a}")
    return len(mine)


def build_spconv_twin(ours: nn.Module, kind: str, **kwargs) -> Tuple[nn.Module, int]:
    """The spconv model of ``kind`` ('minkunet' or 'centerpoint_backbone') with ours' weights;
    checks that both have the same parameter count. Returns (model, parameter count)."""
    theirs = SpconvMinkUNet(**kwargs) if kind == "minkunet" else SpconvVoxelResBackBone8x(**kwargs)
    n_ours, n_theirs = parameter_count(ours), parameter_count(theirs)
    if n_ours != n_theirs:
        raise AssertionError(f"{kind}: {n_ours} parameters ours vs {n_theirs} spconv")
    copy_weights(ours, theirs)
    return theirs.to(next(ours.parameters()).device), n_ours
