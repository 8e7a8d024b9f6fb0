"""fetch_on_demand: each offset's pairs fetched, multiplied and added chunk by chunk, no buffers.

native (CPU): blocks of destination rows, each offset's pairs in chunks through thread-local
tiles; deterministic by construction. It needs pairs sorted by the rows it writes.
native (CUDA) and triton: one fused launch over every offset's pairs with atomic adds; in
deterministic mode a variant that owns its destination rows and adds the offsets in order
(csrc/cuda/fetch_on_demand, ops/triton). The native CUDA weight gradient is deterministic by
construction; Triton's sums chunks with atomics unless deterministic.

``operands`` picks the map tensors a pass reads (built and cached on the map); ``run`` computes
the pass from them (see dataflows/__init__.py).
"""
from .... import ops
from ....ops.triton import library as triton_ops
from .passes import view_passes


def operands(view, pass_name, config, deterministic):
    if pass_name == "wgrad":
        src, dst, offsets, identity = view.pairs()
        return [src, dst, offsets, identity]
    rows = "dst" if pass_name == "forward" else "src"   # the rows this pass writes
    if config.backend == "triton" and deterministic:
        return [view.table(rows)]
    src, dst, offsets, identity = view.pairs(sorted_by=rows)
    if rows == "src":
        src, dst = dst, src   # dgrad reads the conv's destinations and writes its sources
    return [src, dst, offsets, identity]


def run(pass_name, a, b, tensors, num_src, num_dst, config, deterministic, allow_tf32):
    if pass_name == "wgrad":
        src, dst, offsets, identity = tensors
        if config.backend == "triton":
            return triton_ops.fetch_on_demand_wgrad(a, b, src, dst, offsets, config.tile, allow_tf32, deterministic)
        return ops.fetch_on_demand_wgrad(a, b, src, dst, offsets, identity, allow_tf32)
    transpose = pass_name == "dgrad"
    rows = num_src if transpose else num_dst
    if config.backend == "triton":
        if deterministic:
            return triton_ops.fetch_on_demand_forward_owned(a, b, tensors[0], rows, transpose, config.tile, allow_tf32)
        src, dst, offsets, _ = tensors
        return triton_ops.fetch_on_demand_forward(a, b, src, dst, offsets, rows, transpose, config.tile, allow_tf32)
    src, dst, offsets, identity = tensors
    return ops.fetch_on_demand_forward(a, b, src, dst, offsets, identity, rows, transpose, deterministic, allow_tf32)


forward, dgrad, wgrad = view_passes(operands, run)
