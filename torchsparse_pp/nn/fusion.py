"""Eval-time fusion: ``fuse(model)`` returns an inference copy of a sparse model in which every
Conv3d followed by BatchNorm (and ReLU) in a Sequential becomes one FusedConv3d (BatchNorm
folded into the weight and bias, ReLU in the conv's epilogue), and blocks that register a fuser
(the models' ResidualBlock: its sum and ReLU go into the second conv's epilogue) are rebuilt
fused. The original model is not changed; the copy refuses training mode.
"""
import copy
from typing import Callable, Dict, Type

from torch import nn

from .modules import BatchNorm, Conv3d, ReLU, SyncBatchNorm
from .modules.fused import FusedConv3d

_FUSERS: Dict[Type[nn.Module], Callable[[nn.Module], nn.Module]] = {}


def register_fuser(cls: Type[nn.Module]):
    """Decorator: ``fn(module) -> fused module`` for modules of class ``cls``."""
    def wrap(fn):
        _FUSERS[cls] = fn
        return fn
    return wrap


def _foldable(module: nn.Module) -> bool:
    return isinstance(module, (BatchNorm, SyncBatchNorm)) and module.track_running_stats


def _fuse_sequential(seq: nn.Sequential) -> nn.Sequential:
    out, items, i = [], list(seq), 0
    while i < len(items):
        m = items[i]
        if isinstance(m, Conv3d):
            norm = items[i + 1] if i + 1 < len(items) and _foldable(items[i + 1]) else None
            j = i + 1 + (norm is not None)
            relu = j < len(items) and isinstance(items[j], ReLU)
            out.append(FusedConv3d(m, norm, relu))
            i = j + relu
            continue
        out.append(fuse_module(m))
        i += 1
    return nn.Sequential(*out)


def fuse_module(module: nn.Module) -> nn.Module:
    """``module`` with its fusable parts fused (in place for containers; used by fuse and by
    registered fusers for their sub-modules)."""
    fuser = _FUSERS.get(type(module))
    if fuser is not None:
        return fuser(module)
    if isinstance(module, nn.Sequential):
        return _fuse_sequential(module)
    for name, child in list(module.named_children()):
        setattr(module, name, fuse_module(child))
    return module


def fuse(model: nn.Module) -> nn.Module:
    """An eval-mode inference copy of ``model`` with Conv3d + BatchNorm (+ ReLU) fused and
    registered blocks (ResidualBlock) fused; ``model`` itself is left as it was."""
    return fuse_module(copy.deepcopy(model).eval()).eval()
