"""Which dataflow a convolution runs, with its parameters and backend, per pass (forward, dgrad,
wgrad).

A ConvConfig is a frozen value. Each conv resolves its configs in this order: the ``config``
argument (or ``Conv3d.config``), else the global default (``set_default_config`` /
``default_config``), else the device's default (``DEVICE_DEFAULTS``, chosen per pass from
benchmark numbers: benchmarks/defaults_cpu.py, docs/benchmarks.md). A ConvConfig may be given for all three passes or
as a ``PassConfigs`` / 3-tuple ``(forward, dgrad, wgrad)``.
"""
import contextlib
import contextvars
import functools
from dataclasses import dataclass
from dataclasses import replace
from typing import Optional, Sequence, Tuple, Union

import torch

from ... import backends
from ...ops.triton import runtime as triton_runtime
from ...ops.triton.tiles import check_tile_name

DATAFLOWS = ("gather_scatter", "fetch_on_demand", "implicit_gemm")
BACKENDS = ("native", "triton")


def _has_cuda_kernels(dataflow: str) -> bool:
    """Whether this build registered CUDA kernels for both ops of a dataflow."""
    return all(torch._C._dispatch_has_kernel_for_dispatch_key(f"torchsparse_pp::{dataflow}_{op}", "CUDA")
               for op in ("forward", "wgrad"))


# The dataflows of the native CUDA kernels (csrc/cuda); fetch_on_demand only when this build has
# its kernels.
CUDA_DATAFLOWS = ("gather_scatter", "implicit_gemm") + (
    ("fetch_on_demand",) if _has_cuda_kernels("fetch_on_demand") else ())

# Dataflows that have native kernels, per device type; CUDA ones only when this build compiled them.
IMPLEMENTED = {"cpu": DATAFLOWS}
if torch.ops.torchsparse_pp.cuda_built():
    IMPLEMENTED["cuda"] = CUDA_DATAFLOWS
# Dataflows with Triton kernels: GPUs (CUDA and ROCm tensors), and CPU tensors under the interpreter.
TRITON_DATAFLOWS = DATAFLOWS
TRITON_DEVICES = ("cuda", "cpu")
# The backend a config without one runs on, per device type. CUDA: Triton, whose kernels CI
# proves under the interpreter, until the native CUDA kernels have a recorded green device run
# (docs/gpu.md).
DEFAULT_BACKEND = {"cpu": "native", "cuda": "triton"}
# Dataflows whose Triton kernels take a tile (torchsparse_pp.ops.triton.tiles); gather_scatter's
# GEMMs are torch's.
TILED_DATAFLOWS = ("fetch_on_demand", "implicit_gemm")

# Parameters each dataflow takes; the others must stay unset.
PARAMETERS = {
    "gather_scatter": ("epsilon", "mm_thresh"),
    "fetch_on_demand": (),
    "implicit_gemm": ("sorted", "split_mask_num"),
}


@dataclass(frozen=True)
class ConvConfig:
    """One pass's dataflow and its parameters.

    - ``gather_scatter``: ``epsilon`` in [0, 1] (default 0: one GEMM per offset) and
      ``mm_thresh`` >= 0 (default 0): offsets with fewer than ``mm_thresh`` pairs whose counts
      are within ``epsilon`` (relative) of each other are padded and batched into one GEMM.
    - ``fetch_on_demand``: no parameters.
    - ``implicit_gemm``: ``sorted`` and ``split_mask_num``. ``split_mask_num = 0`` is unsorted;
      ``sorted=True`` reorders output rows by neighbour bitmask within each of
      ``split_mask_num >= 1`` (default 1) ranges of offsets. A kernel with fewer offsets than
      splits uses one split per offset.

    ``backend``: "native" (the compiled C++ / CUDA kernels), "triton" (the Triton kernels; on CPU
    tensors only under ``TRITON_INTERPRET=1``), or None for the device's default
    (``DEFAULT_BACKEND``). Every parameter means the same under both. ``tile`` names a Triton tile
    (``torchsparse_pp.ops.triton.tiles.TILES``) for fetch_on_demand and implicit_gemm with
    backend "triton"; None picks one from the channel counts.

    Setting a parameter of another dataflow or backend, or an inconsistent pair, raises ValueError.
    """
    dataflow: str = "gather_scatter"
    sorted: Optional[bool] = None
    split_mask_num: Optional[int] = None
    epsilon: Optional[float] = None
    mm_thresh: Optional[int] = None
    backend: Optional[str] = None
    tile: Optional[str] = None

    def __post_init__(self):
        if self.dataflow not in DATAFLOWS:
            raise ValueError(f"unknown dataflow {self.dataflow!r}; expected one of {DATAFLOWS}")
        if self.backend is not None and self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; expected one of {BACKENDS} (or None for the "
                             "device's default)")
        if self.tile is not None:
            if self.backend != "triton" or self.dataflow not in TILED_DATAFLOWS:
                raise ValueError(f"tile applies to backend='triton' with the {' or '.join(TILED_DATAFLOWS)} dataflow, "
                                 f"got backend={self.backend!r}, dataflow={self.dataflow!r}")
            check_tile_name(self.tile)
        allowed = PARAMETERS[self.dataflow]
        for name in ("sorted", "split_mask_num", "epsilon", "mm_thresh"):
            if name not in allowed and getattr(self, name) is not None:
                raise ValueError(f"{name} does not apply to the {self.dataflow} dataflow "
                                 f"(its parameters: {', '.join(allowed) or 'none'})")
        if self.dataflow == "gather_scatter":
            self._fill(epsilon=0.0 if self.epsilon is None else float(self.epsilon),
                       mm_thresh=0 if self.mm_thresh is None else self.mm_thresh)
            if not 0.0 <= self.epsilon <= 1.0:
                raise ValueError(f"epsilon must be in [0, 1], got {self.epsilon}")
            if isinstance(self.mm_thresh, bool) or not isinstance(self.mm_thresh, int) or self.mm_thresh < 0:
                raise ValueError(f"mm_thresh must be an int >= 0, got {self.mm_thresh!r}")
        elif self.dataflow == "implicit_gemm":
            split = self.split_mask_num
            if split is not None and (isinstance(split, bool) or not isinstance(split, int) or split < 0):
                raise ValueError(f"split_mask_num must be an int >= 0, got {split!r}")
            if self.sorted is not None and not isinstance(self.sorted, bool):
                raise ValueError(f"sorted must be a bool, got {self.sorted!r}")
            is_sorted = self.sorted if self.sorted is not None else bool(split)
            split = (1 if is_sorted else 0) if split is None else split
            if is_sorted != (split > 0):
                raise ValueError(f"sorted={is_sorted} needs split_mask_num {'>= 1' if is_sorted else '= 0'}, "
                                 f"got {split} (split_mask_num = 0 means unsorted)")
            self._fill(sorted=is_sorted, split_mask_num=split)

    def _fill(self, **values):
        for name, value in values.items():
            object.__setattr__(self, name, value)


@dataclass(frozen=True)
class PassConfigs:
    """Configs of the three passes of one convolution."""
    forward: ConvConfig
    dgrad: ConvConfig
    wgrad: ConvConfig

    def __post_init__(self):
        for name in ("forward", "dgrad", "wgrad"):
            if not isinstance(getattr(self, name), ConvConfig):
                raise TypeError(f"PassConfigs.{name} must be a ConvConfig, got {type(getattr(self, name)).__name__}")

    @staticmethod
    def of(config: "ConfigLike") -> "PassConfigs":
        if isinstance(config, PassConfigs):
            return config
        if isinstance(config, ConvConfig):
            return PassConfigs(config, config, config)
        if isinstance(config, (tuple, list)) and len(config) == 3:
            return PassConfigs(*config)
        raise TypeError("a conv config must be a ConvConfig, a PassConfigs or a (forward, dgrad, wgrad) "
                        f"tuple of ConvConfigs, got {config!r}")

    def __iter__(self):
        return iter((self.forward, self.dgrad, self.wgrad))


ConfigLike = Union[ConvConfig, PassConfigs, Sequence[ConvConfig]]

# What a conv with no config anywhere runs, per device type. CPU: fetch_on_demand for every
# pass, the fastest on the MinkUNet and CenterPoint layers in forward, dgrad and wgrad
# (benchmarks/defaults_cpu.py; docs/benchmarks.md has the numbers). CUDA: one launch per pass,
# chosen per layer (CUDA_LAYER_DEFAULTS below); this entry is for convs whose layer is not known.
DEVICE_DEFAULTS = {
    "cpu": PassConfigs.of(ConvConfig("fetch_on_demand")),
    "cuda": PassConfigs.of(ConvConfig("fetch_on_demand")),
}
# CUDA per layer, TorchSparse++'s rule of thumb until a GPU run tunes it (docs/gpu.md):
# submanifold layers with at least this many input and output channels run sorted implicit GEMM
# (dense tiles over all offsets of a row, reordered by neighbour mask), all others
# fetch_on_demand (one launch over the pairs of every offset; strided layers have few pairs per
# offset). Both read their counts on the device: no host sync per call.
CUDA_IMPLICIT_GEMM_MIN_CHANNELS = 64
CUDA_LAYER_DEFAULTS = {
    "large_submanifold": PassConfigs.of(ConvConfig("implicit_gemm", sorted=True)),
    "other": PassConfigs.of(ConvConfig("fetch_on_demand")),
}


def layer_kind(submanifold: bool, in_channels: int, out_channels: int) -> str:
    """The CUDA_LAYER_DEFAULTS entry of a layer."""
    large = min(in_channels, out_channels) >= CUDA_IMPLICIT_GEMM_MIN_CHANNELS
    return "large_submanifold" if submanifold and large else "other"

# Devices without an entry run ConvConfig() (gather_scatter).
_FALLBACK = PassConfigs.of(ConvConfig())

_default: contextvars.ContextVar = contextvars.ContextVar("torchsparse_pp_default_config", default=None)


class _Traced:
    """The last default set in this process, for code that torch.compile traces: dynamo cannot
    read a ContextVar, but it reads this attribute and guards on it (a compiled model recompiles
    when the default changes). Threads that set different defaults and run one compiled model
    see the last one set."""
    default: Optional[PassConfigs] = None


def _set(value: Optional[PassConfigs]):
    _Traced.default = value
    return _default.set(value)


def set_default_config(config: Optional[ConfigLike]) -> None:
    """Sets the configs used by convs that have none of their own (None restores the per-device
    defaults, DEVICE_DEFAULTS)."""
    _set(None if config is None else PassConfigs.of(config))


def get_default_config(device_type: str = "cpu", layer: Optional[str] = None) -> PassConfigs:
    """The configs a conv without its own runs on ``device_type``: the global default if one is
    set, else the device's default (on CUDA, that of the ``layer`` kind, ``layer_kind``, when given)."""
    current = _Traced.default if torch.compiler.is_compiling() else _default.get()
    if current is not None:
        return current
    if device_type == "cuda" and layer is not None:
        return CUDA_LAYER_DEFAULTS[layer]
    return DEVICE_DEFAULTS.get(device_type, _FALLBACK)


@contextlib.contextmanager
def default_config(config: ConfigLike):
    """Context manager form of set_default_config."""
    outer = _default.get()
    token = _set(PassConfigs.of(config))
    try:
        yield
    finally:
        _default.reset(token)
        _Traced.default = outer


@functools.lru_cache(maxsize=1024)
def _with_backend(config: ConvConfig, backend: str) -> ConvConfig:
    """``config`` with its backend filled in (memoised: resolution runs on every conv call)."""
    return config if config.backend == backend else replace(config, backend=backend)


def available_dataflows(device_type: str, backend: str):
    """Dataflows with kernels for ``device_type`` under ``backend``."""
    if backend == "triton":
        return TRITON_DATAFLOWS if device_type in TRITON_DEVICES else ()
    return IMPLEMENTED.get(device_type, ())


def _resolve(configs: PassConfigs, device_type: str, run_type: Optional[str] = None
             ) -> Tuple[ConvConfig, ConvConfig, ConvConfig]:
    """Backends filled in by ``device_type``'s rules; Triton's availability is checked for
    ``run_type``, the tensors' own device type (they differ under backends.device_policy)."""
    run_on = torch.device(run_type or device_type)
    resolved = []
    for name, cfg in zip(("forward", "dgrad", "wgrad"), configs):
        backend = cfg.backend or DEFAULT_BACKEND.get(device_type, "native")
        available = available_dataflows(device_type, backend)
        if cfg.dataflow not in available:
            raise NotImplementedError(
                f"dataflow {cfg.dataflow!r} ({name} pass) is not implemented on {device_type} with the {backend} "
                f"backend" + (f"; available there: {', '.join(available)}" if available
                              else f"; torchsparse_pp has no {backend} {device_type} kernels in this build"))
        if backend == "triton":
            triton_runtime.require(run_on)
        resolved.append(_with_backend(cfg, backend))
    return tuple(resolved)


def resolve_configs(config: Optional[ConfigLike], device_type: str) -> PassConfigs:
    """The configs a conv runs with on ``device_type``, each with its backend filled in;
    unimplemented dataflows raise, never fall back."""
    configs = get_default_config(device_type) if config is None else PassConfigs.of(config)
    return PassConfigs(*_resolve(configs, device_type))


# ---------------------------------------------------------------------------------------------
# Configs as text: the form the sparse_conv custom op takes (op schemas have no dataclasses).
# A ConvConfig's fields in this order, "-" for None; passes joined by ";".
_TEXT_FIELDS = ("dataflow", "backend", "sorted", "split_mask_num", "epsilon", "mm_thresh", "tile")
_TEXTS: dict = {}


def configs_to_text(configs: PassConfigs) -> str:
    def one(cfg: ConvConfig) -> str:
        return ",".join("-" if getattr(cfg, f) is None else str(getattr(cfg, f)) for f in _TEXT_FIELDS)
    return ";".join(one(cfg) for cfg in configs)


@functools.lru_cache(maxsize=1024)
def configs_from_text(text: str) -> PassConfigs:
    """Inverse of configs_to_text."""
    def value(field, item):
        if item == "-":
            return None
        if field == "sorted":
            return item == "True"
        if field in ("split_mask_num", "mm_thresh"):
            return int(item)
        return float(item) if field == "epsilon" else item
    passes = [dict(zip(_TEXT_FIELDS, part.split(","))) for part in text.split(";")]
    if len(passes) != 3 or any(len(p) != len(_TEXT_FIELDS) for p in passes):
        raise ValueError(f"not a sparse_conv config text: {text!r}")
    return PassConfigs(*(ConvConfig(**{f: value(f, p[f]) for f in _TEXT_FIELDS}) for p in passes))


def _resolve_with_text(configs: PassConfigs, device_type: str, run_type: str):
    resolved = _resolve(configs, device_type, run_type)
    return resolved, configs_to_text(PassConfigs(*resolved))


# While torch.compile traces, resolution and text run as plain Python at trace time and their
# result is a constant of the graph (dynamo guards on the configs given, read from the conv or
# the default above), instead of being traced statement by statement on every conv.
# This sets the attribute torch.compiler.assume_constant_result sets; calling that at import
# would import torch._dynamo and with it triton, which plain use must not pay for.
_resolve_with_text._dynamo_marked_constant = True
_resolve_with_text_at_trace_time = _resolve_with_text


def resolve_for_call(config: Optional[ConfigLike], device: torch.device, layer: Optional[str] = None
                     ) -> Tuple[PassConfigs, str]:
    """resolve_configs and the configs' text (memoised), for one conv call on tensors on
    ``device`` (deciding as backends.decision_device_type says) of a ``layer_kind`` layer."""
    device = torch.device(device)
    run_type = device.type
    device_type = backends.decision_device_type(device)
    configs = get_default_config(device_type, layer) if config is None else PassConfigs.of(config)
    if torch.compiler.is_compiling():
        resolved, text = _resolve_with_text_at_trace_time(configs, device_type, run_type)
        return PassConfigs(*resolved), text
    resolved = PassConfigs(*_resolve(configs, device_type, run_type))
    text = _TEXTS.get(resolved)
    if text is None:
        text = _TEXTS[resolved] = configs_to_text(resolved)
    return resolved, text
