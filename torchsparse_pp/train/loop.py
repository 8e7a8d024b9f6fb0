"""The training loop: one Trainer for segmentation and detection, 1 or N processes, CPU or CUDA,
with AMP, checkpoints that resume exactly, progress bars and logs."""
from __future__ import annotations

import contextlib
import json
import math
import random
import time
from pathlib import Path
from typing import Dict, List, Optional, Union

import numpy as np
import torch
from tqdm import tqdm

from .. import backends
from ..nn.functional import ConvConfig, default_config
from ..tune.configfile import apply as apply_tuned
from .checkpoint import load_checkpoint, save_checkpoint, set_rng_state
from .config import Config, config_to_dict, dump_config
from .data import build_dataset, build_loader, class_names
from .distributed import (DistInfo, average_buffers, average_gradients, broadcast_model, convert_sync_batchnorm,
                          init_distributed)
from .logging import RunLogger
from .optim import build_optimizer, build_scheduler
from .tasks import build_task

__all__ = ["Trainer", "format_results"]


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2 ** 32)
    torch.manual_seed(seed)


def _device(config: Config) -> torch.device:
    if config.train.device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("train.device is 'cuda' but torch sees no CUDA device (torch "
                               f"{torch.__version__}, CUDA build: {torch.version.cuda or 'no'}); use train.device=cpu")
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class Trainer:
    """``Trainer(config).fit()`` trains (resuming from ``resume`` when given) and evaluates after
    each epoch; ``evaluate()`` runs the val split. ``losses`` records every step's loss on
    this process, for tests and scripts."""

    def __init__(self, config: Config, resume: Optional[Union[str, Path]] = None, dist_info: Optional[DistInfo] = None):
        self.config = config
        train = config.train
        if train.threads:
            torch.set_num_threads(train.threads)
        self.conv_config = ConvConfig(train.conv_dataflow) if train.conv_dataflow else None
        self.dist = dist_info or init_distributed(train.device)
        self.device = _device(config)
        self.run_dir = Path(train.run_dir)
        _seed_everything(train.seed)

        self.train_set = build_dataset(config, train=True)
        self.val_set = build_dataset(config, train=False)
        self.task = build_task(config, class_names(config, self.train_set))
        self.train_loader = build_loader(config, self.train_set, True, self.dist.world_size, self.dist.rank)
        self.val_loader = build_loader(config, self.val_set, False, self.dist.world_size, self.dist.rank)

        model = self.task.build_model()
        if self.dist.world_size > 1:
            model = convert_sync_batchnorm(model)
        self.model = model.to(self.device)
        if train.tuned:
            tuned = apply_tuned(self.model, train.tuned, strict=train.tuned_strict)
            if self.dist.is_main:
                print(f"tuned configs from {train.tuned} on {len(tuned.layers)} sparse convs "
                      f"({tuned.meta.get('mode')}, tuned on {tuned.meta['device']['name']})", flush=True)
        if self.dist.world_size > 1:
            broadcast_model(self.model)
        self.steps_per_epoch = len(self.train_loader)
        if self.steps_per_epoch == 0:
            raise ValueError("the train loader has no batches")
        self.total_steps = train.epochs * self.steps_per_epoch
        if train.max_steps is not None:
            self.total_steps = min(self.total_steps, train.max_steps)
        self.optimizer = build_optimizer(self.model.parameters(), config.optim)
        self.scheduler = build_scheduler(self.optimizer, config.optim, self.total_steps)
        self.amp_dtype = None
        self.scaler = None
        if train.amp:
            self.amp_dtype = torch.float16 if self.device.type == "cuda" else torch.bfloat16
            if self.device.type == "cuda":
                self.scaler = torch.amp.GradScaler("cuda")
        self.step = 0           # optimizer steps done
        self.epoch = 0          # current epoch
        self.batch_in_epoch = 0  # batches of the current epoch done
        self.losses: List[float] = []
        self.logger = RunLogger(self.run_dir, enabled=self.dist.is_main)
        if resume is not None:
            self.load(resume)
        if self.dist.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            dump_config(config, self.run_dir / "config.yaml")

    # ------------------------------------------------------------------ checkpoints
    def save(self, path: Union[str, Path]) -> Optional[Path]:
        """Rank 0 writes; the other ranks hold identical state."""
        if not self.dist.is_main:
            return None
        return save_checkpoint(path, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
                               scaler=self.scaler, epoch=self.epoch, step=self.step,
                               batch_in_epoch=self.batch_in_epoch, world_size=self.dist.world_size,
                               config=config_to_dict(self.config))

    def load(self, path: Union[str, Path]) -> None:
        state = load_checkpoint(path, map_location=self.device)
        if state["world_size"] != self.dist.world_size:
            raise ValueError(f"checkpoint {str(path)!r} was written by {state['world_size']} processes; resume it "
                             f"with as many (this run has {self.dist.world_size}) so the data order continues")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if (state["scaler"] is None) != (self.scaler is None):
            raise ValueError("the checkpoint and this config disagree on AMP with a grad scaler (train.amp/device)")
        if self.scaler is not None:
            self.scaler.load_state_dict(state["scaler"])
        set_rng_state(state["rng"])
        self.epoch, self.step, self.batch_in_epoch = state["epoch"], state["step"], state["batch_in_epoch"]
        self.logger.drop_after(self.step)

    # ------------------------------------------------------------------ training
    @contextlib.contextmanager
    def library_settings(self):
        """train.deterministic and train.conv_dataflow, for the duration of a block only (the
        caller's settings come back afterwards)."""
        saved = backends.deterministic
        backends.deterministic = self.config.train.deterministic
        try:
            with default_config(self.conv_config) if self.conv_config else contextlib.nullcontext():
                yield
        finally:
            backends.deterministic = saved

    def _autocast(self):
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def train_step(self, batch) -> Dict[str, float]:
        with self.library_settings():
            return self._train_step(batch)

    def _train_step(self, batch) -> Dict[str, float]:
        self.model.train()
        with self._autocast():
            losses = self.task.loss(self.model, batch, self.device)
        loss = losses["loss"]
        if not torch.isfinite(loss):
            raise FloatingPointError(f"step {self.step}: the loss is {loss.item()}; lower optim.lr or check the data")
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            average_gradients(self.model)
            self.scaler.unscale_(self.optimizer)
        else:
            loss.backward()
            average_gradients(self.model)
        if self.config.optim.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.optim.grad_clip)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        if self.dist.world_size > 1:
            average_buffers(self.model)
        self.step += 1
        return {k: float(v.detach()) for k, v in losses.items()}

    def fit(self, report: bool = True) -> Dict[str, object]:
        """Trains to the end of the schedule, evaluating after each epoch (train.eval_every_epoch)
        and at the end; returns the last evaluation. ``report``: print each evaluation's table."""
        train = self.config.train
        result: Dict[str, object] = {}
        while self.step < self.total_steps:
            sampler = self.train_loader.sampler
            sampler.set_position(self.epoch, self.batch_in_epoch * self.config.data.batch_size)
            self.train_loader.generator.manual_seed(train.seed * 1000 + self.epoch)
            bar = tqdm(total=self.steps_per_epoch, initial=self.batch_in_epoch, desc=f"epoch {self.epoch + 1}",
                       unit="step", disable=not (train.progress and self.dist.is_main), dynamic_ncols=True)
            start = time.perf_counter()
            for batch in self.train_loader:
                values = self.train_step(batch)
                self.batch_in_epoch += 1
                self.losses.append(values["loss"])
                lr = self.optimizer.param_groups[0]["lr"]
                bar.update(1)
                bar.set_postfix(loss=f"{values['loss']:.4f}", lr=f"{lr:.2e}")
                if self.step % train.log_every == 0 or self.step == self.total_steps:
                    self.logger.log("train", self.step, dict(values, lr=lr, epoch=self.epoch,
                                                             seconds=time.perf_counter() - start))
                if train.checkpoint_every and self.step % train.checkpoint_every == 0:
                    self.save(self.run_dir / f"step_{self.step}.pt")
                if self.step >= self.total_steps:
                    break
            bar.close()
            if self.batch_in_epoch >= self.steps_per_epoch:
                self.epoch += 1
                self.batch_in_epoch = 0
            self.save(self.run_dir / "last.pt")
            if train.eval_every_epoch or self.step >= self.total_steps:
                result = self.evaluate()
                self.logger.log("eval", self.step, self.task.summary(result))
                if report and self.dist.is_main:
                    print(format_results(result, self.task.class_names), flush=True)
        self.logger.close()
        return result

    def evaluate(self, progress: Optional[bool] = None) -> Dict[str, object]:
        """The val split through the model (eval mode); every rank gets the combined result."""
        with self.library_settings(), torch.no_grad():
            return self._evaluate(progress)

    def _evaluate(self, progress: Optional[bool]) -> Dict[str, object]:
        self.model.eval()
        self.task.start_eval()
        show = self.config.train.progress if progress is None else progress
        for batch in tqdm(self.val_loader, desc="eval", unit="batch", disable=not (show and self.dist.is_main),
                          dynamic_ncols=True):
            with self._autocast():
                self.task.eval_batch(self.model, batch, self.device)
        result = self.task.finish_eval()
        if self.dist.is_main:
            summary = {k: _without_nan(v) for k, v in result.items() if k != "confusion"}
            (self.run_dir / "eval.json").write_text(json.dumps(summary, indent=1))
        return result


def _without_nan(value):
    """JSON has no NaN: classes that never occur become null."""
    if isinstance(value, dict):
        return {k: _without_nan(v) for k, v in value.items()}
    return None if isinstance(value, float) and math.isnan(value) else value


def format_results(result: Dict[str, object], names) -> str:
    """A per-class table (IoU or AP, '-' where a class never occurs) and the mean."""
    per_class = result["iou"] if "iou" in result else result["ap"]
    metric, mean = ("IoU", result["miou"]) if "iou" in result else ("AP", result["map"])
    width = max(len(n) for n in names)
    lines = [f"  {'class'.ljust(width)}  {metric:>6}"]
    for name in names:
        value = per_class[name]
        lines.append(f"  {name.ljust(width)}  {'-' if math.isnan(value) else f'{100 * value:6.1f}':>6}")
    lines.append(f"  {('m' + metric).ljust(width)}  {100 * mean:6.1f}")
    return "\n".join(lines)
