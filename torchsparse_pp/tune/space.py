"""The design space of the autotuner, as data: one row per family of configs.

Adding a dataflow (or a parameter value) to the tuner means adding a row here.
"""
from typing import Dict, List, Tuple

from ..nn.functional.config import IMPLEMENTED, PARAMETERS, ConvConfig

# (dataflow, parameter grid): every combination of the grid's values is one choice.
# gather_scatter's (epsilon, mm_thresh) grid: (0, 0) is one GEMM per offset; the others batch
# offsets with fewer than mm_thresh pairs whose counts lie within epsilon of each other.
DESIGN_SPACE: Tuple[Tuple[str, Tuple[Dict[str, object], ...]], ...] = (
    ("gather_scatter", tuple([{"epsilon": 0.0, "mm_thresh": 0}]
                             + [{"epsilon": e, "mm_thresh": t} for e in (0.25, 0.5) for t in (4096, 32768)])),
    ("fetch_on_demand", ({},)),
    ("implicit_gemm", tuple([{"sorted": False, "split_mask_num": 0}]
                            + [{"sorted": True, "split_mask_num": s} for s in (1, 2, 3, 4)])),
)

# One config per dataflow, for the small spaces of binding="none" (|space|^3 trials per group).
COMPACT_SPACE: Tuple[ConvConfig, ...] = (
    ConvConfig("gather_scatter"),
    ConvConfig("fetch_on_demand"),
    ConvConfig("implicit_gemm", sorted=False, split_mask_num=0),
    ConvConfig("implicit_gemm", sorted=True, split_mask_num=1),
)

SPACES = ("full", "compact")


def design_space(device_type: str, space: str = "full") -> List[ConvConfig]:
    """The configs the tuner tries on ``device_type``: rows whose dataflow has kernels there."""
    if space not in SPACES:
        raise ValueError(f"space must be one of {SPACES}, got {space!r}")
    available = IMPLEMENTED.get(device_type, ())
    if not available:
        raise NotImplementedError(f"torchsparse_pp has no {device_type} kernels in this build: nothing to tune")
    if space == "compact":
        return [c for c in COMPACT_SPACE if c.dataflow in available]
    return [ConvConfig(dataflow, **params) for dataflow, grid in DESIGN_SPACE if dataflow in available
            for params in grid]


def config_name(config: ConvConfig) -> str:
    """A short readable name: 'fetch_on_demand', 'implicit_gemm(sorted, split=2)', ..."""
    if config.dataflow == "gather_scatter":
        if config.epsilon == 0.0 and config.mm_thresh == 0:
            return "gather_scatter"
        return f"gather_scatter(eps={config.epsilon:g}, thresh={config.mm_thresh})"
    if config.dataflow == "implicit_gemm":
        return f"implicit_gemm(sorted, split={config.split_mask_num})" if config.sorted else "implicit_gemm(unsorted)"
    return config.dataflow


def config_to_dict(config: ConvConfig) -> Dict[str, object]:
    """The config's dataflow and its own parameters (what a tuned file stores)."""
    return {"dataflow": config.dataflow, **{name: getattr(config, name) for name in PARAMETERS[config.dataflow]}}


def config_from_dict(values: Dict[str, object], where: str) -> ConvConfig:
    if not isinstance(values, dict) or "dataflow" not in values:
        raise ValueError(f"{where}: expected a mapping with a 'dataflow' key, got {values!r}")
    try:
        return ConvConfig(**values)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: {err}") from err
