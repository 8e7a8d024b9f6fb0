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
from .distributed import (DistInfo, all_reduce_sum, average_buffers, convert_sync_batchnorm, init_distributed,
                          unsynced_norms, wrap_ddp)
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
    each epoch; ``evaluate()`` runs the val split. ``losses`` records every step's loss (the
    mean over all processes), for tests and scripts.

    ``model`` is the plain module (what checkpoints hold and evaluation runs); with several
    processes, training steps run it through ``ddp``, its DistributedDataParallel wrapper
    (``train_model`` is whichever trains).

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

        model = self.task.build_model().to(self.device)
        if self.dist.world_size > 1 and train.sync_batchnorm:
            model = convert_sync_batchnorm(model)
        self.model = model
        if train.tuned:
            tuned = apply_tuned_file(self.model, config, train.tuned, strict=train.tuned_strict)
            if self.dist.is_main:
                part = f" of {tuned.applied_to}" if tuned.applied_to else ""
                print(f"tuned configs from {train.tuned} on {len(tuned.layers)} sparse convs{part} "
                      f"({tuned.meta.get('mode')}, tuned on {tuned.meta['device']['name']})", flush=True)
        # DDP starts every rank from rank 0's parameters and buffers and averages the gradients.
        self.ddp = wrap_ddp(self.model, self.device) if self.dist.world_size > 1 else None
        self.unsynced_norms = unsynced_norms(self.model) if self.dist.world_size > 1 else []
        self.accumulate = train.accumulate
        self.steps_per_epoch = len(self.train_loader) // self.accumulate
        if self.steps_per_epoch == 0:
            raise ValueError("the train loader has no batches" if len(self.train_loader) == 0 else
                             f"the train loader has {len(self.train_loader)} batches per epoch, fewer than "
                             f"train.accumulate={self.accumulate}")
        self.batches_per_epoch = self.steps_per_epoch * self.accumulate  # those of an epoch that train
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

    @property
    def train_model(self) -> torch.nn.Module:
        """What a training step runs: the DDP wrapper with several processes, else the model."""
        return self.ddp if self.ddp is not None else self.model

    @property
    def samples_per_step(self) -> int:
        """Samples in one optimizer step, over all processes."""
        return self.config.data.batch_size * self.accumulate * self.dist.world_size

    def _planned_total(self) -> int:
        """The step the schedule ends at: the epochs left from the current position, capped by
        train.max_steps (equal to epochs x steps per epoch unless a resume changed them)."""
        train = self.config.train
        remaining = (train.epochs - self.epoch) * self.steps_per_epoch - self.batch_in_epoch // self.accumulate
        total = self.step + max(remaining, 0)
        return total if train.max_steps is None else min(total, train.max_steps)

    # ------------------------------------------------------------------ checkpoints
    def save(self, path: Union[str, Path]) -> Optional[Path]:
        """Rank 0 writes; the other ranks hold identical state. The model's state dict is the
        plain module's (no DDP ``module.`` prefix), so any process count, or none, loads it."""
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
        stored, current = _with_new_defaults(state.get("config") or {}), config_to_dict(self.config)
        check_same_model(path, stored, current, state["extra"].get("class_names"), self.task.class_names)
        self.changes = differences(stored, current)
        # The data order is one permutation per epoch that the processes share out, so a run
        # continues on another number of processes; what counts is the samples per step.
        old_world = state["world_size"]
        old_batch = stored.get("data", {}).get("batch_size", self.config.data.batch_size)
        old_per_step = old_world * old_batch * stored.get("train", {}).get("accumulate", self.accumulate)
        schedule = schedule_changes(self.changes)
        if old_world != self.dist.world_size:
            self.changes.append(Change("processes", old_world, self.dist.world_size))
            if old_per_step != self.samples_per_step:
                schedule.append(Change("samples per step (processes x data.batch_size x train.accumulate)",
                                       old_per_step, self.samples_per_step))
        if old_per_step == self.samples_per_step:  # the same steps over the same samples
            schedule = [c for c in schedule if c.key not in ("data.batch_size", "train.accumulate")]
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
        # Same place in the epoch's sample order, counted in steps of this run (the identity
        # unless the samples per step changed).
        samples_done = self.batch_in_epoch * old_batch * old_world
        self.batch_in_epoch = -(-samples_done // self.samples_per_step) * self.accumulate
        if self.batch_in_epoch >= self.batches_per_epoch:
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

    def train_step(self, batches) -> Dict[str, float]:
        """One optimizer step on a batch, or on a list of batches whose gradients accumulate
        (train.accumulate of them in fit); returns the losses (means over all processes)."""
        with self.library_settings():
            return self._train_step(batches if isinstance(batches, (list, tuple)) else [batches])

    def _normalizer(self, batches) -> Optional[float]:
        """The divisor that turns each batch's summed loss into its share of the mean over every
        target of the step (all batches, all processes), so the averaged gradient equals one
        process's on all that data: N / world size (DDP divides by the world size again). None
        for one batch on one process (the batch mean) and for losses that normalise themselves."""
        world = self.dist.world_size
        if world == 1 and len(batches) == 1:
            return None
        counts = [self.task.target_count(b) for b in batches]
        if any(c is None for c in counts):
            return None
        total = all_reduce_sum(torch.tensor([float(sum(counts))], dtype=torch.float64, device=self.device))
        return max(float(total.item()), 1.0) / world

    def _train_step(self, batches) -> Dict[str, float]:
        model = self.train_model
        model.train()
        world = self.dist.world_size
        normalizer = self._normalizer(batches)
        # Losses that normalise themselves: the mean over the batches (DDP averages the processes).
        scale = 1.0 if normalizer is not None else 1.0 / len(batches)
        self.optimizer.zero_grad(set_to_none=True)
        totals, names = None, None
        for i, batch in enumerate(batches):
            # No gradient all-reduce until the last batch of the step.
            last = i == len(batches) - 1
            with self.ddp.no_sync() if (self.ddp is not None and not last) else contextlib.nullcontext():
                with self._autocast():
                    if normalizer is None:
                        losses = self.task.loss(model, batch, self.device)
                    else:
                        losses = self.task.loss(model, batch, self.device, normalizer)
                if scale != 1.0:
                    losses = {k: v * scale for k, v in losses.items()}
                names = list(losses)
                # Every process sees the same values (and stops together on a bad one).
                values = all_reduce_sum(torch.stack([v.detach().float() for v in losses.values()])) / world
                if not bool(torch.isfinite(values).all()):
                    raise FloatingPointError(f"step {self.step}: the loss is {float(values[0])}; lower optim.lr or "
                                             "check the data")
                totals = values if totals is None else totals + values
                loss = losses["loss"]
                (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        if self.config.optim.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.optim.grad_clip)
        self.last_lr = self.optimizer.param_groups[0]["lr"]  # this step's lr, before the scheduler moves on
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        average_buffers(self.unsynced_norms)
        self.step += 1
        return dict(zip(names, totals.tolist()))

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
            group = []
            try:
                while len(group) < self.accumulate:
                    group.append(next(batches))
            except StopIteration:  # the epoch's last batches short of a whole step are left out
                break
            except Exception:
                if stop.requested:  # Ctrl-C also reached the loader's worker processes
                    return False
                raise
            values = self.train_step(group)
            self.batch_in_epoch += len(group)
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
        if self.batch_in_epoch >= self.batches_per_epoch:
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


def _with_new_defaults(stored: Dict[str, object]) -> Dict[str, object]:
    """A checkpoint's stored config with the defaults of settings added since (so that a
    checkpoint written before them does not read as a change)."""
    if not stored:
        return stored
    out = dict(stored)
    out["train"] = dict({"accumulate": 1, "sync_batchnorm": True}, **(stored.get("train") or {}))
    return out


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
