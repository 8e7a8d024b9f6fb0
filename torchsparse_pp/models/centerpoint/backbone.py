"""VoxelResBackBone8x: the sparse 3-D backbone of CenterPoint (OpenPCDet's layout, in our
(x, y, z) axis order)."""
from torch import nn

from ...tensor import SparseTensor
from ..blocks import ResidualBlock, conv_bn_relu

# (kernel_size, stride, padding) of the four strided convs, x/y/z order, spconv output set.
# OpenPCDet's conv4 padding (0, 1, 1) and conv_out (3, 1, 1)/(2, 1, 1) are in its z, y, x order.
BACKBONE_DOWNSAMPLING = (
    (3, 2, 1),
    (3, 2, 1),
    (3, 2, (1, 1, 0)),
    ((1, 1, 3), (1, 1, 2), 0),
)
STAGE_CHANNELS = (16, 32, 64, 128)
BACKBONE_OUT_CHANNELS = 128


class VoxelResBackBone8x(nn.Module):
    """Submanifold stem (16 channels) and two residual blocks; three stages that each downsample
    by 2 with a k3 strided conv (BN, ReLU) and add two residual blocks (32, 64, 128 channels);
    then ``conv_out``, a k(1,1,3) s(1,1,2) conv to 128 channels that halves z once more.

    The input needs ``spatial_range`` set (the dense grid, see CenterPointConfig.sparse_shape):
    strided convs then produce spconv's output sets, clipped to the dense output size.
    """

    def __init__(self, in_channels: int):
        super().__init__()
        if in_channels < 1:
            raise ValueError(f"in_channels must be positive, got {in_channels}")
        self.in_channels = in_channels
        c = STAGE_CHANNELS
        self.conv_input = conv_bn_relu(in_channels, c[0], 3)
        stages = [nn.Sequential(ResidualBlock(c[0], c[0]), ResidualBlock(c[0], c[0]))]
        for (kernel_size, stride, padding), c_in, c_out in zip(BACKBONE_DOWNSAMPLING[:3], c[:-1], c[1:]):
            stages.append(nn.Sequential(conv_bn_relu(c_in, c_out, kernel_size, stride, padding),
                                        ResidualBlock(c_out, c_out), ResidualBlock(c_out, c_out)))
        self.stages = nn.ModuleList(stages)
        kernel_size, stride, padding = BACKBONE_DOWNSAMPLING[3]
        self.conv_out = conv_bn_relu(c[-1], BACKBONE_OUT_CHANNELS, kernel_size, stride, padding)

    def forward(self, x: SparseTensor) -> SparseTensor:
        if not isinstance(x, SparseTensor):
            raise TypeError(f"VoxelResBackBone8x expects a SparseTensor, got {type(x).__name__}")
        if x.spatial_range is None:
            raise ValueError("VoxelResBackBone8x needs an input with spatial_range set (the voxel grid); "
                             "see CenterPointConfig.sparse_shape and centerpoint.voxelize")
        if x.num_channels != self.in_channels:
            raise ValueError(f"VoxelResBackBone8x was built for {self.in_channels} channels, got {x.num_channels}")
        x = self.conv_input(x)
        for stage in self.stages:
            x = stage(x)
        return self.conv_out(x)
