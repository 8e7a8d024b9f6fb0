"""Checkpoints: state dicts only (torch.save; loaded with weights_only=True), with everything an
exact resume needs: model, optimizer, scheduler, grad scaler, RNG states and the position in
the data stream (epoch and batches done in it).

A save is atomic: the state goes to a temporary file beside the checkpoint, which is flushed and
fsynced, then renamed over it (and the directory fsynced), so a process killed during a save
leaves the previous checkpoint intact. Loading refuses, with a CheckpointError naming the file,
anything that is not a whole checkpoint of this format: an empty, truncated or damaged file, a
foreign zip or pickle, another program's torch.save, a newer format, missing entries."""
import os
import random
import zipfile
from pathlib import Path
from typing import Any, Dict, Optional, Union

import numpy as np
import torch

__all__ = ["rng_state", "set_rng_state", "save_checkpoint", "load_checkpoint", "CheckpointError"]

FORMAT_VERSION = 1
# What every checkpoint holds (Trainer.load reads them all).
# "config" may be absent (a checkpoint written from user code): commands then need --config.
REQUIRED_KEYS = ("format", "model", "optimizer", "scheduler", "scaler", "rng", "epoch", "step", "batch_in_epoch",
                 "world_size", "extra")
_ZIP_MAGIC = b"PK\x03\x04"


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
    """Writes atomically (temp file, fsync, rename): an interrupted save never leaves a broken
    file, and the previous checkpoint at ``path`` stays whole until the new one replaces it."""
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
    write_atomically(path, lambda f: torch.save(state, f))
    return path


def temp_path(path: Path) -> Path:
    """Where a save of ``path`` writes before the rename (one writer per checkpoint: rank 0)."""
    return path.with_name(f".{path.name}.tmp")


def write_atomically(path: Union[str, Path], write) -> None:
    """Calls ``write(file)`` on the temp file of ``path``, flushes and fsyncs it, renames it to
    ``path`` and fsyncs the directory (so the rename itself survives a power loss)."""
    path = Path(path)
    tmp = temp_path(path)
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_checkpoint(path: Union[str, Path], map_location="cpu", mmap: bool = False) -> Dict[str, Any]:
    """The checkpoint's state; ``mmap``: tensors stay on disk until used (cheap to read the
    config and the position). Without ``mmap`` every archive member's CRC is checked first, so
    damaged bytes anywhere are refused rather than loaded as weights."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist" if not path.exists()
                                else f"checkpoint {str(path)!r} is not a file")
    what = f"{str(path)!r} is not a torchsparse_pp training checkpoint"
    size = path.stat().st_size
    if size == 0:
        raise CheckpointError(f"checkpoint {str(path)!r} is empty (0 bytes): its save was cut off; resume from "
                              "an earlier checkpoint")
    with open(path, "rb") as f:
        head = f.read(len(_ZIP_MAGIC))
    # torch.save writes a zip archive; anything else (a YAML config, a log) is refused before
    # torch.load, whose errors speak of pickles. A zip without its central directory (at the
    # end) was cut short.
    if not zipfile.is_zipfile(path):
        if head == _ZIP_MAGIC:
            raise CheckpointError(f"checkpoint {str(path)!r} is truncated or damaged ({size} bytes, no zip "
                                  "directory at its end): its save was cut off or the copy is incomplete; resume "
                                  "from an earlier checkpoint")
        hint = " (it looks like a YAML config: pass it as --config)" if path.suffix in (".yaml", ".yml") else ""
        raise CheckpointError(f"{what}: it is not a zip archive as torch.save writes{hint}")
    if not mmap:
        try:
            with zipfile.ZipFile(path) as archive:
                bad_member = archive.testzip()
            problem = None if bad_member is None else f"archive member {bad_member} fails its CRC check"
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as err:
            problem = f"{type(err).__name__}: {err}"
        if problem is not None:
            raise CheckpointError(f"checkpoint {str(path)!r} is damaged ({problem}); resume from an earlier "
                                  "checkpoint")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as err:  # damaged members, foreign zips and pickles: all refused alike
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"{what} (torch.load: {type(err).__name__}: {first})") from err
    if not isinstance(state, dict) or "format" not in state:
        kind = f"a {type(state).__name__}" if not isinstance(state, dict) else "a dict without a 'format' entry"
        raise CheckpointError(f"{what}: it holds {kind} (a torch.save file of something else, e.g. a bare "
                              "state dict)")
    if state["format"] != FORMAT_VERSION:
        raise CheckpointError(f"{what} of format {FORMAT_VERSION}: it has format {state['format']!r} (written by "
                              "another version of torchsparse_pp)")
    missing = [k for k in REQUIRED_KEYS if k not in state]
    if missing:
        raise CheckpointError(f"{what}: it lacks {missing}")
    return state
