"""What follows a convolution in an eval-time fused layer: ``act(conv + bias + residual)``.

On the CPU, native fetch_on_demand runs the epilogue inside its kernel, on each block of output
rows while the block is in cache (no extra pass over the output); everywhere else, and whenever
autograd needs the graph, the same sums run as torch ops after the conv. Both give the result
of the unfused layers up to float rounding.
"""
from dataclasses import dataclass
from typing import Optional

import torch

from ... import backends, ops
from ...ops.triton import load as triton_load
from ...ops.triton import runtime as triton_runtime
from ...utils.cpu_bf16 import bf16_gemm_emulated, linear_float32
from .config import PassConfigs
from .cpu_half import computes_in_float32, widened
from .dataflows import identity_pairs, identity_pairs_conv, sparse_conv


@dataclass(frozen=True)
class Epilogue:
    """``residual``: features ``[N_out, C_out]`` added after the bias (a residual block's
    shortcut); ``relu``: apply ReLU last."""
    residual: Optional[torch.Tensor] = None
    relu: bool = False

    def check(self, channels: int, device: torch.device) -> None:
        r = self.residual
        if r is None:
            return
        if not isinstance(r, torch.Tensor) or r.dim() != 2 or r.shape[1] != channels:
            raise ValueError(f"epilogue residual must be [N_out, {channels}] features, got "
                             f"{list(r.shape) if isinstance(r, torch.Tensor) else type(r).__name__}")
        if r.device != device:
            raise ValueError(f"epilogue residual is on {r.device} but the input is on {device}")

    def _residual_for(self, out: torch.Tensor) -> Optional[torch.Tensor]:
        r = self.residual
        if r is None:
            return None
        if r.shape[0] != out.shape[0]:
            raise ValueError(f"epilogue residual has {r.shape[0]} rows but the conv has {out.shape[0]} outputs")
        return r.to(out.dtype)

    def apply(self, out: torch.Tensor, bias: Optional[torch.Tensor], fresh: bool = False) -> torch.Tensor:
        """The epilogue as torch ops (differentiable). ``fresh``: ``out`` is a new tensor that
        nothing else holds and whose producer's backward does not read it (a GEMM's output), so
        the sums and the ReLU may run in place, without a new tensor per step. On the GPU path,
        where autograd records nothing, one Triton launch in place instead."""
        residual = self._residual_for(out)
        if _one_launch(out, bias, residual):
            return triton_load("epilogue").apply_in_place(out, bias, residual, self.relu)
        if bias is not None:
            out = out.add_(bias) if fresh else out + bias
        if residual is not None:
            out = out.add_(residual) if fresh else out + residual
        if not self.relu:
            return out
        return out.relu_() if fresh else torch.relu(out)


def _one_launch(out: torch.Tensor, bias, residual) -> bool:
    """Whether the epilogue runs as one Triton launch: GPU-path decisions, eager, nothing that
    autograd records, matching dtypes and row-contiguous operands."""
    if torch.compiler.is_compiling() or backends.decision_device_type(out.device) == "cpu":
        return False
    operands = [t for t in (out, bias, residual) if t is not None]
    if torch.is_grad_enabled() and any(t.requires_grad for t in operands):
        return False
    if any(t.dtype != out.dtype or t.stride(-1) != 1 for t in operands) or out.dim() != 2:
        return False
    try:
        triton_runtime.require(out.device)
    except RuntimeError:
        return False
    return True


def _native_fetch_on_demand(config) -> bool:
    return config.dataflow == "fetch_on_demand" and config.backend == "native"


def _in_kernel(config, feats: torch.Tensor, tensors) -> bool:
    needs_graph = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    return _native_fetch_on_demand(config) and feats.device.type == "cpu" and not needs_graph


def _kernel_residual(residual: Optional[torch.Tensor], rows: int, dtype: torch.dtype) -> Optional[torch.Tensor]:
    """The residual as the fused kernel reads it: ``rows`` rows of the features' dtype."""
    if residual is None:
        return None
    if residual.shape[0] != rows:
        raise ValueError(f"epilogue residual has {residual.shape[0]} rows but the conv has {rows} outputs")
    return residual.to(dtype).contiguous()


# Where the register kernels run (AVX-512 or AVX2; bfloat16 on the bf16 dot product or widened to
# float), a 1x1x1 conv of 2^27 multiply-adds or more runs faster as fetch_on_demand over identity
# pairs than as torch.addmm (the bias, residual and ReLU go in its epilogue, the output is written
# once); below that addmm is as fast or faster (benchmarks/pointwise_cpu.py: MinkUNet's
# shortcuts). Where ATen's bfloat16 GEMM is its reference loop (utils/cpu_bf16.py), bfloat16
# takes the kernel at any size, or else a float32 GEMM.
POINTWISE_KERNEL_MIN_MACS = 1 << 27
_REGISTER_DTYPES = (torch.float32, torch.bfloat16)
# With autograd, forward + input gradient + weight gradient of a 1x1x1 conv of 2^25 multiply-adds
# or more run 1.1-1.55x faster as fetch_on_demand over identity pairs than as ATen's three
# GEMMs (MinkUNet 0.5x's shortcuts, Zen 3, 2 threads); smaller ones 0.7-0.9x.
POINTWISE_TRAINING_KERNEL_MIN_MACS = 1 << 25


def _training_kernel(configs: PassConfigs, feats: torch.Tensor, weight: torch.Tensor, macs: int) -> bool:
    """Whether a 1x1x1 conv that autograd records runs on the fetch_on_demand kernels (eager only:
    a compiled graph keeps the GEMMs)."""
    if torch.compiler.is_compiling():  # first: the size test below would guard on the rows
        return False
    recorded = torch.is_grad_enabled() and (feats.requires_grad or weight.requires_grad)
    return (recorded and feats.device.type == "cpu" and feats.dtype in _REGISTER_DTYPES
            and macs >= POINTWISE_TRAINING_KERNEL_MIN_MACS and backends.cpu_kernels != "none"
            and all(_native_fetch_on_demand(c) for c in configs))


def pointwise_fused(feats: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                    residual: Optional[torch.Tensor], relu: bool) -> torch.Tensor:
    """``act(feats @ weight[0] + bias + residual)`` by the fused fetch_on_demand kernel over
    identity pairs (output row i reads input row i); ``residual`` as the kernel reads it."""
    n = feats.shape[0]
    return ops.fetch_on_demand_forward_fused(feats, weight, *identity_pairs(n, feats.device), n, bias, residual, relu)


def pointwise_forward(configs: PassConfigs, feats: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                      epilogue: Optional[Epilogue]) -> torch.Tensor:
    """A 1x1x1 conv (every output reads its own row) followed by ``epilogue`` (if any)."""
    if computes_in_float32(feats, configs):
        return pointwise_forward(configs, *widened(feats, weight, bias), epilogue).to(feats.dtype)
    residual = None if epilogue is None else epilogue.residual
    # A compiled graph always takes the kernel: a size test would specialise it on the rows.
    macs = feats.shape[0] * weight.shape[1] * weight.shape[2]
    emulated = bf16_gemm_emulated(feats)
    large = torch.compiler.is_compiling() or macs >= POINTWISE_KERNEL_MIN_MACS or emulated
    if (feats.dtype in _REGISTER_DTYPES and large and backends.cpu_kernels != "none"
            and _in_kernel(configs.forward, feats, (feats, weight, bias, residual))):
        return pointwise_fused(feats, weight, bias, _kernel_residual(residual, feats.shape[0], feats.dtype),
                               epilogue is not None and epilogue.relu)
    if _training_kernel(configs, feats, weight, macs):
        out = identity_pairs_conv(feats, weight, configs, backends.deterministic, backends.allow_tf32)
        if epilogue is None:
            return out if bias is None else out.add_(bias)
        return epilogue.apply(out, bias, fresh=True)
    if emulated:
        out = linear_float32(feats, weight[0], bias)
    else:
        out = feats @ weight[0] if bias is None else torch.addmm(bias, feats, weight[0])
    return out if epilogue is None else epilogue.apply(out, None, fresh=True)


def forward_with_epilogue(configs: PassConfigs, text: str, feats, weight, bias, view, epilogue: Epilogue) -> torch.Tensor:
    """The conv over ``view`` followed by ``epilogue``; in the kernel where it can run there."""
    residual = epilogue.residual
    if _in_kernel(configs.forward, feats, (feats, weight, bias, residual)):
        src, dst, offsets, identity = view.pairs(sorted_by="dst")
        return ops.fetch_on_demand_forward_fused(feats, weight, src, dst, offsets, identity, view.num_dst, bias,
                                                 _kernel_residual(residual, view.num_dst, feats.dtype), epilogue.relu)
    out = sparse_conv(feats, weight, view, configs, text, backends.deterministic, backends.allow_tf32)
    return epilogue.apply(out, bias)
