"""torch_scatter's functions over torch's own scatter ops (``import torch_scatter`` after
alias('torch_scatter')): scatter and its reductions, segment_coo / segment_csr, gather_coo /
gather_csr, with torch_scatter's signatures, broadcasting, empty-segment values and argument
conventions, on any device. See docs/migrating.md."""
from .scatter import scatter, scatter_add, scatter_max, scatter_mean, scatter_min, scatter_mul, scatter_sum
from .segment_coo import (gather_coo, segment_add_coo, segment_coo, segment_max_coo, segment_mean_coo,
                          segment_min_coo, segment_sum_coo)
from .segment_csr import (gather_csr, segment_add_csr, segment_csr, segment_max_csr, segment_mean_csr,
                          segment_min_csr, segment_sum_csr)

# A local version label: the API is torch_scatter 2.1's, the implementation is torch's scatter ops.
__version__ = "2.1.2+torchsparse_pp"

__all__ = ["scatter", "scatter_sum", "scatter_add", "scatter_mul", "scatter_mean", "scatter_min", "scatter_max",
           "segment_coo", "segment_sum_coo", "segment_add_coo", "segment_mean_coo", "segment_min_coo",
           "segment_max_coo", "gather_coo", "segment_csr", "segment_sum_csr", "segment_add_csr",
           "segment_mean_csr", "segment_min_csr", "segment_max_csr", "gather_csr", "__version__"]
