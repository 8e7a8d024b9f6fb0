"""Functional interface: convolution, pooling, normalisation and dense conversions."""
from .config import (DATAFLOWS, ConvConfig, PassConfigs, default_config, get_default_config,
                     set_default_config)
from .conv import conv3d
from .dense import from_dense, to_dense
from .norm import sample_group_norm
from .offsets import kernel_offsets
from .pooling import avg_pool3d, global_avg_pool, global_max_pool, max_pool3d

__all__ = [
    "ConvConfig", "PassConfigs", "DATAFLOWS", "set_default_config", "get_default_config", "default_config",
    "conv3d", "kernel_offsets", "to_dense", "from_dense", "max_pool3d",
    "avg_pool3d", "global_avg_pool", "global_max_pool", "sample_group_norm",
]
