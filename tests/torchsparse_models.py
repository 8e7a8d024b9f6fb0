"""Client code written against torchsparse 2.1's API, as SPVNAS writes its SemanticKITTI models:
MinkUNet and SPVCNN (module names stem / stage1..4 / up1..4 / classifier / point_transforms),
with the point-voxel helpers built from 2.1's functional names (sphash, sphashquery, spcount,
spvoxelize, calc_ti_weights, spdevoxelize). Built from a given ``torchsparse`` namespace."""
import torch
from torch import nn


def spvnas_models(torchsparse):
    spnn, F = torchsparse.nn, torchsparse.nn.functional
    offsets = spnn.utils.get_kernel_offsets(2)

    def hash_rows(coords, offsets=None):
        # 2.1's sphash adds offsets to the first three columns: hash (x, y, z, batch).
        return F.sphash(torch.cat([coords[:, 1:], coords[:, :1]], 1).int().contiguous(), offsets)

    def floor_coords(z, stride):
        return torch.cat([z.C[:, :1], torch.floor(z.C[:, 1:] / stride)], 1)

    def initial_voxelize(z, spatial_range):
        cells = floor_coords(z, 1)
        point_hash = hash_rows(cells)
        voxel_hash = torch.unique(point_hash)
        idx = F.sphashquery(point_hash, voxel_hash)
        counts = F.spcount(idx.int(), len(voxel_hash))
        coords = torch.round(F.spvoxelize(cells, idx, counts)).int()
        return torchsparse.SparseTensor(F.spvoxelize(z.F, idx, counts), coords, 1, spatial_range)

    def point_to_voxel(x, z):
        idx = F.sphashquery(hash_rows(floor_coords(z, x.s[0])), hash_rows(x.C))
        counts = F.spcount(idx.int(), x.C.shape[0])
        out = torchsparse.SparseTensor(F.spvoxelize(z.F, idx, counts), x.C, x.s, x.spatial_range)
        out._caches = x._caches
        return out

    def voxel_to_point(x, z):
        corner_hash = hash_rows(floor_coords(z, x.s[0]), offsets)  # [8, N]
        idx = F.sphashquery(corner_hash, hash_rows(x.C)).t().contiguous()
        weights = F.calc_ti_weights(z.C[:, 1:] / x.s[0], idx, scale=1)
        return torchsparse.PointTensor(F.spdevoxelize(x.F, idx, weights), z.C)

    def conv_block(c_in, c_out, ks, stride=1):
        return nn.Sequential(spnn.Conv3d(c_in, c_out, kernel_size=ks, stride=stride), spnn.BatchNorm(c_out),
                             spnn.ReLU(True))

    class BasicConvolutionBlock(nn.Module):
        def __init__(self, c_in, c_out, ks=3, stride=1):
            super().__init__()
            self.net = conv_block(c_in, c_out, ks, stride)

        def forward(self, x):
            return self.net(x)

    class BasicDeconvolutionBlock(nn.Module):
        def __init__(self, c_in, c_out, ks=3, stride=1):
            super().__init__()
            self.net = nn.Sequential(spnn.Conv3d(c_in, c_out, kernel_size=ks, stride=stride, transposed=True),
                                     spnn.BatchNorm(c_out), spnn.ReLU(True))

        def forward(self, x):
            return self.net(x)

    class ResidualBlock(nn.Module):
        def __init__(self, c_in, c_out, ks=3):
            super().__init__()
            self.net = nn.Sequential(spnn.Conv3d(c_in, c_out, kernel_size=ks), spnn.BatchNorm(c_out), spnn.ReLU(True),
                                     spnn.Conv3d(c_out, c_out, kernel_size=ks), spnn.BatchNorm(c_out))
            self.downsample = nn.Sequential() if c_in == c_out else nn.Sequential(
                spnn.Conv3d(c_in, c_out, kernel_size=1), spnn.BatchNorm(c_out))
            self.relu = spnn.ReLU(True)

        def forward(self, x):
            return self.relu(self.net(x) + self.downsample(x))

    class MinkUNet(nn.Module):
        def __init__(self, cr=1.0, num_classes=19):
            super().__init__()
            cs = [int(cr * c) for c in [32, 32, 64, 128, 256, 256, 128, 96, 96]]
            self.stem = nn.Sequential(spnn.Conv3d(4, cs[0], kernel_size=3), spnn.BatchNorm(cs[0]), spnn.ReLU(True),
                                      spnn.Conv3d(cs[0], cs[0], kernel_size=3), spnn.BatchNorm(cs[0]), spnn.ReLU(True))
            for i in range(4):
                setattr(self, f"stage{i + 1}", nn.Sequential(
                    BasicConvolutionBlock(cs[i], cs[i], ks=2, stride=2), ResidualBlock(cs[i], cs[i + 1]),
                    ResidualBlock(cs[i + 1], cs[i + 1])))
            for i in range(4):
                setattr(self, f"up{i + 1}", nn.ModuleList([
                    BasicDeconvolutionBlock(cs[4 + i], cs[5 + i], ks=2, stride=2),
                    nn.Sequential(ResidualBlock(cs[5 + i] + cs[3 - i], cs[5 + i]), ResidualBlock(cs[5 + i], cs[5 + i]))]))
            self.classifier = nn.Sequential(nn.Linear(cs[8], num_classes))
            self.point_transforms = nn.ModuleList([
                nn.Sequential(nn.Linear(a, b), nn.BatchNorm1d(b), nn.ReLU(True))
                for a, b in ((cs[0], cs[4]), (cs[4], cs[6]), (cs[6], cs[8]))])
            self.dropout = nn.Dropout(0.3, True)

        def up(self, i, y, skip):
            block = getattr(self, f"up{i}")
            return block[1](torchsparse.cat([block[0](y), skip]))

        def forward(self, x):
            x0 = self.stem(x)
            x1 = self.stage1(x0)
            x2 = self.stage2(x1)
            x3 = self.stage3(x2)
            x4 = self.stage4(x3)
            y = self.up(1, x4, x3)
            y = self.up(2, y, x2)
            y = self.up(3, y, x1)
            y = self.up(4, y, x0)
            return self.classifier(y.F)

    class SPVCNN(MinkUNet):
        def forward(self, z, spatial_range):
            x0 = self.stem(initial_voxelize(z, spatial_range))
            z0 = voxel_to_point(x0, z)
            x1 = self.stage1(point_to_voxel(x0, z0))
            x2 = self.stage2(x1)
            x3 = self.stage3(x2)
            x4 = self.stage4(x3)
            z1 = voxel_to_point(x4, z0)
            z1.F = z1.F + self.point_transforms[0](z0.F)
            y1 = point_to_voxel(x4, z1)
            y1.F = self.dropout(y1.F)
            y2 = self.up(2, self.up(1, y1, x3), x2)
            z2 = voxel_to_point(y2, z1)
            z2.F = z2.F + self.point_transforms[1](z1.F)
            y3 = point_to_voxel(y2, z2)
            y3.F = self.dropout(y3.F)
            y4 = self.up(4, self.up(3, y3, x1), x0)
            z3 = voxel_to_point(y4, z2)
            z3.F = z3.F + self.point_transforms[2](z2.F)
            return self.classifier(z3.F)

    return MinkUNet, SPVCNN
