"""spconv's ``algo=`` mapped to torchsparse_pp dataflows.

Native is spconv's gather-GEMM-scatter; MaskImplicitGemm / MaskSplitImplicitGemm are its sorted
implicit GEMM with one / two mask splits. ``algo=None`` leaves the choice to torchsparse_pp
(per-layer ``config``, the global default, or a tuned file)."""
from typing import Optional

from ....nn.functional.config import ConvConfig
from ..core import ConvAlgo

DATAFLOW_OF_ALGO = {
    ConvAlgo.Native: ConvConfig("gather_scatter"),
    ConvAlgo.MaskImplicitGemm: ConvConfig("implicit_gemm", sorted=True, split_mask_num=1),
    ConvAlgo.MaskSplitImplicitGemm: ConvConfig("implicit_gemm", sorted=True, split_mask_num=2),
}


def as_algo(algo) -> Optional[ConvAlgo]:
    """Our ConvAlgo for ``algo`` (ours, or an enum member of the same name from elsewhere)."""
    if algo is None or isinstance(algo, ConvAlgo):
        return algo
    name = getattr(algo, "name", algo)
    if isinstance(name, str) and name in ConvAlgo.__members__:
        return ConvAlgo[name]
    raise ValueError(f"algo must be a spconv ConvAlgo ({', '.join(ConvAlgo.__members__)}) or None, got {algo!r}")


def default_algo(kernel_volume: int, large_kernel_fast_algo: bool) -> ConvAlgo:
    """The algo spconv 2.3.8's GPU build picks when none is given (recorded for indice_key checks)."""
    limit = 128 if large_kernel_fast_algo else 32
    return ConvAlgo.MaskImplicitGemm if kernel_volume <= limit else ConvAlgo.Native


def config_of(algo: Optional[ConvAlgo]) -> Optional[ConvConfig]:
    return None if algo is None else DATAFLOW_OF_ALGO[algo]
