"""Models built on torchsparse_pp layers: MinkUNet (segmentation) and CenterPoint (detection)."""
from .blocks import ResidualBlock, conv_bn_relu
from .centerpoint import CenterPoint, CenterPointConfig, VoxelResBackBone8x
from .minkunet import MinkUNet

__all__ = ["MinkUNet", "CenterPoint", "CenterPointConfig", "VoxelResBackBone8x", "ResidualBlock", "conv_bn_relu"]
