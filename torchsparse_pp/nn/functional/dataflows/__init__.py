"""The dataflows and the autograd Function that runs each pass with its configured dataflow.

Every dataflow module exposes forward(feats, weight, view, config, deterministic),
dgrad(grad, weight, view, ...) and wgrad(feats, grad, view, ...) over an OrientedMap.
"""
import torch

from . import fetch_on_demand, gather_scatter, implicit_gemm
from .oriented import OrientedMap

DATAFLOW_MODULES = {
    "gather_scatter": gather_scatter,
    "fetch_on_demand": fetch_on_demand,
    "implicit_gemm": implicit_gemm,
}


class SparseConvFunction(torch.autograd.Function):
    """Sparse conv over a kernel map; forward, dgrad and wgrad each run their own config."""

    @staticmethod
    def forward(ctx, feats, weight, view: OrientedMap, configs, deterministic: bool):
        ctx.save_for_backward(feats, weight)
        ctx.view, ctx.configs, ctx.deterministic = view, configs, deterministic
        flow = DATAFLOW_MODULES[configs.forward.dataflow]
        return flow.forward(feats, weight, view, configs.forward, deterministic)

    @staticmethod
    def backward(ctx, grad_out):
        feats, weight = ctx.saved_tensors
        view, configs, deterministic = ctx.view, ctx.configs, ctx.deterministic
        grad_out = grad_out.contiguous()
        grad_feats = grad_weight = None
        if ctx.needs_input_grad[0]:
            flow = DATAFLOW_MODULES[configs.dgrad.dataflow]
            grad_feats = flow.dgrad(grad_out, weight, view, configs.dgrad, deterministic)
        if ctx.needs_input_grad[1]:
            flow = DATAFLOW_MODULES[configs.wgrad.dataflow]
            grad_weight = flow.wgrad(feats, grad_out, view, configs.wgrad, deterministic)
        return grad_feats, grad_weight, None, None, None


__all__ = ["DATAFLOW_MODULES", "OrientedMap", "SparseConvFunction"]
