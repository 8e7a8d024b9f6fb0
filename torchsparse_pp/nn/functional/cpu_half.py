"""float16 on the CPU. The native CPU kernels have no float16 arithmetic (CPUs have no float16
GEMM to speak of), so a float16 conv on the CPU computes in float32 from its float16 operands and
rounds its output once to float16. Autograd's casts do the same for the backward: the input and
weight gradients are computed in float32 and returned in float16, their operands' dtype."""
from typing import Optional

import torch

from .config import PassConfigs


def computes_in_float32(feats: torch.Tensor, configs: PassConfigs) -> bool:
    """Whether a conv of ``feats`` runs widened: float16 on the CPU with a native pass."""
    return (feats.dtype == torch.float16 and feats.device.type == "cpu"
            and any(config.backend == "native" for config in configs))


def widened(*tensors: Optional[torch.Tensor]):
    """The operands in float32 (None stays None); differentiable."""
    return tuple(None if t is None else t.float() for t in tensors)
