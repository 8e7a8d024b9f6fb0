"""Models written against spconv 2.x's API, as client code would write them, built from a given
``spconv`` namespace (the real ``spconv.pytorch`` or torchsparse_pp's adapter) so one definition
runs on both.

- ``voxel_res_backbone``: OpenPCDet's VoxelResBackBone8x layout (indices in (z, y, x) order,
  conv biases before BatchNorm in the residual blocks, conv4 padding (0, 1, 1), conv_out
  k(3, 1, 1) s(2, 1, 1));
- ``minkunet``: a sparse U-Net of the MinkUNet layout (k2 s2 downsampling, residual blocks,
  SparseInverseConv3d upsampling back onto the skip's indices, concatenation).
"""
import torch
from torch import nn


def voxel_res_backbone(spconv, in_channels: int = 4, eps: float = 1e-3) -> nn.Module:
    def norm(c):
        return nn.BatchNorm1d(c, eps=eps, momentum=0.01)

    def post_act_block(c_in, c_out, k, stride=1, padding=0, key=None, kind="subm"):
        if kind == "subm":
            conv = spconv.SubMConv3d(c_in, c_out, k, bias=False, indice_key=key)
        else:
            conv = spconv.SparseConv3d(c_in, c_out, k, stride=stride, padding=padding, bias=False, indice_key=key)
        return spconv.SparseSequential(conv, norm(c_out), nn.ReLU())

    class BasicBlock(spconv.SparseModule):
        def __init__(self, c, key):
            super().__init__()
            self.conv1 = spconv.SubMConv3d(c, c, 3, padding=1, bias=True, indice_key=key)
            self.bn1 = norm(c)
            self.relu = nn.ReLU()
            self.conv2 = spconv.SubMConv3d(c, c, 3, padding=1, bias=True, indice_key=key)
            self.bn2 = norm(c)

        def forward(self, x):
            out = self.conv1(x)
            out = out.replace_feature(self.relu(self.bn1(out.features)))
            out = self.conv2(out)
            out = out.replace_feature(self.bn2(out.features) + x.features)
            return out.replace_feature(self.relu(out.features))

    class Backbone(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv_input = spconv.SparseSequential(
                spconv.SubMConv3d(in_channels, 16, 3, padding=1, bias=False, indice_key="subm1"), norm(16), nn.ReLU())
            self.conv1 = spconv.SparseSequential(BasicBlock(16, "res1"), BasicBlock(16, "res1"))
            self.conv2 = spconv.SparseSequential(post_act_block(16, 32, 3, 2, 1, "spconv2", "spconv"),
                                                 BasicBlock(32, "res2"), BasicBlock(32, "res2"))
            self.conv3 = spconv.SparseSequential(post_act_block(32, 64, 3, 2, 1, "spconv3", "spconv"),
                                                 BasicBlock(64, "res3"), BasicBlock(64, "res3"))
            self.conv4 = spconv.SparseSequential(post_act_block(64, 128, 3, 2, (0, 1, 1), "spconv4", "spconv"),
                                                 BasicBlock(128, "res4"), BasicBlock(128, "res4"))
            self.conv_out = spconv.SparseSequential(
                spconv.SparseConv3d(128, 128, (3, 1, 1), stride=(2, 1, 1), padding=0, bias=False,
                                    indice_key="spconv_down2"), norm(128), nn.ReLU())

        def forward(self, x):
            for stage in (self.conv_input, self.conv1, self.conv2, self.conv3, self.conv4, self.conv_out):
                x = stage(x)
            return x

    return Backbone()


def minkunet(spconv, in_channels: int = 4, num_classes: int = 5, widths=(8, 16, 24, 32, 24, 16)) -> nn.Module:
    c0, c1, c2, c3, u2, u1 = widths

    class Res(spconv.SparseModule):
        def __init__(self, c_in, c_out, key):
            super().__init__()
            self.body = spconv.SparseSequential(
                spconv.SubMConv3d(c_in, c_out, 3, bias=False, indice_key=key), nn.BatchNorm1d(c_out), nn.ReLU(),
                spconv.SubMConv3d(c_out, c_out, 3, bias=False, indice_key=key), nn.BatchNorm1d(c_out))
            self.short = (spconv.SparseSequential(spconv.SubMConv3d(c_in, c_out, 1, bias=False), nn.BatchNorm1d(c_out))
                          if c_in != c_out else None)

        def forward(self, x):
            skip = x if self.short is None else self.short(x)
            y = self.body(x)
            return y.replace_feature(torch.relu(y.features + skip.features))

    def down(c_in, c_out, key):
        return spconv.SparseSequential(spconv.SparseConv3d(c_in, c_out, 2, stride=2, bias=False, indice_key=key),
                                       nn.BatchNorm1d(c_out), nn.ReLU())

    def up(c_in, c_out, key):
        return spconv.SparseSequential(spconv.SparseInverseConv3d(c_in, c_out, 2, indice_key=key, bias=False),
                                       nn.BatchNorm1d(c_out), nn.ReLU())

    def cat(a, b):
        return a.replace_feature(torch.cat([a.features, b.features], 1))

    class UNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = spconv.SparseSequential(spconv.SubMConv3d(in_channels, c0, 3, bias=False, indice_key="s0"),
                                                nn.BatchNorm1d(c0), nn.ReLU())
            self.enc1 = spconv.SparseSequential(down(c0, c0, "d1"), Res(c0, c1, "s1"))
            self.enc2 = spconv.SparseSequential(down(c1, c1, "d2"), Res(c1, c2, "s2"))
            self.enc3 = spconv.SparseSequential(down(c2, c2, "d3"), Res(c2, c3, "s3"))
            self.up3, self.dec3 = up(c3, u2, "d3"), Res(u2 + c2, u2, "s2")
            self.up2, self.dec2 = up(u2, u1, "d2"), Res(u1 + c1, u1, "s1")
            self.up1, self.dec1 = up(u1, c0, "d1"), Res(c0 + c0, c0, "s0")
            self.head = nn.Linear(c0, num_classes)

        def forward(self, x):
            x0 = self.stem(x)
            x1 = self.enc1(x0)
            x2 = self.enc2(x1)
            x3 = self.enc3(x2)
            y = self.dec3(cat(self.up3(x3), x2))
            y = self.dec2(cat(self.up2(y), x1))
            y = self.dec1(cat(self.up1(y), x0))
            return y.replace_feature(self.head(y.features))

    return UNet()
