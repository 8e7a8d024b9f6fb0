"""nn.Module layers over SparseTensors; all of them work inside torch.nn.Sequential."""
from .activation import LeakyReLU, ReLU, SiLU
from .conv import Conv3d
from .dense import ToDense
from .norm import BatchNorm, GroupNorm, InstanceNorm, SyncBatchNorm
from .pooling import AvgPool3d, GlobalAvgPool, GlobalMaxPool, MaxPool3d

__all__ = [
    "Conv3d", "BatchNorm", "SyncBatchNorm", "GroupNorm", "InstanceNorm", "ReLU", "LeakyReLU", "SiLU",
    "MaxPool3d", "AvgPool3d", "GlobalAvgPool", "GlobalMaxPool", "ToDense",
]
