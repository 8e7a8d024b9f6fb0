"""ConvConfig: which dataflow a convolution runs, and the check that it exists on a device."""
from dataclasses import dataclass

DATAFLOWS = ("gather_scatter", "fetch_on_demand", "implicit_gemm")

# Dataflows that have kernels, per device type. The others are named but not built yet.
IMPLEMENTED = {"cpu": ("gather_scatter",)}


@dataclass(frozen=True)
class ConvConfig:
    """The dataflow of a convolution: 'gather_scatter' (implemented on the CPU),
    'fetch_on_demand' or 'implicit_gemm' (not implemented yet; selecting them raises)."""
    dataflow: str = "gather_scatter"

    def __post_init__(self):
        if self.dataflow not in DATAFLOWS:
            raise ValueError(f"unknown dataflow {self.dataflow!r}; expected one of {DATAFLOWS}")


def check_config(config, device_type: str) -> ConvConfig:
    """Returns the config to run on ``device_type``; unimplemented dataflows raise, never fall back."""
    if config is None:
        config = ConvConfig()
    if not isinstance(config, ConvConfig):
        raise TypeError(f"config must be a ConvConfig or None, got {type(config).__name__}")
    available = IMPLEMENTED.get(device_type, ())
    if config.dataflow not in available:
        raise NotImplementedError(
            f"dataflow {config.dataflow!r} is not implemented on {device_type} yet"
            + (f"; available there: {', '.join(available)}" if available
               else f"; torchsparse_pp has no {device_type} kernels in this build"))
    return config
