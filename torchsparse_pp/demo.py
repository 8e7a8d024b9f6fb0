"""The demo: train MinkUNet (cr 0.5) on SemanticKITTI-format scans for a few minutes on the CPU
and show what it learned: mIoU per class before and after training, and a bird's-eye-view PNG
of a val scan's predictions.

Without ``data`` it first writes a small synthetic SemanticKITTI set (``write_synthetic``)
into the run directory. It runs the same Trainer as ``torchsparse-pp train``.
"""
import math
import time
from pathlib import Path
from typing import Dict, Optional

import numpy as np
import torch

from .data.synth import write_synthetic
from .train import Trainer, config_from_dict

__all__ = ["run_demo", "demo_settings"]

# Chosen so that the default demo takes ~5 minutes on 2 cores: 0.2 m voxels in a 40 m square
# (~15k voxels a scan), 16 scans, 24 epochs of batches of 2 (192 steps).
FULL = dict(scans=16, epochs=24, voxel_size=0.2, crop=20.0, cr=0.5, lr=4e-3)
QUICK = dict(scans=2, epochs=2, voxel_size=0.3, crop=8.0, cr=0.25, lr=4e-3)


def demo_settings(quick: bool, epochs: Optional[int], scans: Optional[int]) -> Dict[str, float]:
    settings = dict(QUICK if quick else FULL)
    for name, value in (("epochs", epochs), ("scans", scans)):
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
            settings[name] = value
    return settings


def _synthetic_root(out: Path, scans: int, seed: int) -> Path:
    """A synthetic set under the run directory, reused when an earlier demo wrote the same one."""
    root = out / f"synthetic-semantickitti-{scans}-seed{seed}"
    done = root / "complete"
    if not done.is_file():
        if root.exists():  # an interrupted write: start over
            import shutil
            shutil.rmtree(root)
        print(f"writing {scans} + {scans} synthetic SemanticKITTI scans (train + val) to {root}")
        write_synthetic(root, format="semantickitti", scans=scans, seed=seed)
        done.write_text("written by torchsparse-pp demo\n")
    return root


def _bev_pictures(trainer: Trainer, out: Path) -> Optional[Path]:
    """Ground truth and prediction of the first val scan, side by side as two PNGs."""
    try:
        from .viz import bev_png
        import matplotlib  # noqa: F401  (bev_png imports it lazily; fail here with one message)
    except ImportError:
        print("  (matplotlib is not installed: no BEV picture; pip install matplotlib)")
        return None
    dataset = trainer.val_set
    frame = dataset.frame((0, 0))
    sample = dataset.reader.voxelize(frame)
    trainer.model.eval()
    with torch.no_grad(), trainer.library_settings():
        logits = trainer.model(sample["lidar"].to(trainer.device))
    point_pred = logits.argmax(1).cpu()[sample["inverse_map"]].numpy()
    extent = trainer.config.data.crop
    truth = bev_png(out / "bev_ground_truth.png", frame["points"], frame["labels"].astype(np.int64), extent=extent,
                    title="ground truth")
    pred = bev_png(out / "bev_prediction.png", frame["points"], point_pred, extent=extent,
                   title="MinkUNet prediction after the demo's training")
    print(f"  BEV pictures: {pred} (and {truth.name} beside it)")
    return pred


def _table(names, before, after) -> str:
    width = max(len(n) for n in names)
    lines = [f"  {'class'.ljust(width)}  {'before':>7}  {'after':>7}"]
    for name in names:
        b, a = before["iou"][name], after["iou"][name]
        if math.isnan(b) and math.isnan(a):
            continue  # neither in the labels nor ever predicted
        cell = lambda v: "-" if math.isnan(v) else f"{100 * v:.1f}"  # noqa: E731
        lines.append(f"  {name.ljust(width)}  {cell(b):>7}  {cell(a):>7}")
    lines.append(f"  {'mIoU'.ljust(width)}  {100 * before['miou']:7.1f}  {100 * after['miou']:7.1f}")
    return "\n".join(lines)


def run_demo(data: Optional[str] = None, out: str = "runs/demo", device: str = "cpu", quick: bool = False,
             epochs: Optional[int] = None, scans: Optional[int] = None, seed: int = 0) -> Dict[str, float]:
    """Trains and evaluates; returns ``miou_before``, ``miou_after`` and ``seconds``."""
    start = time.perf_counter()
    settings = demo_settings(quick, epochs, scans)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if data is None:
        root = _synthetic_root(out_dir, settings["scans"], seed)
    else:
        root = Path(data)
        if not root.is_dir():
            raise FileNotFoundError(f"--data {data!r} is not a directory (give a SemanticKITTI root holding "
                                    "sequences/, or leave --data out to generate a synthetic set)")
    config = config_from_dict({
        "data": {"format": "semantickitti", "root": str(root), "voxel_size": settings["voxel_size"],
                 "crop": settings["crop"], "max_scans": settings["scans"], "batch_size": 2, "augment": True},
        "model": {"name": "minkunet", "cr": settings["cr"]},
        "optim": {"name": "adamw", "lr": settings["lr"], "weight_decay": 1e-4, "warmup_steps": 10,
                  "schedule": "cosine", "min_lr_ratio": 0.05},
        "train": {"epochs": settings["epochs"], "device": device, "seed": seed, "run_dir": str(out_dir / "run"),
                  "log_every": 5, "eval_every_epoch": False,
                  # fetch_on_demand is the fastest CPU dataflow; on CUDA the library default runs.
                  "conv_dataflow": "fetch_on_demand" if device == "cpu" else None},
    })
    print(f"torchsparse_pp demo: MinkUNet cr={settings['cr']} on {root} ({config.data.voxel_size} m voxels, "
          f"|x|, |y| < {config.data.crop} m), {device}, {torch.get_num_threads()} threads")
    trainer = Trainer(config, force=True)  # each demo starts its run over
    print(f"  {len(trainer.train_set)} train / {len(trainer.val_set)} val scans, {trainer.total_steps} steps "
          f"({settings['epochs']} epochs of {trainer.steps_per_epoch})")
    before = trainer.evaluate()
    after = trainer.fit(report=False)
    print("per-class IoU (%) on the val scans, before and after training:")
    print(_table(trainer.task.class_names, before, after))
    _bev_pictures(trainer, out_dir)
    seconds = time.perf_counter() - start
    print(f"  checkpoint and logs: {trainer.run_dir}; total {seconds:.0f} s")
    return {"miou_before": before["miou"], "miou_after": after["miou"], "seconds": seconds}
