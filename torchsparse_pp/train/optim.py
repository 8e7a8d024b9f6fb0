"""Optimizer (SGD / AdamW) and the learning-rate schedule: linear warmup, then cosine or constant."""
import math

import torch

from .config import OptimConfig

__all__ = ["build_optimizer", "build_scheduler", "WarmupCosine"]


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


def build_scheduler(optimizer: torch.optim.Optimizer, config: OptimConfig, total_steps: int):
    """A LambdaLR stepped once per optimizer step."""
    schedule = WarmupCosine(total_steps, config.warmup_steps, config.min_lr_ratio, config.schedule == "cosine")
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
