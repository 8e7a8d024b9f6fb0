"""torchsparse.nn.functional: conv3d and its config API, point-voxel ops, hashing, activations,
global pooling and crop, with torchsparse 2.1's names and semantics."""
from . import conv_config, conv_mode
from .conv import conv3d
from .conv_config import (Dataflow, clear_global_conv_config, get_default_conv_config, get_global_conv_config,
                          set_global_conv_config)
from .conv_mode import (ConvMode, get_conv_mode, get_downsample_mode, get_kmap_mode, set_conv_mode,
                        set_downsample_mode, set_kmap_mode)
from .devoxelize import calc_ti_weights, spdevoxelize
from .features import global_avg_pool, global_max_pool, leaky_relu, relu, silu, spcrop
from .hash import sphash, sphashquery
from .voxelize import spcount, spvoxelize

__all__ = [
    "conv3d", "conv_config", "conv_mode", "Dataflow", "get_default_conv_config", "get_global_conv_config",
    "set_global_conv_config", "clear_global_conv_config", "ConvMode", "get_conv_mode", "set_conv_mode",
    "get_kmap_mode", "set_kmap_mode", "get_downsample_mode", "set_downsample_mode", "calc_ti_weights",
    "spdevoxelize", "spvoxelize", "spcount", "sphash", "sphashquery", "relu", "silu", "leaky_relu",
    "global_avg_pool", "global_max_pool", "spcrop",
]
