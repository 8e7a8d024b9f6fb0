"""gather_scatter: per offset, gather to a buffer, one GEMM (or one batched GEMM per group), scatter.

Both backends run the GEMMs through torch (MKL / cuBLAS); "triton" does the gathers and
scatter-adds with Triton kernels (see ops/triton/gather_scatter.py). The loop over offsets runs on
the host from the per-offset counts the map keeps there (``OrientedMap.host_counts``), so a call
reads nothing back from the device.
"""
from .... import ops
from ....ops import triton as triton_kernels


def forward(feats, weight, view, config, deterministic):
    src, dst, _, _ = view.pairs()
    offsets, identity = view.host_counts()
    if config.backend == "triton":
        return triton_kernels.load("gather_scatter").forward(feats, weight, src, dst, offsets, identity, view.num_dst,
                                                             False, config.epsilon, config.mm_thresh)
    return ops.gather_scatter_forward(feats, weight, src, dst, offsets, identity, view.num_dst, False,
                                      config.epsilon, config.mm_thresh, deterministic)


def dgrad(grad, weight, view, config, deterministic):
    src, dst, _, _ = view.pairs()
    offsets, identity = view.host_counts()
    if config.backend == "triton":
        return triton_kernels.load("gather_scatter").forward(grad, weight, dst, src, offsets, identity, view.num_src,
                                                             True, config.epsilon, config.mm_thresh)
    return ops.gather_scatter_forward(grad, weight, dst, src, offsets, identity, view.num_src, True,
                                      config.epsilon, config.mm_thresh, deterministic)


def wgrad(feats, grad, view, config, deterministic):
    src, dst, _, _ = view.pairs()
    offsets, identity = view.host_counts()
    if config.backend == "triton":
        return triton_kernels.load("gather_scatter").wgrad(feats, grad, src, dst, offsets, identity)
    return ops.gather_scatter_wgrad(feats, grad, src, dst, offsets, identity, deterministic)
