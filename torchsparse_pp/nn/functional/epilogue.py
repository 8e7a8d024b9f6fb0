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
from .config import PassConfigs
from .dataflows import sparse_conv


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
        the sums and the ReLU may run in place, without a new tensor per step."""
        residual = self._residual_for(out)
        if bias is not None:
            out = out.add_(bias) if fresh else out + bias
        if residual is not None:
            out = out.add_(residual) if fresh else out + residual
        if not self.relu:
            return out
        return out.relu_() if fresh else torch.relu(out)


def _in_kernel(config, feats: torch.Tensor, tensors) -> bool:
    needs_graph = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    return (config.dataflow == "fetch_on_demand" and config.backend == "native" and feats.device.type == "cpu"
            and not needs_graph)


def forward_with_epilogue(configs: PassConfigs, text: str, feats, weight, bias, view, epilogue: Epilogue) -> torch.Tensor:
    """The conv over ``view`` followed by ``epilogue``; in the kernel where it can run there."""
    residual = epilogue.residual
    if _in_kernel(configs.forward, feats, (feats, weight, bias, residual)):
        src, dst, offsets, identity = view.pairs(sorted_by="dst")
        if residual is not None:
            if residual.shape[0] != view.num_dst:
                raise ValueError(f"epilogue residual has {residual.shape[0]} rows but the conv has "
                                 f"{view.num_dst} outputs")
            residual = residual.to(feats.dtype).contiguous()
        return ops.fetch_on_demand_forward_fused(feats, weight, src, dst, offsets, identity, view.num_dst, bias,
                                                 residual, epilogue.relu)
    out = sparse_conv(feats, weight, view, configs, text, backends.deterministic, backends.allow_tf32)
    return epilogue.apply(out, bias)
