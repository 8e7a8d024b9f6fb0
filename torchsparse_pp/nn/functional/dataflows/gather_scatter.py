"""gather_scatter: per offset, gather to a buffer, one GEMM (or one batched GEMM per group), scatter."""
from .... import ops


def forward(feats, weight, view, config, deterministic):
    src, dst, offsets, identity = view.pairs()
    return ops.gather_scatter_forward(feats, weight, src, dst, offsets, identity, view.num_dst, False,
                                      config.epsilon, config.mm_thresh, deterministic)


def dgrad(grad, weight, view, config, deterministic):
    src, dst, offsets, identity = view.pairs()
    return ops.gather_scatter_forward(grad, weight, dst, src, offsets, identity, view.num_src, True,
                                      config.epsilon, config.mm_thresh, deterministic)


def wgrad(feats, grad, view, config, deterministic):
    src, dst, offsets, identity = view.pairs()
    return ops.gather_scatter_wgrad(feats, grad, src, dst, offsets, identity, deterministic)
