"""How a config differs from the one a checkpoint (or a tuned file) was made with, sorted by what
the difference means:

- model keys define the model and what its inputs mean (classes, voxel size): a checkpoint of
  another model cannot be evaluated or resumed with this config;
- schedule keys change the learning-rate schedule, the step count or the data order: a resumed
  run accepts them only with --force;
- every other key (progress bars, logging, threads, dataflows, ...) may change freely; changes
  are listed.
"""
import json
from dataclasses import dataclass
from typing import Any, Dict, List, Sequence

__all__ = ["Change", "flatten", "show", "differences", "model_keys", "model_differences", "schedule_changes", "describe",
           "SCHEDULE_KEYS"]

SCHEDULE_KEYS = ("train.epochs", "train.max_steps", "train.seed", "data.batch_size", "data.max_scans",
                 "data.train_split", "train.accumulate")


@dataclass(frozen=True)
class Change:
    key: str
    old: Any
    new: Any


def flatten(values: Dict[str, Any]) -> Dict[str, Any]:
    """``section.key`` -> value (mappings such as model.centerpoint stay whole)."""
    return {f"{section}.{key}": value for section, keys in values.items() if isinstance(keys, dict)
            for key, value in keys.items()}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def differences(old: Dict[str, Any], new: Dict[str, Any]) -> List[Change]:
    """Every key whose value differs between two nested config dicts (config_to_dict form)."""
    old_flat, new_flat = flatten(old), flatten(new)
    keys = list(old_flat) + [k for k in new_flat if k not in old_flat]
    return [Change(k, old_flat.get(k), new_flat.get(k)) for k in keys if not _same(old_flat.get(k), new_flat.get(k))]


def model_keys(values: Dict[str, Any]) -> List[str]:
    """The keys that define the model and its data's meaning, for the model this config names."""
    if values.get("model", {}).get("name") == "centerpoint":
        return ["model.name", "model.centerpoint_preset", "model.centerpoint", "data.format"]
    return ["model.name", "model.cr", "data.format", "data.voxel_size"]


def model_differences(stored: Dict[str, Any], values: Dict[str, Any]) -> List[Change]:
    keys = set(model_keys(stored)) | set(model_keys(values))
    return [c for c in differences(stored, values) if c.key in keys]


def schedule_changes(changes: Sequence[Change]) -> List[Change]:
    return [c for c in changes if c.key in SCHEDULE_KEYS or c.key.startswith("optim.")]


def show(value: Any) -> str:
    """A value as it would be written in an override (true, null, [0.9, 0.99], text)."""
    return value if isinstance(value, str) else json.dumps(value)


def describe(changes: Sequence[Change], old: str = "checkpoint", new: str = "now") -> str:
    return "; ".join(f"{c.key}: {show(c.old)} ({old}) vs {show(c.new)} ({new})" for c in changes)
