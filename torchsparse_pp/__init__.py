"""torchsparse_pp: sparse convolution on point clouds for PyTorch.

Importing the package loads the CPU operator library; it never initialises CUDA. On glibc Linux
it also keeps freed heap memory for reuse (utils/malloc.py; TSPP_KEEP_FREED_MEMORY=0 turns that
off).
"""
from .version import __version__
from . import ops  # noqa: F401  (registers torch.ops.torchsparse_pp.*)
from .tensor import SparseTensor
from .operators import cat
from . import backends, nn, utils  # noqa: E402

utils.malloc.apply_default()
backends.cpu_kernels  # noqa: B018  (reads the CPU kernels' choice once, outside any compiled graph)

__all__ = ["SparseTensor", "cat", "backends", "nn", "utils", "__version__"]
