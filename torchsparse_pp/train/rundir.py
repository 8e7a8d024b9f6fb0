"""A run directory belongs to the run that made it. A new run refuses a directory that holds
another run; a resumed run refuses to rewind a directory whose last.pt is further on; both
unless forced. Nothing here starts training: these checks run before any long work."""
import csv
import io
import shutil
from pathlib import Path
from typing import List, Optional

import torch

from .files import atomic_write_text, check_writable_dir

__all__ = ["run_outputs", "checkpoint_step", "claim_new_run", "claim_resumed_run", "copy_log_rows"]

OUTPUT_FILES = ("config.yaml", "train.csv", "eval.csv", "eval.json", "last.pt")


def run_outputs(run_dir: Path) -> List[Path]:
    """The files a training run writes that exist in ``run_dir``."""
    if not run_dir.is_dir():
        return []
    found = [run_dir / name for name in OUTPUT_FILES if (run_dir / name).exists()]
    found += sorted(run_dir.glob("step_*.pt"))
    if (run_dir / "tensorboard").is_dir():
        found.append(run_dir / "tensorboard")
    return found


def checkpoint_step(path: Path) -> Optional[int]:
    """The step a checkpoint was saved at (None when it cannot be read)."""
    try:
        # mmap: only the small header entries are read, not the weights.
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return int(state["step"])
    except Exception:  # a broken file: the caller decides without its step
        return None


def claim_new_run(run_dir: Path, force: bool) -> None:
    check_writable_dir(run_dir, "train.run_dir")
    existing = run_outputs(run_dir)
    if not existing:
        return
    if not force:
        step = checkpoint_step(run_dir / "last.pt") if (run_dir / "last.pt").is_file() else None
        what = f"a run (last.pt at step {step})" if step is not None else f"a run's files ({existing[0].name})"
        raise FileExistsError(f"{str(run_dir)!r} already holds {what}; continue it with --resume "
                              f"{run_dir / 'last.pt'}, choose another directory (--run-dir or train.run_dir), "
                              "or pass --force to start over there (its run files are replaced)")
    for path in existing:
        shutil.rmtree(path) if path.is_dir() else path.unlink()


def claim_resumed_run(run_dir: Path, checkpoint: Path, step: int, force: bool) -> None:
    """``run_dir`` may continue the run of ``checkpoint`` (saved at ``step``)."""
    check_writable_dir(run_dir, "the run directory")
    same = run_dir.resolve() == checkpoint.parent.resolve()
    last = run_dir / "last.pt"
    if not same and run_outputs(run_dir):
        if not force:
            raise FileExistsError(f"{str(run_dir)!r} holds another run; continue this one in its own directory "
                                  f"({str(checkpoint.parent)!r}) or a new one, or pass --force to replace that run")
        claim_new_run(run_dir, force=True)
    if same and last.is_file() and last.resolve() != checkpoint.resolve() and not force:
        ahead = checkpoint_step(last)
        if ahead is not None and ahead > step:
            raise FileExistsError(
                f"{str(last)!r} is at step {ahead}, past this checkpoint's step {step}: continuing here would "
                f"replace steps {step + 1}-{ahead}, their logs and last.pt. Pass --run-dir NEW_DIR to branch off "
                "into a new directory, or --force to replace them")
    if not same:
        for name in ("train.csv", "eval.csv"):
            copy_log_rows(checkpoint.parent / name, run_dir / name, step)


def copy_log_rows(source: Path, target: Path, step: int) -> None:
    """The rows of ``source`` up to ``step`` as ``target`` (a branched run keeps its history)."""
    if not source.is_file():
        return
    with open(source, newline="") as f:
        rows = list(csv.reader(f))
    kept = rows[:1] + [r for r in rows[1:] if r and int(r[0]) <= step]
    out = io.StringIO()
    csv.writer(out).writerows(kept)
    atomic_write_text(target, out.getvalue())
