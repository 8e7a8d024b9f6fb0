"""Sparse neural-network layers (torchsparse_pp.nn) and their functional forms (nn.functional)."""
from . import functional
from .fusion import fuse, register_fuser
from .modules import (AvgPool3d, BatchNorm, Conv3d, GlobalAvgPool, GlobalMaxPool, GroupNorm,
                      InstanceNorm, LeakyReLU, MaxPool3d, ReLU, SiLU, SyncBatchNorm, ToDense)
from .modules.fused import FusedConv3d

__all__ = [
    "functional", "Conv3d", "BatchNorm", "SyncBatchNorm", "GroupNorm", "InstanceNorm", "ReLU",
    "LeakyReLU", "SiLU", "MaxPool3d", "AvgPool3d", "GlobalAvgPool", "GlobalMaxPool", "ToDense", "FusedConv3d",
    "fuse", "register_fuser",
]
