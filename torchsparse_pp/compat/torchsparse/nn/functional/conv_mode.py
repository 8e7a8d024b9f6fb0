"""torchsparse 2.1's global modes: kernel-map mode, downsample mode and conv mode.

2.1's conv3d reads the kmap and downsample modes from the conv config, not from these globals,
so setting them changes no conv here either; the conv mode picks the default config's sorting."""
from enum import Enum

KMAP_MODES = ("hashmap_on_the_fly", "hashmap")
DOWNSAMPLE_MODES = ("spconv", "minkowski")

_kmap_mode = "hashmap_on_the_fly"
_downsample_mode = "spconv"


class ConvMode(Enum):
    mode0 = 0  # unsorted forward
    mode1 = 1  # sorted forward
    mode2 = 2  # sorted forward, 3 mask splits


_conv_mode = ConvMode.mode0


def get_kmap_mode() -> str:
    return _kmap_mode


def set_kmap_mode(kmap_mode: str) -> None:
    global _kmap_mode
    if kmap_mode not in KMAP_MODES:
        raise ValueError(f"unsupported kmap_mode {kmap_mode!r}; expected one of {KMAP_MODES}")
    _kmap_mode = kmap_mode


def get_downsample_mode() -> str:
    return _downsample_mode


def set_downsample_mode(downsample_mode: str) -> None:
    global _downsample_mode
    if downsample_mode not in DOWNSAMPLE_MODES:
        raise ValueError(f"unsupported downsample_mode {downsample_mode!r}; expected one of {DOWNSAMPLE_MODES}")
    _downsample_mode = downsample_mode


def get_conv_mode() -> ConvMode:
    return _conv_mode


def set_conv_mode(conv_mode) -> None:
    global _conv_mode
    if isinstance(conv_mode, ConvMode):
        _conv_mode = conv_mode
    elif isinstance(conv_mode, int) and conv_mode in (0, 1, 2):
        _conv_mode = ConvMode(conv_mode)
    else:
        raise ValueError(f"conv_mode must be 0, 1, 2 or a ConvMode, got {conv_mode!r}")
