"""Python wrappers of the compiled operators ``torch.ops.torchsparse_pp.*``, with fake kernels.

The wrappers document the operators; argument checking that users need lives in the
``nn.functional`` layer above, and the kernels check their own invariants.
"""
from ._library import load_library

load_library()

from .batch_norm import batch_norm_apply, batch_norm_apply_masked, batch_norm_backward, batch_norm_stats  # noqa: E402
from .fetch_on_demand import fetch_on_demand_forward, fetch_on_demand_wgrad  # noqa: E402
from .fused import (cpu_bf16_dot, cpu_register_isa, cpu_register_kernels, cpu_set_register_isa,  # noqa: E402
                    fetch_on_demand_forward_fused)
from .gather_scatter import gather_scatter_forward, gather_scatter_wgrad  # noqa: E402
from .hash import hash_build, hash_query  # noqa: E402
from .implicit_gemm import (implicit_gemm_forward, implicit_gemm_forward_grouped, implicit_gemm_row_groups,  # noqa: E402
                            implicit_gemm_wgrad)
from .kmap import (kmap_downsample, kmap_generative, kmap_out_in, kmap_pairs, kmap_plan,  # noqa: E402
                   kmap_submanifold, kmap_transpose)
from .norm import sample_group_norm  # noqa: E402
from .pooling import pool_pairs_max, pool_pairs_mean, segment_max, segment_mean  # noqa: E402

__all__ = [
    "hash_build", "hash_query", "kmap_out_in", "kmap_submanifold", "kmap_downsample", "kmap_generative", "kmap_pairs",
    "kmap_transpose", "kmap_plan", "gather_scatter_forward", "gather_scatter_wgrad",
    "fetch_on_demand_forward", "fetch_on_demand_wgrad", "implicit_gemm_forward", "implicit_gemm_wgrad",
    "implicit_gemm_row_groups", "implicit_gemm_forward_grouped",
    "fetch_on_demand_forward_fused", "cpu_bf16_dot", "cpu_register_kernels", "cpu_register_isa",
    "cpu_set_register_isa", "pool_pairs_max", "pool_pairs_mean",
    "segment_max", "segment_mean", "sample_group_norm", "batch_norm_stats", "batch_norm_apply", "batch_norm_backward",
    "batch_norm_apply_masked",
]
