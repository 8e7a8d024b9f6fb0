"""Checkpoints: state dicts only (torch.save; loaded with weights_only=True), with everything an
exact resume needs: model, optimizer, scheduler, grad scaler, RNG states and the position in
the data stream (epoch and batches done in it)."""
import pickle
import random
import zipfile
from pathlib import Path
from typing import Any, Dict, Optional, Union

import numpy as np
import torch

__all__ = ["rng_state", "set_rng_state", "save_checkpoint", "load_checkpoint", "CheckpointError"]

FORMAT_VERSION = 1


class CheckpointError(ValueError):
    """A file that is not a torchsparse_pp checkpoint, or one that does not fit this run."""


def rng_state() -> Dict[str, Any]:
    """Python, numpy, torch and CUDA generator states as tensors and plain values."""
    version, python_state, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": {"version": version, "state": torch.tensor(python_state, dtype=torch.int64), "gauss": gauss},
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py["version"], tuple(int(v) for v in py["state"].tolist()), py["gauss"]))
    np_state = state["numpy"]
    np.random.set_state((np_state["kind"], np_state["keys"].numpy().astype(np.uint32), np_state["pos"],
                         np_state["has_gauss"], np_state["cached"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        if not torch.cuda.is_available():
            raise RuntimeError("this checkpoint holds CUDA RNG states but CUDA is not available here")
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path: Union[str, Path], *, model, optimizer, scheduler, scaler, epoch: int, step: int,
                    batch_in_epoch: int, world_size: int, config: Dict[str, Any],
                    extra: Optional[Dict[str, Any]] = None) -> Path:
    """Writes atomically (temp file, then rename): an interrupted save never leaves a broken file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "format": FORMAT_VERSION,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict() if scaler is not None else None,
        "rng": rng_state(),
        "epoch": epoch, "step": step, "batch_in_epoch": batch_in_epoch, "world_size": world_size,
        "config": config,
        "extra": extra or {},
    }
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    tmp.replace(path)
    return path


def load_checkpoint(path: Union[str, Path], map_location="cpu", mmap: bool = False) -> Dict[str, Any]:
    """The checkpoint's state; ``mmap``: tensors stay on disk until used (cheap to read the
    config and the position)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
    what = f"{str(path)!r} is not a torchsparse_pp training checkpoint"
    # torch.save writes a zip archive; anything else (a YAML config, a log) is refused before
    # torch.load, whose errors speak of pickles.
    if not zipfile.is_zipfile(path):
        hint = " (it looks like a YAML config: pass it as --config)" if path.suffix in (".yaml", ".yml") else ""
        raise CheckpointError(f"{what}: it was not written by torch.save{hint}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"{what} (torch.load: {first})") from err
    if not isinstance(state, dict) or state.get("format") != FORMAT_VERSION or "model" not in state:
        raise CheckpointError(f"{what} (format {FORMAT_VERSION})")
    return state
