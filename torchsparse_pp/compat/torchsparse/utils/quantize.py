"""torchsparse 2.1's ``sparse_quantize``: torchsparse_pp's, which gives the same result (voxels
``floor(coords / voxel_size)`` as int32, unique, sorted lexicographically; ``index`` = first point
of each voxel; ``inverse`` = each point's voxel)."""
from ....utils.quantize import sparse_quantize

__all__ = ["sparse_quantize"]
