"""Functional interface: convolution, pooling, normalisation and dense conversions."""
from .config import DATAFLOWS, ConvConfig
from .conv import conv3d
from .dense import from_dense, to_dense
from .offsets import kernel_offsets

__all__ = ["ConvConfig", "DATAFLOWS", "conv3d", "kernel_offsets", "to_dense", "from_dense"]
