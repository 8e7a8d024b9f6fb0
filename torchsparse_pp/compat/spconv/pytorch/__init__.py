"""``spconv.pytorch`` over torchsparse_pp: SparseConvTensor, the conv / pool modules (1-, 2- and
3-D), SparseSequential and helpers, with spconv's parameter layouts and output row order."""
from . import functional
from ..core import ConvAlgo
from .conv import (SparseConv1d, SparseConv2d, SparseConv3d, SparseConvolution, SparseConvTranspose1d,
                   SparseConvTranspose2d, SparseConvTranspose3d, SparseInverseConv1d, SparseInverseConv2d,
                   SparseInverseConv3d, SubMConv1d, SubMConv2d, SubMConv3d)
from .modules import (Identity, RemoveGrid, SparseBatchNorm, SparseIdentity, SparseModule, SparseReLU,
                      SparseSequential, SparseSyncBatchNorm, ToDense, assign_name_for_sparse_modules)
from .pool import (SparseAvgPool1d, SparseAvgPool2d, SparseAvgPool3d, SparseGlobalAvgPool, SparseGlobalMaxPool,
                   SparseMaxPool1d, SparseMaxPool2d, SparseMaxPool3d)
from .tables import AddTable, ConcatTable, JoinTable
from .tensor import SparseConvTensor

__all__ = [
    "SparseConvTensor", "ConvAlgo", "functional", "SparseConvolution",
    "SubMConv1d", "SubMConv2d", "SubMConv3d", "SparseConv1d", "SparseConv2d", "SparseConv3d",
    "SparseConvTranspose1d", "SparseConvTranspose2d", "SparseConvTranspose3d",
    "SparseInverseConv1d", "SparseInverseConv2d", "SparseInverseConv3d",
    "SparseMaxPool1d", "SparseMaxPool2d", "SparseMaxPool3d", "SparseAvgPool1d", "SparseAvgPool2d",
    "SparseAvgPool3d", "SparseGlobalMaxPool", "SparseGlobalAvgPool",
    "SparseModule", "SparseSequential", "SparseBatchNorm", "SparseSyncBatchNorm", "SparseReLU",
    "SparseIdentity", "Identity", "ToDense", "RemoveGrid", "assign_name_for_sparse_modules",
    "AddTable", "ConcatTable", "JoinTable",
]
