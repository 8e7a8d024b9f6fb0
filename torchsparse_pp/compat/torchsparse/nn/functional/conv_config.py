"""torchsparse 2.1's conv configs (attribute dicts) and their torchsparse_pp dataflows.

A config names a ``Dataflow`` and its knobs. ImplicitGEMM runs our implicit_gemm (sorted with
``split_mask_num`` splits when ``ifsort``, the backward passes sorted with ``split_mask_num_bwd``),
GatherScatter our gather_scatter (``epsilon``, ``mm_thresh``), FetchOnDemand our fetch_on_demand
(``FOD_fusion`` is a CUDA launch choice of 2.1 with equal results; ours is always one launch).
Only 2.1's default kernel maps exist here: kmap_mode 'hashmap_on_the_fly' (downsample_mode
'spconv'); anything else raises when a conv runs.
"""
import warnings
from enum import Enum
from typing import Optional

from .....nn.functional.config import ConvConfig, PassConfigs
from .conv_mode import ConvMode, get_conv_mode


class Dataflow(Enum):
    ImplicitGEMM = 0
    GatherScatter = 1
    FetchOnDemand = 2
    CodedCSR = 3


class AttributeDict(dict):
    """A dict whose keys are also attributes (2.1's config type)."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        self[name] = value

    def copy(self) -> "AttributeDict":
        return AttributeDict(self)


_DEFAULTS = (("dataflow", Dataflow.ImplicitGEMM), ("ifsort", False), ("kmap_mode", "hashmap_on_the_fly"),
             ("downsample_mode", "spconv"), ("split_mask_num", 1), ("split_mask_num_bwd", 3), ("epsilon", 0.0),
             ("mm_thresh", 0), ("FOD_fusion", True))
_default_conv_config = AttributeDict(_DEFAULTS)
_global_conv_config = None


def keys_check(conv_config) -> None:
    """Fills missing fields with the defaults (with a warning, as 2.1 prints one)."""
    missing = [key for key, _ in _DEFAULTS if key not in conv_config]
    for key, value in _DEFAULTS:
        conv_config.setdefault(key, value)
    if missing:
        warnings.warn(f"conv config lacks {missing}; using the defaults for them")


def get_global_conv_config():
    return _global_conv_config


def set_global_conv_config(conv_config) -> None:
    global _global_conv_config
    keys_check(conv_config)
    _global_conv_config = conv_config


def clear_global_conv_config() -> None:
    global _global_conv_config
    _global_conv_config = None


def get_default_conv_config(conv_mode: ConvMode = ConvMode.mode0, training: bool = False):
    """2.1's default config object itself (shared and mutable, as in 2.1); conv modes 1 and 2
    switch on sorting (mode 2 with three mask splits)."""
    config = _default_conv_config
    if conv_mode == ConvMode.mode1:
        config.ifsort = True
    elif conv_mode == ConvMode.mode2:
        config.ifsort = True
        config.split_mask_num = 3
    return config


def library_configs(config) -> Optional[PassConfigs]:
    """torchsparse_pp's forward / dgrad / wgrad configs for a conv's 2.1 config: its own, else the
    global one, else (conv mode 1 or 2) the mode's default; None (torchsparse_pp's default
    dataflow, or a tuned one) when no config is set anywhere and the conv mode is 0."""
    if config is None:
        config = get_global_conv_config()
    if config is None:
        if get_conv_mode() == ConvMode.mode0:
            return None
        config = get_default_conv_config(get_conv_mode())
    get = config.get if isinstance(config, dict) else (lambda key, default=None: getattr(config, key, default))
    defaults = dict(_DEFAULTS)
    value = {key: get(key, defaults[key]) for key in defaults}
    if value["kmap_mode"] != "hashmap_on_the_fly":
        raise NotImplementedError(f"kmap_mode {value['kmap_mode']!r}: the adapter implements torchsparse 2.1's "
                                  "default kernel maps ('hashmap_on_the_fly') only")
    if value["downsample_mode"] != "spconv":
        raise NotImplementedError("downsample_mode 'minkowski' takes effect in 2.1's 'hashmap' kmap mode only, "
                                  "which the adapter does not implement; use torchsparse_pp.nn.Conv3d("
                                  "downsample_mode='minkowski')")
    dataflow = value["dataflow"]
    if dataflow == Dataflow.ImplicitGEMM:
        split = int(value["split_mask_num"]) if value["ifsort"] else 0
        forward = ConvConfig("implicit_gemm", sorted=bool(value["ifsort"]), split_mask_num=split)
        backward = ConvConfig("implicit_gemm", sorted=True, split_mask_num=int(value["split_mask_num_bwd"]))
        return PassConfigs(forward, backward, backward)
    if dataflow == Dataflow.GatherScatter:
        return PassConfigs.of(ConvConfig("gather_scatter", epsilon=float(value["epsilon"]),
                                         mm_thresh=int(value["mm_thresh"])))
    if dataflow == Dataflow.FetchOnDemand:
        return PassConfigs.of(ConvConfig("fetch_on_demand"))
    raise NotImplementedError(f"dataflow {dataflow!r} is not available (2.1 has not integrated CodedCSR either)")
