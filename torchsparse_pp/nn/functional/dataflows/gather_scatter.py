"""gather_scatter: per offset, gather to a buffer, one GEMM (or one batched GEMM per group), scatter.

Both backends run the GEMMs through torch (MKL / cuBLAS); "triton" does the gathers and
scatter-adds with Triton kernels (see ops/triton/gather_scatter.py). The loop over offsets runs on
the host from the per-offset counts the map keeps there (``OrientedMap.host_counts``), so a call
reads nothing back from the device. Every pass reads the same pairs (dgrad with the roles of
source and destination swapped).
"""
from .... import ops
from ....ops.triton import library as triton_ops
from ....utils.cpu_bf16 import bf16_gemm_emulated
from .passes import view_passes


def operands(view, pass_name, config, deterministic):
    src, dst, _, _ = view.pairs()
    offsets, identity = view.host_counts()
    if pass_name == "dgrad":
        src, dst = dst, src
    return [src, dst, offsets, identity]


def run(pass_name, a, b, tensors, num_src, num_dst, config, deterministic, allow_tf32):
    src, dst, offsets, identity = tensors
    # Where ATen's bfloat16 GEMM is its slow reference loop, the CPU op's deterministic path
    # multiplies float tiles instead (the same bfloat16 operands, float sums).
    deterministic = deterministic or bf16_gemm_emulated(a)
    if pass_name == "wgrad":
        if config.backend == "triton":
            return triton_ops.gather_scatter_wgrad(a, b, src, dst, offsets, identity)
        return ops.gather_scatter_wgrad(a, b, src, dst, offsets, identity, deterministic)
    transpose = pass_name == "dgrad"
    rows = num_src if transpose else num_dst
    if config.backend == "triton":
        return triton_ops.gather_scatter_forward(a, b, src, dst, offsets, identity, rows, transpose, config.epsilon,
                                                 config.mm_thresh)
    return ops.gather_scatter_forward(a, b, src, dst, offsets, identity, rows, transpose, config.epsilon,
                                      config.mm_thresh, deterministic)


forward, dgrad, wgrad = view_passes(operands, run)
