"""Python wrappers of the compiled operators ``torch.ops.torchsparse_pp.*``, with fake kernels.

The wrappers document the operators; argument checking that users need lives in the
``nn.functional`` layer above, and the kernels check their own invariants.
"""
from ._library import load_library

load_library()

from .gather_scatter import gather_scatter_forward, gather_scatter_wgrad  # noqa: E402
from .hash import hash_build, hash_query  # noqa: E402
from .kmap import kmap_downsample, kmap_generative, kmap_out_in, kmap_pairs  # noqa: E402

__all__ = [
    "hash_build", "hash_query", "kmap_out_in", "kmap_downsample", "kmap_generative", "kmap_pairs",
    "gather_scatter_forward", "gather_scatter_wgrad",
]
