"""Optimizer (SGD / AdamW) and the learning-rate schedule: linear warmup, then cosine or constant."""
import math

import torch

from .config import OptimConfig

__all__ = ["build_optimizer", "build_scheduler", "set_hyperparameters", "WarmupCosine"]


def build_optimizer(params, config: OptimConfig) -> torch.optim.Optimizer:
    params = [p for p in params if p.requires_grad]
    if config.name == "sgd":
        return torch.optim.SGD(params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay,
                               nesterov=config.nesterov)
    if config.name == "adamw":
        return torch.optim.AdamW(params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay)
    raise ValueError(f"unknown optimizer {config.name!r}")


class WarmupCosine:
    """lr factor at step s: (s + 1) / warmup during warmup, then cosine from 1 down to
    ``min_ratio`` at ``total`` steps (or 1 throughout with ``cosine=False``)."""

    def __init__(self, total: int, warmup: int, min_ratio: float, cosine: bool):
        self.total, self.warmup, self.min_ratio, self.cosine = total, warmup, min_ratio, cosine

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        if not self.cosine:
            return 1.0
        span = max(self.total - self.warmup, 1)
        progress = min((step - self.warmup) / span, 1.0)
        return self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def set_hyperparameters(optimizer: torch.optim.Optimizer, config: OptimConfig) -> None:
    """The config's hyperparameters on every param group (a loaded optimizer state brings the
    checkpoint's, which a resume with changed optim settings must not keep)."""
    for group in optimizer.param_groups:
        group["weight_decay"] = config.weight_decay
        if config.name == "sgd":
            group["momentum"], group["nesterov"] = config.momentum, config.nesterov
        else:
            group["betas"] = tuple(config.betas)


def build_scheduler(optimizer: torch.optim.Optimizer, config: OptimConfig, total_steps: int, start_step: int = 0):
    """A LambdaLR stepped once per optimizer step; ``start_step`` > 0 starts it there (a resumed
    run whose schedule changed: the lr follows the new schedule from that step on)."""
    schedule = WarmupCosine(total_steps, config.warmup_steps, config.min_lr_ratio, config.schedule == "cosine")
    if start_step > 0:
        for group in optimizer.param_groups:
            group["initial_lr"] = config.lr
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule, last_epoch=start_step - 1)
