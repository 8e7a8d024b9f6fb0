"""fetch_on_demand: each offset's pairs fetched, multiplied and added chunk by chunk, no buffers.

native (CPU): blocks of destination rows, each offset's pairs in chunks through thread-local
tiles; deterministic by construction. It needs pairs sorted by the rows it writes.
native (CUDA) and triton: one fused launch over every offset's pairs with atomic adds; in
deterministic mode a variant that owns its destination rows and adds the offsets in order
(csrc/cuda/fetch_on_demand, ops/triton). The native CUDA weight gradient is deterministic by
construction; Triton's sums chunks with atomics unless deterministic.
"""
from .... import backends, ops
from ....ops import triton as triton_kernels


def _triton_forward(feats, weight, view, rows, transposed_weight, config, deterministic):
    kernels = triton_kernels.load("fetch_on_demand")
    num_dst = view.num_dst if rows == "dst" else view.num_src
    if deterministic:
        return kernels.forward_owned(feats, weight, view.table(rows), num_dst, transposed_weight, config.tile,
                                     backends.allow_tf32)
    src, dst, offsets, _ = view.pairs(sorted_by=rows)
    if rows == "src":
        src, dst = dst, src
    return kernels.forward(feats, weight, src, dst, offsets, num_dst, transposed_weight, config.tile,
                           backends.allow_tf32)


def forward(feats, weight, view, config, deterministic):
    if config.backend == "triton":
        return _triton_forward(feats, weight, view, "dst", False, config, deterministic)
    src, dst, offsets, identity = view.pairs(sorted_by="dst")
    return ops.fetch_on_demand_forward(feats, weight, src, dst, offsets, identity, view.num_dst, False, deterministic,
                                       backends.allow_tf32)


def dgrad(grad, weight, view, config, deterministic):
    if config.backend == "triton":
        return _triton_forward(grad, weight, view, "src", True, config, deterministic)
    src, dst, offsets, identity = view.pairs(sorted_by="src")
    return ops.fetch_on_demand_forward(grad, weight, dst, src, offsets, identity, view.num_src, True, deterministic,
                                       backends.allow_tf32)


def wgrad(feats, grad, view, config, deterministic):
    src, dst, offsets, identity = view.pairs()
    if config.backend == "triton":
        return triton_kernels.load("fetch_on_demand").wgrad(feats, grad, src, dst, offsets, config.tile,
                                                            backends.allow_tf32, deterministic)
    return ops.fetch_on_demand_wgrad(feats, grad, src, dst, offsets, identity, backends.allow_tf32)
