"""spconv.core names that model code imports (``from spconv.core import ConvAlgo``)."""
from enum import Enum


class ConvAlgo(Enum):
    """spconv's algorithms; each maps to a torchsparse_pp dataflow (pytorch/algo.py)."""
    Native = 0
    MaskImplicitGemm = 1
    MaskSplitImplicitGemm = 2
