"""Drop-in adapters for code written against spconv 2.x, torchsparse 2.1 and torch_scatter.

    from torchsparse_pp.compat import alias
    alias("spconv")         # then: import spconv.pytorch as spconv  (unchanged model code)
    alias("torchsparse")    # then: import torchsparse, torchsparse.nn as spnn, ...
    alias("torch_scatter")  # then: import torch_scatter (scatter_mean, segment_csr, ...)

or without aliases: ``from torchsparse_pp.compat import spconv, torchsparse, torch_scatter``.

Each adapter keeps its peer's names, parameter layouts and semantics (docs/migrating.md); the
native ``torchsparse_pp`` API is unchanged by them.
"""
import importlib

from .aliasing import install, installed

_PEERS = {"spconv": ("torchsparse_pp.compat.spconv", "spconv"),
          "torchsparse": ("torchsparse_pp.compat.torchsparse", "torchsparse"),
          "torch_scatter": ("torchsparse_pp.compat.torch_scatter", "torch_scatter")}


def alias(name: str) -> None:
    """Registers ``name`` ('spconv', 'torchsparse' or 'torch_scatter') as an alias of its adapter
    package."""
    if name not in _PEERS:
        raise ValueError(f"alias() knows {sorted(_PEERS)}, got {name!r}")
    target, real = _PEERS[name]
    install(name, target, real)


def __getattr__(name: str):
    if name in _PEERS:
        return importlib.import_module(_PEERS[name][0])
    raise AttributeError(f"module 'torchsparse_pp.compat' has no attribute {name!r}")


__all__ = ["alias", "installed", "spconv", "torchsparse", "torch_scatter"]
