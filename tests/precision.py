"""Error models for results computed in a reduced precision or in another order.

A fixed tolerance on such a result fails for some seeds: where an output is a sum that cancels
to almost nothing, its relative error grows by the cancellation, whatever the precision. So a
reduced-precision result is held to the error of the same computation done the plain way in the
same precision, both measured against the float64 reference (the rule of flash-attention's tests):

    err(ours, ref64) <= factor * err(plain, ref64) + floor

with err the norm-wise relative error. The plain way of a sparse conv is its exact sum of the
operands it is given (autocast's bfloat16 ones), rounded once to their dtype: the best any
kernel of that precision can do. ``plain_sparse_convs()`` makes every conv of the library compute
so (forward and backward), so a whole model can be run the plain way, with every other layer as
it is. A float32 sum in another order is held to the same sum over absolute values instead
(dataflow_cases.rel_to): its error is relative to the size of its terms.
"""
import contextlib
import json
import os
from typing import Iterable, Mapping, Optional

import torch

# Our kernels round where the plain conv rounds (operands, output) and may round once more (the
# bias added to a rounded output, fp32 partial sums): measured ratios over 200+ seeds stay under
# 1.6 on whole models and single convs (tools/seed_sweep.py), 2 leaves room.
FACTOR = 2.0
# bfloat16's unit roundoff (8 significant bits, round to nearest): one rounding of a result
# moves it by at most this much relative to itself, element-wise and so norm-wise.
BF16_ROUNDING = 2.0 ** -8
# What both may differ by where the plain error is zero or float32-sized (max pools, float32 tails).
FLOOR = 1e-5
# A result of fewer elements (a loss, a narrow layer's norm parameters) has a norm-wise error of a
# few rounding draws, whose ratio to the plain computation's has no useful bound (over 200 seeds of
# a bf16 MinkUNet training step: up to 19 for a scalar, 5 for 4 elements). Such results are held
# to the rule together: the root mean square of their relative errors (a lone scalar, such as a
# loss, is better checked as a function of a larger result).
MIN_ELEMENTS = 32


def rel_err(a: torch.Tensor, b: torch.Tensor, scale: Optional[torch.Tensor] = None) -> float:
    """||a - b|| / ||scale|| (scale defaults to b), in float64."""
    a, b = a.detach().double(), b.detach().double()
    scale = b if scale is None else scale.detach().double()
    return ((a - b).norm() / scale.norm().clamp(min=1e-30)).item()


def plain_errors(ours, plain, reference) -> dict:
    """{name: (err(ours), err(plain))} against the float64 reference, for tensors or dicts of them."""
    if not isinstance(reference, Mapping):
        ours, plain, reference = {"": ours}, {"": plain}, {"": reference}
    assert ours.keys() == plain.keys() == reference.keys()
    return {k: (rel_err(ours[k], reference[k]), rel_err(plain[k], reference[k])) for k in reference}


def log_errors(what: str, errors: dict) -> None:
    """With TSPP_ERROR_LOG=FILE, one JSON line per check (the test, the errors): what the factors
    above were measured from, over many seeds (tools/seed_sweep.py)."""
    path = os.environ.get("TSPP_ERROR_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"test": os.environ.get("PYTEST_CURRENT_TEST", ""), "what": what,
                                "errors": errors}) + "\n")


def assert_as_accurate_as_plain(ours, plain, reference, factor: float = FACTOR, floor: float = FLOOR,
                                what: str = "", jointly: Iterable[str] = ()) -> dict:
    """The error rule above, for tensors or dicts of tensors; returns the errors.

    ``jointly``: names held to the rule together, by the root mean square of their relative
    errors: the parameter gradients of a training step through a deep network, whose errors are
    upstream rounding carried through every layer, a few random draws however many elements a
    gradient has (a bf16 MinkUNet step, 200 seeds: one layer's gradient up to 4.6 x the plain
    step's, the mean square over all layers 1.15 x at most). Each layer's gradients are held to
    the rule alone in the single-layer tests. Results of fewer than MIN_ELEMENTS elements are
    held to it together too."""
    errors = plain_errors(ours, plain, reference)
    sizes = {k: v.numel() for k, v in (reference.items() if isinstance(reference, Mapping) else [("", reference)])}
    jointly = [k for k in errors if k in set(jointly)]
    small = [k for k in errors if k not in jointly and sizes[k] < MIN_ELEMENTS]
    for group, name in ((jointly, f"{len(jointly)} results jointly"),
                        (small, f"{len(small)} results of < {MIN_ELEMENTS} elements")):
        if len(group) > 1:
            pairs = [errors.pop(k) for k in group]
            errors[name] = tuple((sum(e[i] ** 2 for e in pairs) / len(pairs)) ** 0.5 for i in (0, 1))
    log_errors(what, errors)
    bad = {k: e for k, e in errors.items() if not e[0] <= factor * e[1] + floor}
    assert not bad, (f"{what}: errors (ours, plain) above {factor} x plain + {floor}: "
                     + ", ".join(f"{k or 'output'} {a:.3g} vs {p:.3g}" for k, (a, p) in bad.items()))
    return errors


def assert_rounded_once(ours, reference, rounding: float = BF16_ROUNDING, floor: float = FLOOR,
                        what: str = "") -> dict:
    """A result that at most one rounding to a precision of unit roundoff ``rounding`` separates
    from the float64 reference (exact inputs, a pointwise op or a sum in float32 and one rounding
    of the result): norm-wise within ``rounding``. Tensors or dicts of tensors."""
    if not isinstance(reference, Mapping):
        ours, reference = {"": ours}, {"": reference}
    errors = {k: (rel_err(ours[k], reference[k]), rounding) for k in reference}
    log_errors(what, errors)
    bad = {k: e for k, (e, _) in errors.items() if not e <= rounding + floor}
    assert not bad, f"{what}: errors above one rounding ({rounding:.3g}): " + ", ".join(
        f"{k or 'output'} {e:.3g}" for k, e in bad.items())
    return errors


def assert_as_accurate_as_rounded(ours, exact, factor: float = FACTOR, floor: float = FLOOR,
                                  what: str = "") -> dict:
    """Results whose operands are exact in their dtype (bf16 / fp16 features and weights): the
    plain computation is the float64 result rounded once to that dtype."""
    if not isinstance(exact, Mapping):
        ours, exact = {"": ours}, {"": exact}
    plain = {k: exact[k].to(ours[k].dtype) for k in exact}
    return assert_as_accurate_as_plain(ours, plain, exact, factor, floor, what)


def _exact_pairs_conv(feats: torch.Tensor, weight: torch.Tensor, src: torch.Tensor, dst: torch.Tensor,
                      offsets, num_dst: int) -> torch.Tensor:
    """sum over offsets k and their pairs of feats[src] @ weight[k], in float64 (differentiable)."""
    f, w = feats.double(), weight.double()
    out = f.new_zeros(num_dst, w.shape[2])
    for k in range(w.shape[0]):
        lo, hi = offsets[k], offsets[k + 1]
        if hi > lo:
            out = out.index_add(0, dst[lo:hi].long(), f[src[lo:hi].long()] @ w[k])
    return out


def _exact_epilogue(out: torch.Tensor, dtype: torch.dtype, bias, epilogue) -> torch.Tensor:
    """Bias, residual (as the kernels read it: in the features' dtype) and ReLU in float64, then
    the one rounding to ``dtype``."""
    if bias is not None:
        out = out + bias.double()
    if epilogue is not None:
        if epilogue.residual is not None:
            out = out + epilogue.residual.to(dtype).double()
        if epilogue.relu:
            out = torch.relu(out)
    return out.to(dtype)


def _plain_run(configs, text, feats, weight, bias, kmap, transposed, epilogue):
    from torchsparse_pp.nn.functional.dataflows import OrientedMap

    view = OrientedMap(kmap, transposed)
    src, dst, offsets, _ = view.pairs()
    with torch.autocast(feats.device.type, enabled=False):
        out = _exact_pairs_conv(feats, weight, src, dst, offsets.tolist(), view.num_dst)
        return _exact_epilogue(out, feats.dtype, bias, epilogue)


def _plain_pointwise(configs, feats, weight, bias, epilogue):
    with torch.autocast(feats.device.type, enabled=False):
        return _exact_epilogue(feats.double() @ weight[0].double(), feats.dtype, bias, epilogue)


@contextlib.contextmanager
def plain_sparse_convs():
    """Inside, every sparse conv of the library (modules, functional, fused layers) computes its
    output exactly from its operands and rounds it once to their dtype; its backward is that
    computation's (exact gradients, rounded once where they meet the operands' dtype)."""
    from torchsparse_pp.nn.functional import conv as conv_module

    saved = conv_module._run, conv_module.pointwise_forward
    conv_module._run, conv_module.pointwise_forward = _plain_run, _plain_pointwise
    try:
        yield
    finally:
        conv_module._run, conv_module.pointwise_forward = saved
