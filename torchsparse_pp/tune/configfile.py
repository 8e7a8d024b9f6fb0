"""Tuned files: human-readable YAML (no pickles) that bind a config to each layer of a model.

    torchsparse_pp_tuned: 1
    meta:    model class, structural hash, library / torch versions, device, dtype, mode, binding,
             samples, date, latencies before and after, the final check, the search per slot
    groups:  g0: {key: ..., pairs: ..., forward: {dataflow: ...}, dgrad: ..., wgrad: ...}
    layers:  module name -> group
    unreached_layers: convs the tuning sample never reached (their configs are left alone)
"""
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import torch
import yaml
from torch import nn

from ..nn.functional.config import PassConfigs, resolve_configs
from ..version import __version__
from .binding import PASSES
from .groups import conv_layers
from .identity import device_name, model_device, structural_hash
from .space import config_from_dict, config_to_dict

FORMAT_KEY, FORMAT_VERSION = "torchsparse_pp_tuned", 1
PathLike = Union[str, Path]


class TunedFileError(ValueError):
    """A tuned file that is malformed or does not fit the model it is applied to."""


@dataclass
class TunedFile:
    meta: Dict[str, Any]
    group_configs: Dict[str, PassConfigs]
    layers: Dict[str, str]      # module name -> group name
    raw: Dict[str, Any]
    unreached: List[str] = field(default_factory=list)  # convs tuning never reached (left as they are)
    applied_to: str = ""        # after apply(): the submodule it was applied to ('' for the model itself)

    def layer_configs(self) -> Dict[str, PassConfigs]:
        return {layer: self.group_configs[group] for layer, group in self.layers.items()}


def _round(x: float) -> float:
    return float(f"{x:.6g}")


def tuned_to_dict(result, extra_meta: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The YAML document of a TuneResult; ``extra_meta`` (e.g. the command that made it and the
    model settings of its training config) joins ``meta``."""
    meta = {
        "model": result.model_class, "structural_hash": result.structural_hash,
        "library": __version__, "torch": str(torch.__version__),
        "device": {"type": result.device_type, "name": result.device_name},
        "dtype": result.dtype, "mode": result.mode, "binding": result.binding, "space": result.space,
        "samples": result.samples, "repeats": result.repeats, "min_gain": result.min_gain, "start": result.start, "date": result.date,
        "selected": result.selected,
        "latency_before_s": _round(result.before_seconds), "latency_after_s": _round(result.after_seconds),
        "speedup": _round(result.before_seconds / result.after_seconds),
        "tuning_seconds": _round(result.tuning_seconds),
        "trials": len(result.search.trials),
        "final_check": {name: {k: _round(v) for k, v in stats.items()} for name, stats in result.final.items()},
        "search": [{"group": s.group, "slot": s.slot, "choice": s.choice, "seconds": _round(s.seconds),
                    "start_seconds": None if s.start_seconds is None else _round(s.start_seconds)}
                   for s in result.search.slots],
    }
    meta.update(extra_meta or {})
    groups = {}
    for g in result.groups:
        configs = result.assignment[g.name]
        entry = {"key": g.key(), "description": g.describe(), "pairs": g.pairs, "macs": g.macs,
                 "build_seconds": _round(g.build_seconds),
                 "forward_seconds_before": _round(result.group_seconds_before[g.name]),
                 "forward_seconds_after": _round(result.group_seconds_after[g.name])}
        entry.update({p: config_to_dict(getattr(configs, p)) for p in PASSES})
        groups[g.name] = entry
    layers = {layer: g.name for g in result.groups for layer in g.layer_names}
    return {FORMAT_KEY: FORMAT_VERSION, "meta": meta, "groups": groups, "layers": layers,
            "unreached_layers": list(result.unreached)}


def save_tuned(result, path: PathLike, extra_meta: Optional[Dict[str, Any]] = None) -> Path:
    """Writes the whole file or nothing (temp file, then rename)."""
    from ..train.files import atomic_write_text

    header = (f"# torchsparse_pp tuned configs for {result.model_class} on {result.device_name} "
              f"({result.mode}{', binding ' + result.binding if result.binding else ''}).\n"
              "# Apply with torchsparse_pp.tune.apply(model, path) or `--tuned` of train / eval.\n")
    return atomic_write_text(path, header + yaml.safe_dump(tuned_to_dict(result, extra_meta), sort_keys=False,
                                                           width=110))


def _need(mapping: Any, key: str, where: str, kind=dict):
    if not isinstance(mapping, dict) or key not in mapping:
        raise TunedFileError(f"{where}: missing '{key}'")
    value = mapping[key]
    if not isinstance(value, kind):
        raise TunedFileError(f"{where}: '{key}' must be a {kind.__name__}, got {type(value).__name__}")
    return value


def load_tuned(path: PathLike) -> TunedFile:
    """Reads and validates a tuned file (yaml.safe_load: plain data only)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"tuned file {str(path)!r} does not exist")
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise TunedFileError(f"{path}: not valid YAML ({err})") from err
    if not isinstance(doc, dict) or FORMAT_KEY not in doc:
        raise TunedFileError(f"{path}: not a torchsparse_pp tuned file: expected '{FORMAT_KEY}: {FORMAT_VERSION}' "
                             "at the top")
    if doc[FORMAT_KEY] != FORMAT_VERSION:
        raise TunedFileError(f"{path}: a tuned file of version {doc[FORMAT_KEY]!r}; torchsparse_pp {__version__} reads "
                             f"version {FORMAT_VERSION} only (tune again with this version, or use the version that "
                             "wrote it)")
    meta = _need(doc, "meta", str(path))
    for key in ("model", "structural_hash"):
        _need(meta, key, f"{path}: meta", str)
    device = _need(meta, "device", f"{path}: meta")
    for key in ("type", "name"):
        _need(device, key, f"{path}: meta.device", str)
    groups = _need(doc, "groups", str(path))
    group_configs = {}
    for name, entry in groups.items():
        where = f"{path}: groups.{name}"
        try:
            group_configs[str(name)] = PassConfigs(*(config_from_dict(_need(entry, p, where), f"{where}.{p}")
                                                     for p in PASSES))
        except ValueError as err:
            raise TunedFileError(str(err)) from err
    layers = _need(doc, "layers", str(path))
    for layer, group in layers.items():
        if not isinstance(group, str) or group not in group_configs:
            raise TunedFileError(f"{path}: layer {layer!r} names group {group!r}, which the file does not define")
    unreached = doc.get("unreached_layers") or []
    if not isinstance(unreached, list) or not all(isinstance(x, str) for x in unreached):
        raise TunedFileError(f"{path}: 'unreached_layers' must be a list of module names")
    return TunedFile(meta, group_configs, {str(k): str(v) for k, v in layers.items()}, doc, unreached)


def _mismatch(message: str, strict: bool) -> None:
    if strict:
        raise TunedFileError(message + " (pass strict=False, or train.tuned_strict=false to train / eval, to apply "
                             "it anyway, with a warning)")
    warnings.warn(message, stacklevel=3)


def _target(model: nn.Module, class_name: str) -> Tuple[str, nn.Module]:
    """The module a file tuned for ``class_name`` applies to: the model itself, or its only
    submodule of that class (a backbone tuned alone, inside the whole detector)."""
    if type(model).__name__ == class_name:
        return "", model
    found = [(name, m) for name, m in model.named_modules() if name and type(m).__name__ == class_name]
    return found[0] if len(found) == 1 else ("", model)


def apply(model: nn.Module, tuned: Union[PathLike, TunedFile], strict: bool = True) -> TunedFile:
    """Sets the config of every layer the tuned file names.

    A file tuned for a submodule's class (e.g. VoxelResBackBone8x) applies to the model's only
    submodule of that class (CenterPoint's backbone); ``applied_to`` names it.
    A file tuned for another model structure (structural hash) or another device (type or name)
    raises TunedFileError; with ``strict=False`` it warns and applies to the layers that exist.
    Configs whose dataflow has no kernels on the model's device always raise."""
    tuned = tuned if isinstance(tuned, TunedFile) else load_tuned(tuned)
    meta = tuned.meta
    prefix, model = _target(model, meta["model"])
    tuned.applied_to = prefix
    ours = structural_hash(model)
    if meta["structural_hash"] != ours:
        where = f" ({prefix})" if prefix else ""
        _mismatch(f"the tuned file was made for a {meta['model']} with structural hash {meta['structural_hash']}, "
                  f"but this {type(model).__name__}{where} hashes to {ours} (a different model or layer layout)",
                  strict)
    device = model_device(model)
    name = device_name(device)
    if (meta["device"]["type"], meta["device"]["name"]) != (device.type, name):
        _mismatch(f"the tuned file was made on {meta['device']['type']} ({meta['device']['name']}), "
                  f"but the model is on {device.type} ({name}); its timings do not carry over", strict)
    for group, configs in tuned.group_configs.items():
        try:
            resolve_configs(configs, device.type)
        except NotImplementedError as err:
            raise TunedFileError(f"group {group} of the tuned file: {err}") from err
    layers = conv_layers(model)
    missing = [layer for layer in tuned.layers if layer not in layers]
    if missing:
        _mismatch(f"the model has no sparse conv (with a kernel map) named {missing[:5]}"
                  f"{' ...' if len(missing) > 5 else ''}", strict)
    untuned = [layer for layer in layers if layer not in tuned.layers and layer not in tuned.unreached]
    if untuned:
        _mismatch(f"the tuned file has no config for the model's sparse convs {untuned[:5]}"
                  f"{' ...' if len(untuned) > 5 else ''}", strict)
    for layer, configs in tuned.layer_configs().items():
        if layer in layers:
            layers[layer].config = configs
    return tuned
