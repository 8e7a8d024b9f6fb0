"""fetch_on_demand: blocks of destination rows, each offset's pairs in chunks through thread-local
tiles; deterministic by construction. It needs pairs sorted by the rows it writes."""
from .... import ops


def forward(feats, weight, view, config, deterministic):
    src, dst, offsets, identity = view.pairs(sorted_by="dst")
    return ops.fetch_on_demand_forward(feats, weight, src, dst, offsets, identity, view.num_dst, False)


def dgrad(grad, weight, view, config, deterministic):
    src, dst, offsets, identity = view.pairs(sorted_by="src")
    return ops.fetch_on_demand_forward(grad, weight, dst, src, offsets, identity, view.num_src, True)


def wgrad(feats, grad, view, config, deterministic):
    src, dst, offsets, identity = view.pairs()
    return ops.fetch_on_demand_wgrad(feats, grad, src, dst, offsets, identity)
