"""The passes of a dataflow over an OrientedMap, without autograd: ``forward(feats, weight,
view, config, deterministic)``, ``dgrad(grad, weight, ...)`` and ``wgrad(feats, grad, ...)``.

Each dataflow module defines ``operands(view, pass_name, config, deterministic)`` (the map
tensors a pass reads) and ``run(pass_name, a, b, tensors, num_src, num_dst, config,
deterministic, allow_tf32)`` (the pass computed from them); these compose the two, for callers
that hold a map (benchmarks, the tuner) rather than the operands the conv op carries.
"""
from .... import backends

PASSES = ("forward", "dgrad", "wgrad")


def view_passes(operands, run):
    """(forward, dgrad, wgrad) over an OrientedMap from a dataflow's ``operands`` and ``run``."""

    def make(pass_name):
        def one_pass(a, b, view, config, deterministic):
            tensors = operands(view, pass_name, config, deterministic)
            return run(pass_name, a, b, tensors, view.num_src, view.num_dst, config, deterministic,
                       backends.allow_tf32)
        one_pass.__name__ = one_pass.__qualname__ = pass_name
        one_pass.__doc__ = f"The {pass_name} pass over an OrientedMap (no autograd)."
        return one_pass

    return tuple(make(p) for p in PASSES)
