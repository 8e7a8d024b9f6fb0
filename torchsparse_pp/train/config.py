"""Training configuration: a schema of dataclasses, filled from YAML and ``section.key=value``
overrides. Unknown keys and values of the wrong type are errors that name the key."""
from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple, Union

__all__ = ["ConfigError", "DataConfig", "ModelConfig", "OptimConfig", "TrainConfig", "EvalConfig", "Config",
           "load_config", "config_from_dict", "config_to_dict", "apply_overrides", "dump_config", "DATA_FORMATS"]

DATA_FORMATS = ("semantickitti", "nuscenes", "detection", "nuscenes_detection", "waymo")
DETECTION_FORMATS = ("detection", "nuscenes_detection", "waymo")
MULTI_FRAME_FORMATS = ("nuscenes", "nuscenes_detection", "waymo")
MODELS = ("minkunet", "spvcnn", "centerpoint")
DEVICES = ("cpu", "cuda")
OPTIMIZERS = ("sgd", "adamw")
SCHEDULES = ("cosine", "constant")
CONV_DATAFLOWS = ("gather_scatter", "fetch_on_demand", "implicit_gemm")


class ConfigError(ValueError):
    """A config that does not fit the schema."""


@dataclass
class DataConfig:
    format: str = "semantickitti"          # semantickitti | nuscenes | detection | nuscenes_detection | waymo
    root: str = ""                         # dataset root directory
    sweeps: int = 1                        # frames per sample (nuscenes*, waymo): the frame and sweeps - 1 before it
    version: Optional[str] = None          # nuScenes tables directory (v1.0-trainval); Waymo processed-data folder
    train_split: str = "train"
    val_split: str = "val"
    voxel_size: float = 0.05               # segmentation voxel edge (metres)
    crop: Optional[float] = None           # keep points with |x|, |y| < crop metres (None: all)
    max_points: Optional[int] = None       # random subset of at most this many points per scan
    max_scans: Optional[int] = None        # use only the first N scans of each split
    augment: bool = True                   # random rotation, flip and scale on the train split
    batch_size: int = 2                    # per process
    val_batch_size: int = 1
    num_workers: int = 0


@dataclass
class ModelConfig:
    name: str = "minkunet"                 # minkunet | spvcnn | centerpoint
    cr: float = 1.0                        # MinkUNet / SPVCNN channel ratio
    centerpoint_preset: str = "synthetic"  # synthetic | nuscenes | waymo
    centerpoint: Dict[str, Any] = field(default_factory=dict)  # CenterPointConfig field overrides


@dataclass
class OptimConfig:
    name: str = "adamw"                    # sgd | adamw
    lr: float = 1e-3
    weight_decay: float = 1e-4
    momentum: float = 0.9                  # sgd only
    nesterov: bool = False                 # sgd only
    betas: Tuple[float, float] = (0.9, 0.999)  # adamw only
    schedule: str = "cosine"               # cosine | constant (both after the warmup)
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0              # cosine ends at lr * min_lr_ratio
    grad_clip: Optional[float] = None      # max gradient norm


@dataclass
class TrainConfig:
    epochs: int = 1
    max_steps: Optional[int] = None        # stop (and end the schedule) after this many steps
    accumulate: int = 1                    # batches per optimizer step (gradient accumulation)
    device: str = "cpu"                    # cpu | cuda
    amp: bool = False                      # CUDA: float16 autocast + grad scaler; CPU: bfloat16 autocast
    seed: int = 0
    deterministic: bool = False            # torchsparse_pp.backends.deterministic
    threads: int = 0                       # torch threads per process (0: torch's default)
    sync_batchnorm: bool = True            # several processes: BatchNorm statistics over all of them
    conv_dataflow: Optional[str] = None    # default dataflow of every sparse conv (None: library default)
    tuned: Optional[str] = None            # tuned configs file (`torchsparse-pp tune`), applied per layer
    tuned_strict: bool = True              # a tuned file from another model or device: error (false: warning)
    run_dir: str = "runs/default"
    log_every: int = 10                    # steps between CSV/TensorBoard rows
    checkpoint_every: Optional[int] = None  # also save step_<N>.pt every N steps
    eval_every_epoch: bool = True
    progress: bool = True                  # tqdm bars (rank 0 only)


@dataclass
class EvalConfig:
    iou_threshold: float = 0.5             # detection: BEV rotated IoU for a true positive


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    @property
    def point_features(self) -> int:
        """Features per point the configured reader gives (the models' in_channels): x, y, z,
        intensity, then the ring (nuscenes), elongation (waymo) and the time lag (several frames;
        nuscenes_detection always)."""
        base = {"semantickitti": 4, "detection": 4, "nuscenes": 5, "nuscenes_detection": 4, "waymo": 5}
        lag = self.data.format == "nuscenes_detection" or self.data.sweeps > 1
        return base[self.data.format] + (lag and self.data.format in MULTI_FRAME_FORMATS)

    @property
    def task(self) -> str:
        return "detection" if self.model.name == "centerpoint" else "segmentation"

    def validate(self) -> "Config":
        _choice("data.format", self.data.format, DATA_FORMATS)
        _choice("model.name", self.model.name, MODELS)
        _choice("model.centerpoint_preset", self.model.centerpoint_preset, ("synthetic", "nuscenes", "waymo"))
        _choice("optim.name", self.optim.name, OPTIMIZERS)
        _choice("optim.schedule", self.optim.schedule, SCHEDULES)
        _choice("train.device", self.train.device, DEVICES)
        if self.train.conv_dataflow is not None:
            _choice("train.conv_dataflow", self.train.conv_dataflow, CONV_DATAFLOWS)
        if not self.data.root:
            raise ConfigError("data.root is required (the dataset's root directory)")
        if (self.data.format in DETECTION_FORMATS) != (self.model.name == "centerpoint"):
            raise ConfigError(f"model.name={self.model.name!r} does not fit data.format={self.data.format!r}: "
                              f"centerpoint trains on {', '.join(DETECTION_FORMATS)}, minkunet and spvcnn on "
                              "semantickitti or nuscenes")
        self._check_frames()
        _positive("data.voxel_size", self.data.voxel_size)
        for name in ("data.crop", "model.cr", "optim.lr", "optim.grad_clip"):
            value = _get(self, name)
            if value is not None:
                _positive(name, value)
        for name in ("data.batch_size", "data.val_batch_size", "train.epochs", "train.log_every",
                     "data.max_points", "data.max_scans", "train.max_steps", "train.checkpoint_every",
                     "train.accumulate"):
            value = _get(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value!r}")
        for name in ("data.num_workers", "train.threads", "train.seed", "optim.warmup_steps", "optim.weight_decay"):
            if _get(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {_get(self, name)!r}")
        self._check_optimizer_keys()
        if not 0 <= self.optim.min_lr_ratio <= 1:
            raise ConfigError(f"optim.min_lr_ratio must lie in [0, 1], got {self.optim.min_lr_ratio!r}")
        if not 0 < self.eval.iou_threshold <= 1:
            raise ConfigError(f"eval.iou_threshold must lie in (0, 1], got {self.eval.iou_threshold!r}")
        if self.model.name == "centerpoint":
            self.centerpoint_config(point_features=self.point_features)  # raises on unknown or bad fields
        return self

    def _check_frames(self) -> None:
        """data.sweeps and data.version only where the format reads them."""
        data = self.data
        if data.sweeps < 1:
            raise ConfigError(f"data.sweeps must be >= 1, got {data.sweeps!r}")
        if data.sweeps > 1 and data.format not in MULTI_FRAME_FORMATS:
            raise ConfigError(f"data.sweeps={data.sweeps}: the {data.format} format has single frames "
                              f"(multi-frame formats: {', '.join(MULTI_FRAME_FORMATS)})")
        if data.version is not None and data.format not in MULTI_FRAME_FORMATS:
            raise ConfigError(f"data.version={data.version!r} has no meaning for data.format={data.format!r}; "
                              "remove it (it names nuScenes' tables or Waymo's processed-data folder)")
        if data.format == "nuscenes_detection" and data.version is None:
            raise ConfigError("data.format=nuscenes_detection needs data.version, the tables directory under "
                              "data.root (e.g. v1.0-trainval; v1.0-synth for torchsparse-pp synth --format nuscenes)")
        if data.format == "nuscenes" and data.sweeps > 1 and data.version is None:
            raise ConfigError(f"data.sweeps={data.sweeps} on nuscenes needs data.version, the tables directory "
                              "that holds the sweeps' prev chains and poses (e.g. v1.0-trainval)")

    def _check_optimizer_keys(self) -> None:
        """A setting of the other optimizer would be ignored: an error unless it keeps its default."""
        defaults = OptimConfig()
        other = {"sgd": ("betas",), "adamw": ("momentum", "nesterov")}[self.optim.name]
        for key in other:
            if getattr(self.optim, key) != getattr(defaults, key):
                raise ConfigError(f"optim.{key}={getattr(self.optim, key)!r} has no effect with "
                                  f"optim.name={self.optim.name!r}; remove it (or set the optimizer it belongs to)")

    def centerpoint_config(self, num_classes: Optional[int] = None, point_features: Optional[int] = None):
        """The CenterPointConfig: the preset with ``model.centerpoint`` overrides; ``num_classes``
        and ``point_features`` come from the data (a different point_features there is an error)."""
        from ..models.centerpoint import CenterPointConfig

        allowed = [f.name for f in dataclasses.fields(CenterPointConfig)]
        values = dict(self.model.centerpoint)
        for key in values:
            if key not in allowed:
                raise ConfigError(f"unknown key 'model.centerpoint.{key}'; allowed: {', '.join(allowed)}")
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
        if num_classes is not None:
            values["num_classes"] = num_classes
        if point_features is not None:
            if values.get("point_features", point_features) != point_features:
                raise ConfigError(f"model.centerpoint.point_features={values['point_features']} differs from the "
                                  f"{point_features} features per point of data.format={self.data.format!r} "
                                  f"with data.sweeps={self.data.sweeps}; remove it")
            values["point_features"] = point_features
        try:
            return getattr(CenterPointConfig, self.model.centerpoint_preset)(**values)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"model.centerpoint: {err}") from err


def _get(config: Config, dotted: str):
    section, key = dotted.split(".")
    return getattr(getattr(config, section), key)


def _choice(name: str, value, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def _positive(name: str, value) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise ConfigError(f"{name} must be a positive number, got {value!r}")


def _coerce(name: str, value, annotation):
    """``value`` checked (and lists turned into tuples) against a field's type annotation."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Union:  # Optional[X]
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(name, value, inner[0])
    if annotation is Any:
        return value
    if annotation is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be true or false, got {value!r}")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name} must be an integer, got {value!r}")
        return value
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{name} must be a number, got {value!r}")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise ConfigError(f"{name} must be a string, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ConfigError(f"{name} must be a list of {len(args)} values, got {value!r}")
        return tuple(_coerce(f"{name}[{i}]", v, a) for i, (v, a) in enumerate(zip(value, args)))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{name} must be a mapping, got {value!r}")
        return dict(value)
    raise TypeError(f"config.py cannot check the annotation {annotation!r} of {name}")


def _fill(cls, values: Dict[str, Any], prefix: str):
    if not isinstance(values, dict):
        raise ConfigError(f"{prefix or 'the config'} must be a mapping of keys, got {values!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [k for k in values if k not in fields]
    if unknown:
        where = f"{prefix}.{unknown[0]}" if prefix else str(unknown[0])
        raise ConfigError(f"unknown config key {where!r}; allowed keys{' in ' + prefix if prefix else ''}: "
                          f"{', '.join(fields)}")
    kwargs = {}
    for key, value in values.items():
        name = f"{prefix}.{key}" if prefix else key
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            kwargs[key] = _fill(hint, value if value is not None else {}, name)
        else:
            kwargs[key] = _coerce(name, value, hint)
    return cls(**kwargs)


def config_from_dict(values: Optional[Dict[str, Any]]) -> Config:
    """A validated Config from nested dicts (missing keys take their defaults)."""
    return _fill(Config, values or {}, "").validate()


def config_to_dict(config: Config) -> Dict[str, Any]:
    """Nested plain dicts (tuples as lists), for YAML and checkpoints."""
    def plain(value):
        if isinstance(value, (tuple, list)):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value
    return plain(dataclasses.asdict(config))


def apply_overrides(values: Dict[str, Any], overrides: Sequence[str]) -> Dict[str, Any]:
    """``section.key=value`` strings (value parsed as YAML) applied to nested dicts."""
    import yaml

    values = {k: dict(v) if isinstance(v, dict) else v for k, v in values.items()}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like section.key=value (e.g. train.epochs=2)")
        dotted, text = item.split("=", 1)
        path = dotted.strip().split(".")
        if len(path) < 2 or not all(path):
            raise ConfigError(f"override {item!r} must name section.key (e.g. optim.lr=0.01)")
        node = values
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {part!r} is not a section")
            node[part] = child = dict(child)
            node = child
        node[path[-1]] = yaml.safe_load(text) if text.strip() else None
    return values


def _read_yaml(path: Union[str, Path]) -> Dict[str, Any]:
    try:
        import yaml
    except ImportError as err:
        raise ImportError("reading YAML configs needs PyYAML: pip install pyyaml") from err
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {str(path)!r} does not exist")
    try:
        values = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{str(path)!r} is not valid YAML: {err}") from err
    return values or {}


def load_config(path: Optional[Union[str, Path]] = None, overrides: Sequence[str] = ()) -> Config:
    """The Config of a YAML file (or the defaults), with ``section.key=value`` overrides."""
    values = _read_yaml(path) if path is not None else {}
    return config_from_dict(apply_overrides(values, list(overrides)))


def dump_config(config: Config, path: Union[str, Path]) -> None:
    import yaml

    from .files import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(config_to_dict(config), sort_keys=False))

