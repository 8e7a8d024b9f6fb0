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
from .changes import Change, describe, differences, schedule_changes
from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint, set_rng_state
from .config import Config, config_to_dict, dump_config
from .data import build_dataset, build_loader, class_names
from .distributed import (DistInfo, average_buffers, average_gradients, broadcast_model, convert_sync_batchnorm,
                          init_distributed)
from .files import atomic_write_text
from .interrupt import StopRequest, TrainingInterrupted
from .logging import RunLogger
from .matching import apply_tuned_file, check_same_model, load_model_state
from .optim import build_optimizer, build_scheduler, set_hyperparameters
from .rundir import claim_new_run, claim_resumed_run
from .tasks import build_task

__all__ = ["Trainer", "TrainingInterrupted", "format_results", "result_summary"]


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
    this process, for tests and scripts.

    Nothing is written before ``fit()``, which first claims ``train.run_dir``: a directory holding
    another run is refused unless ``force`` (its run files are then replaced). A resume compares
    the config with the checkpoint's (``changes``): another model or data meaning is refused,
    schedule changes need ``force``."""

    def __init__(self, config: Config, resume: Optional[Union[str, Path]] = None, dist_info: Optional[DistInfo] = None,
                 force: bool = False):
        self.config = config
        self.force = force
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
            tuned = apply_tuned_file(self.model, config, train.tuned, strict=train.tuned_strict)
            if self.dist.is_main:
                part = f" of {tuned.applied_to}" if tuned.applied_to else ""
                print(f"tuned configs from {train.tuned} on {len(tuned.layers)} sparse convs{part} "
                      f"({tuned.meta.get('mode')}, tuned on {tuned.meta['device']['name']})", flush=True)
        if self.dist.world_size > 1:
            broadcast_model(self.model)
        self.steps_per_epoch = len(self.train_loader)
        if self.steps_per_epoch == 0:
            raise ValueError("the train loader has no batches")
        self.step = 0           # optimizer steps done
        self.epoch = 0          # current epoch
        self.batch_in_epoch = 0  # batches of the current epoch done
        self.total_steps = self._planned_total()
        self.optimizer = build_optimizer(self.model.parameters(), config.optim)
        self.scheduler = build_scheduler(self.optimizer, config.optim, self.total_steps)
        self.amp_dtype = None
        self.scaler = None
        if train.amp:
            self.amp_dtype = torch.float16 if self.device.type == "cuda" else torch.bfloat16
            if self.device.type == "cuda":
                self.scaler = torch.amp.GradScaler("cuda")
        self.losses: List[float] = []
        self.last_lr: Optional[float] = None    # the lr of the last step (before the scheduler moved on)
        self.finished = False                   # the schedule ran out and its final evaluation was saved
        self.final_summary: Dict[str, object] = {}  # that evaluation (per class), from the checkpoint
        self.changes: List[Change] = []         # settings that differ from the resumed checkpoint's
        self.resumed_from: Optional[Path] = None
        self.logger: Optional[RunLogger] = None
        if resume is not None:
            self.load(resume)

    def _planned_total(self) -> int:
        """The step the schedule ends at: the epochs left from the current position, capped by
        train.max_steps (equal to epochs x steps per epoch unless a resume changed them)."""
        train = self.config.train
        remaining = (train.epochs - self.epoch) * self.steps_per_epoch - self.batch_in_epoch
        total = self.step + max(remaining, 0)
        return total if train.max_steps is None else min(total, train.max_steps)

    # ------------------------------------------------------------------ checkpoints
    def save(self, path: Union[str, Path]) -> Optional[Path]:
        """Rank 0 writes; the other ranks hold identical state."""
        if not self.dist.is_main:
            return None
        extra = {"class_names": list(self.task.class_names), "finished": self.finished,
                 "total_steps": self.total_steps, "final": self.final_summary}
        return save_checkpoint(path, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
                               scaler=self.scaler, epoch=self.epoch, step=self.step,
                               batch_in_epoch=self.batch_in_epoch, world_size=self.dist.world_size,
                               config=config_to_dict(self.config), extra=extra)

    def load(self, path: Union[str, Path]) -> None:
        """Continues from a checkpoint (see the class doc for what may differ)."""
        state = load_checkpoint(path, map_location=self.device)
        if state["world_size"] != self.dist.world_size:
            raise CheckpointError(f"checkpoint {str(path)!r} was written by {state['world_size']} processes; resume "
                                  f"it with as many (this run has {self.dist.world_size}) so the data order continues")
        stored, current = state.get("config") or {}, config_to_dict(self.config)
        check_same_model(path, stored, current, state["extra"].get("class_names"), self.task.class_names)
        self.changes = differences(stored, current)
        schedule = schedule_changes(self.changes)
        if schedule and not self.force:
            raise CheckpointError(f"these settings change the schedule of the run in {str(path)!r}: "
                                  f"{describe(schedule, 'checkpoint', 'now')}; pass --force to continue under them "
                                  f"(the lr schedule is then recomputed from step {state['step']})")
        load_model_state(self.model, state["model"], path)
        if stored.get("optim", {}).get("name", self.config.optim.name) == self.config.optim.name:
            self.optimizer.load_state_dict(state["optimizer"])
            set_hyperparameters(self.optimizer, self.config.optim)
        if (state["scaler"] is None) != (self.scaler is None):
            raise CheckpointError("the checkpoint and this config disagree on AMP with a grad scaler "
                                  "(train.amp / train.device)")
        if self.scaler is not None:
            self.scaler.load_state_dict(state["scaler"])
        set_rng_state(state["rng"])
        self.epoch, self.step, self.batch_in_epoch = state["epoch"], state["step"], state["batch_in_epoch"]
        old_batch = stored.get("data", {}).get("batch_size", self.config.data.batch_size)
        if old_batch != self.config.data.batch_size or self.batch_in_epoch >= self.steps_per_epoch:
            # Same place in the epoch's sample order, counted in batches of the new size.
            self.batch_in_epoch = -(-self.batch_in_epoch * old_batch // self.config.data.batch_size)
            if self.batch_in_epoch >= self.steps_per_epoch:
                self.epoch, self.batch_in_epoch = self.epoch + 1, 0
        self.finished = bool(state["extra"].get("finished", False))
        self.final_summary = dict(state["extra"].get("final") or {})
        self.total_steps = self._planned_total()
        if schedule:
            self.scheduler = build_scheduler(self.optimizer, self.config.optim, self.total_steps, start_step=self.step)
        else:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.step < self.total_steps:
            self.finished = False
        self.resumed_from = Path(path)

    @property
    def done(self) -> bool:
        """A finished run: fit() has nothing to do and writes nothing."""
        return self.finished and self.step >= self.total_steps

    def _claim_run_dir(self) -> None:
        """Checks and prepares the run directory before any training (rank 0)."""
        if not self.dist.is_main:
            self.logger = RunLogger(self.run_dir, enabled=False)
            return
        if self.resumed_from is None:
            claim_new_run(self.run_dir, self.force)
        else:
            claim_resumed_run(self.run_dir, self.resumed_from, self.step, self.force)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        dump_config(self.config, self.run_dir / "config.yaml")
        self.logger = RunLogger(self.run_dir)
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
        self.last_lr = self.optimizer.param_groups[0]["lr"]  # this step's lr, before the scheduler moves on
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

    def _stop_agreed(self, stop: StopRequest) -> bool:
        """Whether to stop now: every rank stops at the same step, when any rank was asked."""
        if self.dist.world_size == 1:
            return stop.requested
        flag = torch.tensor([float(stop.requested)], device=self.device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bool(flag.item())

    def _train_epoch(self, bar, stop: StopRequest) -> bool:
        """Steps until the epoch or the schedule ends; False when a stop was requested."""
        train = self.config.train
        sampler = self.train_loader.sampler
        sampler.set_position(self.epoch, self.batch_in_epoch * self.config.data.batch_size)
        self.train_loader.generator.manual_seed(train.seed * 1000 + self.epoch)
        start = time.perf_counter()
        batches = iter(self.train_loader)
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                break
            except Exception:
                if stop.requested:  # Ctrl-C also reached the loader's worker processes
                    return False
                raise
            values = self.train_step(batch)
            self.batch_in_epoch += 1
            self.losses.append(values["loss"])
            bar.update(1)
            bar.set_postfix(epoch=f"{self.epoch + 1}/{train.epochs}", loss=f"{values['loss']:.4f}",
                            lr=f"{self.last_lr:.2e}")
            if self.step % train.log_every == 0 or self.step == self.total_steps:
                self.logger.log("train", self.step, dict(values, lr=self.last_lr, epoch=self.epoch,
                                                         seconds=time.perf_counter() - start))
            if train.checkpoint_every and self.step % train.checkpoint_every == 0:
                self.save(self.run_dir / f"step_{self.step}.pt")
            if self._stop_agreed(stop):
                return False
            if self.step >= self.total_steps:
                break
        if self.batch_in_epoch >= self.steps_per_epoch:
            self.epoch += 1
            self.batch_in_epoch = 0
        return True

    def fit(self, report: bool = True) -> Dict[str, object]:
        """Trains to the end of the schedule, evaluating after each epoch (train.eval_every_epoch)
        and at the end; returns the last evaluation. ``report``: print each evaluation's table.

        Ctrl-C stops after the current step, saves last.pt there and raises TrainingInterrupted.
        A finished run returns its final evaluation's summary and writes nothing."""
        if self.done:
            return dict(self.final_summary)
        train = self.config.train
        self._claim_run_dir()
        last = self.run_dir / "last.pt"
        result: Dict[str, object] = {}
        bar = tqdm(total=self.total_steps, initial=self.step, desc="train", unit="step", dynamic_ncols=True,
                   disable=not (train.progress and self.dist.is_main))
        try:
            with StopRequest("stopping after this step to save a checkpoint (Ctrl-C again to quit without "
                             "saving)" if self.dist.is_main else "") as stop:
                while True:
                    if self.step < self.total_steps:
                        going = self._train_epoch(bar, stop)
                        self.save(last)
                        if not going:
                            raise TrainingInterrupted(last, self.step, self.total_steps)
                    final = self.step >= self.total_steps
                    if train.eval_every_epoch or final:
                        result = self.evaluate(stop=stop, nested=bar)
                        self.logger.log("eval", self.step, self.task.summary(result))
                        if self.dist.is_main:
                            atomic_write_text(self.run_dir / "eval.json", json.dumps(result_summary(result), indent=1))
                        if report and self.dist.is_main:
                            bar.clear()
                            print(format_results(result, self.task.class_names), flush=True)
                    if final:
                        self.finished, self.final_summary = True, result_summary(result)
                        self.save(last)
                        return result
        finally:
            bar.close()
            self.logger.close()

    def evaluate(self, progress: Optional[bool] = None, stop: Optional[StopRequest] = None,
                 nested=None) -> Dict[str, object]:
        """The val split through the model (eval mode); every rank gets the combined result.
        Writes nothing. ``stop``: a Ctrl-C during fit (one process) ends it with TrainingInterrupted."""
        with self.library_settings(), torch.no_grad():
            return self._evaluate(progress, stop, nested)

    def _evaluate(self, progress: Optional[bool], stop: Optional[StopRequest], nested) -> Dict[str, object]:
        self.model.eval()
        self.task.start_eval()
        show = self.config.train.progress if progress is None else progress
        bar = tqdm(self.val_loader, desc="eval", unit="batch", disable=not (show and self.dist.is_main),
                   dynamic_ncols=True, leave=nested is None, position=1 if nested is not None else None)
        for batch in bar:
            if stop is not None and self.dist.world_size == 1 and stop.requested:
                bar.close()
                raise TrainingInterrupted(self.run_dir / "last.pt", self.step, self.total_steps)
            with self._autocast():
                self.task.eval_batch(self.model, batch, self.device)
        return self.task.finish_eval()


def result_summary(result: Dict[str, object]) -> Dict[str, object]:
    """An evaluation without the confusion matrix and NaN (JSON has none: classes that never
    occur become null)."""
    return {k: _without_nan(v) for k, v in result.items() if k != "confusion"}


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
