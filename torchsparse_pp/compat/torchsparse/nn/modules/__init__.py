"""torchsparse.nn modules."""
from .bev import ToBEVConvolution, ToBEVHeightCompression, ToBEVReduction, ToDenseBEVConvolution
from .conv import Conv3d
from .feature_wise import BatchNorm, GroupNorm, InstanceNorm, LeakyReLU, ReLU, SiLU
from .pooling import GlobalAvgPool, GlobalMaxPool, SparseCrop

__all__ = ["Conv3d", "BatchNorm", "GroupNorm", "InstanceNorm", "ReLU", "LeakyReLU", "SiLU", "GlobalAvgPool",
           "GlobalMaxPool", "SparseCrop", "ToBEVConvolution", "ToBEVReduction", "ToDenseBEVConvolution",
           "ToBEVHeightCompression"]
