"""torchsparse 2.1 surface over torchsparse_pp (``import torchsparse`` after alias('torchsparse')):
2.1's SparseTensor, nn modules and functional API with 2.1's semantics (offset order, 1x1 layout,
default padding, output clipping), utils, backbones and ``tune``. See docs/migrating.md."""
from . import backend, backends, nn, utils
from .operators import cat, generative_add
from .tensor import PointTensor, SparseTensor
from .utils import collate, quantize, tensor_cache  # noqa: F401  (importable as attributes, as in 2.1)
from .utils.tune import tune
from . import backbones  # noqa: E402

# A local version label: the API is torchsparse 2.1's, the implementation is not torchsparse.
__version__ = "2.1.0+torchsparse_pp"

__all__ = ["SparseTensor", "PointTensor", "cat", "generative_add", "tune", "backend", "backends", "nn", "utils",
           "backbones", "__version__"]
