"""The dataflows and the sparse-conv custom op that runs each pass with its configured dataflow.

Every dataflow module exposes ``operands(view, pass_name, config, deterministic)``: the tensors
of an OrientedMap a pass reads (pair lists, tables, plans; built once and cached on the map),
and ``run(pass_name, a, b, tensors, num_src, num_dst, config, deterministic, allow_tf32)``: the
pass computed from those tensors alone. ``forward`` / ``dgrad`` / ``wgrad(a, b, view, config,
deterministic)`` compose the two (passes.py).

``torchsparse_pp::sparse_conv`` is one torch.library custom op per conv call. It takes the
features, the weight and the operands of all three passes as tensors (the backward passes'
operands only when autograd will need them), so autograd, torch.compile and torch.export see a
pure function of tensors: nothing in the backward touches the kernel-map cache.

Eager calls take ``_SparseConvFunction`` instead: the same passes on the same operands through a
plain autograd.Function. The custom op's autograd wrapper flattens every argument list on each
call, which cost ~0.35 ms per conv forward + backward (about half of a small conv's time on a
CPU); graphs (torch.compile, torch.export) keep the op.
"""
from typing import List

import torch
from torch.autograd.function import once_differentiable

from ..config import PassConfigs, configs_from_text
from . import fetch_on_demand, gather_scatter, implicit_gemm
from .oriented import OrientedMap
from .passes import PASSES

DATAFLOW_MODULES = {
    "gather_scatter": gather_scatter,
    "fetch_on_demand": fetch_on_demand,
    "implicit_gemm": implicit_gemm,
}

def _run_pass(pass_name, a, b, tensors, num_src, num_dst, configs, deterministic, allow_tf32):
    cfg = getattr(configs, pass_name)
    return DATAFLOW_MODULES[cfg.dataflow].run(pass_name, a, b, tensors, num_src, num_dst, cfg, deterministic,
                                             allow_tf32)


@torch.library.custom_op("torchsparse_pp::sparse_conv", mutates_args=())
def sparse_conv_op(feats: torch.Tensor, weight: torch.Tensor, forward_operands: List[torch.Tensor],
                   dgrad_operands: List[torch.Tensor], wgrad_operands: List[torch.Tensor], num_src: int, num_dst: int,
                   configs: str, deterministic: bool, allow_tf32: bool) -> torch.Tensor:
    """``out [num_dst, C_out]`` of a sparse conv with ``weight [K, C_in, C_out]`` over ``feats
    [num_src, C_in]``: the forward pass of ``configs`` (config.configs_to_text) on ``forward_operands``.
    ``dgrad_operands`` / ``wgrad_operands`` are what its backward reads (empty when that gradient
    is not needed)."""
    return _run_pass("forward", feats, weight, forward_operands, num_src, num_dst, configs_from_text(configs),
                     deterministic, allow_tf32)


@sparse_conv_op.register_fake
def _(feats, weight, forward_operands, dgrad_operands, wgrad_operands, num_src, num_dst, configs, deterministic,
      allow_tf32):
    return feats.new_empty(num_dst, weight.shape[2])


def _save(ctx, feats, weight, dgrad_operands, wgrad_operands, args):
    """What the backward passes read: feats for wgrad, the weight for dgrad, their operands."""
    ctx.save_for_backward(feats if wgrad_operands else None, weight if dgrad_operands else None, *dgrad_operands,
                          *wgrad_operands)
    ctx.split = len(dgrad_operands)
    ctx.args = args  # (num_src, num_dst, configs, deterministic, allow_tf32)


def _gradients(ctx, grad_out):
    """(input gradient, weight gradient) of the conv saved by _save; None where not needed."""
    feats, weight, *operands = ctx.saved_tensors
    dgrad_operands, wgrad_operands = operands[:ctx.split], operands[ctx.split:]
    grad_out = grad_out.contiguous()
    grad_feats = grad_weight = None
    if ctx.needs_input_grad[0]:
        if not dgrad_operands:
            raise RuntimeError("sparse_conv: the input gradient was not planned for (the features did not require "
                               "grad when the conv ran)")
        grad_feats = _run_pass("dgrad", grad_out, weight, dgrad_operands, *ctx.args)
    if ctx.needs_input_grad[1]:
        if not wgrad_operands:
            raise RuntimeError("sparse_conv: the weight gradient was not planned for (the weight did not require "
                               "grad when the conv ran)")
        grad_weight = _run_pass("wgrad", feats, grad_out, wgrad_operands, *ctx.args)
    return grad_feats, grad_weight


def _setup_context(ctx, inputs, output):
    feats, weight, forward_operands, dgrad_operands, wgrad_operands = inputs[:5]
    num_src, num_dst, configs, deterministic, allow_tf32 = inputs[5:]
    _save(ctx, feats, weight, dgrad_operands, wgrad_operands,
          (num_src, num_dst, configs_from_text(configs), deterministic, allow_tf32))
    ctx.lengths = (len(forward_operands), len(dgrad_operands), len(wgrad_operands))


def _backward(ctx, grad_out):
    # One entry per input: a list of Nones for each operand list (indices have no gradient).
    return (*_gradients(ctx, grad_out), *([None] * n for n in ctx.lengths), None, None, None, None, None)


sparse_conv_op.register_autograd(_backward, setup_context=_setup_context)


class _SparseConvFunction(torch.autograd.Function):
    """The eager form of sparse_conv_op (see the module docstring): ``configs`` is a PassConfigs."""

    @staticmethod
    def forward(ctx, feats, weight, forward_operands, dgrad_operands, wgrad_operands, num_src, num_dst, configs,
                deterministic, allow_tf32):
        args = (num_src, num_dst, configs, deterministic, allow_tf32)
        _save(ctx, feats, weight, dgrad_operands, wgrad_operands, args)
        return _run_pass("forward", feats, weight, forward_operands, *args)

    @staticmethod
    @once_differentiable  # the passes have no derivatives of their own: a double backward raises
    def backward(ctx, grad_out):
        return (*_gradients(ctx, grad_out), None, None, None, None, None, None, None, None)


def sparse_conv(feats: torch.Tensor, weight: torch.Tensor, view: OrientedMap, configs: PassConfigs, text: str,
                deterministic: bool, allow_tf32: bool) -> torch.Tensor:
    """The conv over ``view`` with the operands of the passes autograd will run (the input
    gradient when ``feats`` requires grad, the weight gradient when ``weight`` does): through the
    custom op while compiling or exporting, else through _SparseConvFunction (or, with no
    gradient to plan for, the forward pass alone). ``text`` is ``configs_to_text(configs)``."""
    grad = torch.is_grad_enabled()
    needed = {"forward": True, "dgrad": grad and feats.requires_grad, "wgrad": grad and weight.requires_grad}
    operands = [DATAFLOW_MODULES[cfg.dataflow].operands(view, p, cfg, deterministic) if needed[p] else []
                for p, cfg in zip(PASSES, configs)]
    if torch.compiler.is_compiling():  # torch.compile and torch.export (strict or not)
        return sparse_conv_op(feats, weight, *operands, view.num_src, view.num_dst, text, deterministic, allow_tf32)
    if not (needed["dgrad"] or needed["wgrad"]):  # nothing for autograd to record
        return _run_pass("forward", feats, weight, operands[0], view.num_src, view.num_dst, configs, deterministic,
                         allow_tf32)
    return _SparseConvFunction.apply(feats, weight, *operands, view.num_src, view.num_dst, configs, deterministic,
                                     allow_tf32)


def identity_pairs(n: int, device) -> List[torch.Tensor]:
    """(src, dst, offsets, identity) of one identity offset over ``n`` rows: row i to row i."""
    rows = torch.arange(n, dtype=torch.int32, device=device)
    return [rows, rows, torch.tensor([0, n], dtype=torch.int64, device=device),
            torch.ones(1, dtype=torch.bool, device=device)]


def identity_pairs_conv(feats: torch.Tensor, weight: torch.Tensor, configs: PassConfigs, deterministic: bool,
                        allow_tf32: bool) -> torch.Tensor:
    """A 1x1x1 conv (output row i reads input row i) in eager mode, all three passes by
    fetch_on_demand over identity pairs (``configs`` must name it for every pass)."""
    n = feats.shape[0]
    pairs = identity_pairs(n, feats.device)
    grad = torch.is_grad_enabled()
    dgrad, wgrad = grad and feats.requires_grad, grad and weight.requires_grad
    return _SparseConvFunction.apply(feats, weight, pairs, pairs if dgrad else [], pairs if wgrad else [], n, n,
                                     configs, deterministic, allow_tf32)


__all__ = ["DATAFLOW_MODULES", "OrientedMap", "PASSES", "identity_pairs", "identity_pairs_conv", "sparse_conv",
           "sparse_conv_op"]
