"""spconv.core names that model code imports (``from spconv.core import ConvAlgo``)."""
from enum import Enum


class ConvAlgo(Enum):
    """spconv's algorithms; each maps to a torchsparse_pp dataflow (pytorch/algo.py)."""
    Native = 0
    MaskImplicitGemm = 1
    MaskSplitImplicitGemm = 2


class AlgoHint(Enum):
    """spconv's GEMM-tuning hints (which pass a kernel serves); the member names are spconv's."""
    NoHint = 0b000
    Fowrard = 0b001
    BackwardInput = 0b010
    BackwardWeight = 0b100
