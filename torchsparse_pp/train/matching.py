"""Does a checkpoint or a tuned file fit the model of this config? Each refusal names the
settings that differ and both values, instead of a state-dict dump or a bare hash mismatch."""
import warnings
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Union

from torch import nn

from ..tune.configfile import TunedFile, TunedFileError, apply, load_tuned
from .changes import flatten, model_differences, model_keys, show
from .checkpoint import CheckpointError
from .config import Config, config_to_dict

__all__ = ["check_same_model", "load_model_state", "apply_tuned_file", "model_settings"]


def _classes(names: Sequence[str]) -> str:
    names = list(names)
    return f"{len(names)} ({', '.join(names[:4])}{', ...' if len(names) > 4 else ''})"


def check_same_model(path: Union[str, Path], stored: Dict[str, Any], current: Dict[str, Any],
                     stored_classes: Optional[Sequence[str]], classes: Sequence[str]) -> None:
    """Raises CheckpointError naming every model or data-meaning setting (and the classes) in
    which the checkpoint's stored config differs from ``current``."""
    problems = [f"{c.key}: {show(c.old)} (checkpoint) vs {show(c.new)} (this config)"
                for c in model_differences(stored, current)] if stored else []
    if stored_classes is not None and list(stored_classes) != list(classes):
        problems.append(f"classes: {_classes(stored_classes)} (checkpoint) vs {_classes(classes)} (this config)")
    if problems:
        raise CheckpointError(f"{str(path)!r} was trained with another model or data: {'; '.join(problems)}")


def load_model_state(model: nn.Module, state: Dict[str, Any], path: Union[str, Path]) -> None:
    """load_state_dict, with a one-line summary of what does not fit instead of torch's dump.
    ``model`` may be wrapped in DistributedDataParallel, and ``state`` may come from a wrapped
    model's state_dict (every key prefixed ``module.``): both load as the plain module's."""
    from .distributed import unwrap

    model = unwrap(model)
    if state and all(k.startswith("module.") for k in state):
        state = {k[len("module."):]: v for k, v in state.items()}
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [k for k in own if k in state and tuple(own[k].shape) != tuple(state[k].shape)]
    if missing or unexpected or shapes:
        parts = []
        if shapes:
            k = shapes[0]
            parts.append(f"{len(shapes)} tensors of another shape (first: {k} {list(state[k].shape)} in the "
                         f"checkpoint, {list(own[k].shape)} here)")
        if missing:
            parts.append(f"{len(missing)} missing (first: {missing[0]})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected (first: {unexpected[0]})")
        raise CheckpointError(f"the weights in {str(path)!r} do not fit this model: {'; '.join(parts)}")
    model.load_state_dict(state)


def model_settings(config: Config) -> Dict[str, Any]:
    """The settings that define the model's layers, as a tuned file records them (the voxel size
    changes the workload, not the layers: a file tuned at another one still applies)."""
    values = config_to_dict(config)
    flat = flatten(values)
    return {key: flat[key] for key in model_keys(values) if key != "data.voxel_size"}


def apply_tuned_file(model: nn.Module, config: Config, path: Union[str, Path], strict: bool) -> TunedFile:
    """tune.apply, after naming the model settings in which this config differs from the one
    the file was tuned with (when the file records them)."""
    tuned = load_tuned(path)
    recorded = tuned.meta.get("settings")
    if isinstance(recorded, dict):
        ours = model_settings(config)
        differ = [f"{k}: {show(v)} (tuned file) vs {show(ours[k])} (this config)" for k, v in recorded.items()
                  if k in ours and ours[k] != v]
        if differ:
            made = tuned.meta.get("train_command")
            message = (f"the tuned file {str(path)!r} was made for another model: {'; '.join(differ)}"
                       + (f"; it was tuned for `{made}`" if made else ""))
            if strict:
                raise TunedFileError(message + " (train.tuned_strict=false applies it anyway, with a warning)")
            warnings.warn(message, stacklevel=2)
    try:
        return apply(model, tuned, strict=strict)
    except TunedFileError as err:
        if "structural hash" not in str(err):
            raise
        raise TunedFileError(f"{err}. To tune this config's own model: torchsparse-pp tune --config CONFIG "
                             "--synthetic --out FILE (docs/autotune.md)") from err
