"""torchsparse.utils: make_ntuple, make_tensor, make_divisible, to_dense (and the submodules
quantize, collate, tensor_cache, tune)."""
from .to_dense import to_dense
from .utils import make_divisible, make_ntuple, make_tensor

__all__ = ["make_ntuple", "make_tensor", "make_divisible", "to_dense"]
