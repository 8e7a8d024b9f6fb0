"""Models built on torchsparse_pp layers: MinkUNet and SPVCNN (segmentation), CenterPoint (detection)."""
from .blocks import ResidualBlock, conv_bn_relu
from .centerpoint import CenterPoint, CenterPointConfig, VoxelResBackBone8x
from .minkunet import MinkUNet
from .spvcnn import SPVCNN

__all__ = ["MinkUNet", "SPVCNN", "CenterPoint", "CenterPointConfig", "VoxelResBackBone8x", "ResidualBlock", "conv_bn_relu"]
