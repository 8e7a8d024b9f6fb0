"""The design space of the autotuner, as data: one row per family of configs, per backend.

Adding a dataflow (or a parameter value) to the tuner means adding a row here. Every config in
the space names its backend: the native rows run where the build has native kernels for the
device; the Triton rows run on GPUs when triton is installed, with every tile of
torchsparse_pp.ops.triton.tiles (on CPU tensors Triton only runs interpreted, far too slowly to
be worth timing, so the CPU space has no Triton rows).
"""
from dataclasses import replace
from typing import Dict, List, Optional, Tuple

import torch

from .. import backends as backends_module
from ..nn.functional.config import IMPLEMENTED, PARAMETERS, TRITON_DATAFLOWS, ConvConfig
from ..ops.triton import runtime as triton_runtime
from ..ops.triton.tiles import TILES, TILES_BY_NAME

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

TRITON_TILES = tuple(t.name for t in TILES)
# The Triton rows: the same parameters, and every tile where the kernels take one.
TRITON_DESIGN_SPACE: Tuple[Tuple[str, Tuple[Dict[str, object], ...]], ...] = tuple(
    (dataflow, grid if dataflow == "gather_scatter" else tuple({**params, "tile": t} for params in grid
                                                              for t in TRITON_TILES))
    for dataflow, grid in DESIGN_SPACE)
TRITON_DEVICES = ("cuda",)

# One config per dataflow, for the small spaces of binding="none" (|space|^3 trials per group);
# each runs on every backend the device has (Triton picking its tile from the channels).
COMPACT_SPACE: Tuple[ConvConfig, ...] = (
    ConvConfig("gather_scatter"),
    ConvConfig("fetch_on_demand"),
    ConvConfig("implicit_gemm", sorted=False, split_mask_num=0),
    ConvConfig("implicit_gemm", sorted=True, split_mask_num=1),
)

SPACES = ("full", "compact")


def tile_mode(dtype: torch.dtype) -> str:
    """The Triton tile mode convs of ``dtype`` run in now (backends.allow_tf32 counts)."""
    return triton_runtime.mode(dtype, backends_module.allow_tf32)


def _backends(device_type: str) -> Dict[str, Tuple[str, ...]]:
    """backend -> dataflows the tuner may time on ``device_type``."""
    found = {}
    if IMPLEMENTED.get(device_type):
        found["native"] = IMPLEMENTED[device_type]
    if device_type in TRITON_DEVICES and triton_runtime.installed():
        found["triton"] = TRITON_DATAFLOWS
    return found


def design_space(device_type: str, space: str = "full", tile_mode: Optional[str] = None) -> List[ConvConfig]:
    """The configs the tuner tries on ``device_type``: rows whose dataflow has kernels there,
    for each backend the device has; with ``tile_mode`` (tiles.MODES), only the Triton tiles
    that serve it."""
    if space not in SPACES:
        raise ValueError(f"space must be one of {SPACES}, got {space!r}")
    backends = _backends(device_type)
    if not backends:
        raise NotImplementedError(f"torchsparse_pp has no {device_type} kernels in this build: nothing to tune")
    if space == "compact":
        return [replace(c, backend=b) for b, available in backends.items() for c in COMPACT_SPACE
                if c.dataflow in available]
    rows = {"native": DESIGN_SPACE, "triton": TRITON_DESIGN_SPACE}
    return [ConvConfig(dataflow, backend=b, **params) for b, available in backends.items()
            for dataflow, grid in rows[b] if dataflow in available for params in grid
            if tile_mode is None or "tile" not in params or tile_mode in TILES_BY_NAME[params["tile"]].modes]


def config_name(config: ConvConfig) -> str:
    """A short readable name: 'fetch_on_demand', 'implicit_gemm(sorted, split=2)',
    'triton:fetch_on_demand(tile=m64n64k32w4s3)', ... (native and default-backend configs carry
    no prefix)."""
    if config.dataflow == "gather_scatter":
        params = [] if config.epsilon == 0.0 and config.mm_thresh == 0 else \
            [f"eps={config.epsilon:g}", f"thresh={config.mm_thresh}"]
    elif config.dataflow == "implicit_gemm":
        params = ["sorted", f"split={config.split_mask_num}"] if config.sorted else ["unsorted"]
    else:
        params = []
    if config.tile is not None:
        params.append(f"tile={config.tile}")
    name = config.dataflow + (f"({', '.join(params)})" if params else "")
    return f"triton:{name}" if config.backend == "triton" else name


def config_to_dict(config: ConvConfig) -> Dict[str, object]:
    """The config's dataflow and its own parameters (what a tuned file stores), with its backend
    and tile when set."""
    values = {"dataflow": config.dataflow, **{name: getattr(config, name) for name in PARAMETERS[config.dataflow]}}
    values.update({name: getattr(config, name) for name in ("backend", "tile") if getattr(config, name) is not None})
    return values


def config_from_dict(values: Dict[str, object], where: str) -> ConvConfig:
    if not isinstance(values, dict) or "dataflow" not in values:
        raise ValueError(f"{where}: expected a mapping with a 'dataflow' key, got {values!r}")
    try:
        return ConvConfig(**values)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: {err}") from err
