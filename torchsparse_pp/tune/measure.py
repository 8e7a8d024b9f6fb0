"""End-to-end timing of a model under an assignment of configs to groups.

Every timed run gets fresh SparseTensors (empty caches, made untimed), so kernel-map building
and each dataflow's map views are part of what is measured, as they are in real use.
"""
import contextlib
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
from torch import nn

from ..kmap.cache import KernelMapCache
from ..tensor import SparseTensor
from .groups import ForwardFn, Group, conv_layers
from .search import Assignment

LossFn = Callable[[nn.Module, Any], torch.Tensor]


def fresh(sample: Any) -> Any:
    """The sample with every SparseTensor given a new, empty kernel-map cache."""
    if isinstance(sample, SparseTensor):
        return SparseTensor._derive(sample.F, sample.C, sample.s, sample.spatial_range, KernelMapCache())
    if isinstance(sample, dict):
        return {k: fresh(v) for k, v in sample.items()}
    if isinstance(sample, (list, tuple)):
        return type(sample)(fresh(v) for v in sample)
    return sample


def output_loss(output: Any) -> torch.Tensor:
    """A scalar that depends on every floating output (mean of squares, summed)."""
    if isinstance(output, SparseTensor):
        output = output.F
    if isinstance(output, torch.Tensor):
        return output.float().square().mean() if output.is_floating_point() else output.new_zeros((), dtype=torch.float32)
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (list, tuple)) and output:
        return sum(output_loss(v) for v in output)
    raise TypeError(f"cannot make a training loss from a {type(output).__name__} output; pass loss=")


class EndToEndTimer:
    """``timer(assignment)`` -> median seconds of one pass over ``samples`` (inference: forward
    under no_grad in eval mode; training: forward + backward in train mode)."""

    def __init__(self, model: nn.Module, samples: Sequence[Any], groups: Sequence[Group], mode: str,
                 forward: Optional[ForwardFn] = None, loss: Optional[LossFn] = None, repeats: int = 3,
                 warmup: int = 1, autocast_dtype: Optional[torch.dtype] = None,
                 clock: Callable[[], float] = time.perf_counter):
        if repeats < 1 or warmup < 0:
            raise ValueError(f"need repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
        if not samples:
            raise ValueError("need at least one sample to time")
        self.model, self.samples, self.mode = model, list(samples), mode
        self.forward = forward or (lambda m, s: m(s))
        self.loss = loss or (lambda m, s: output_loss(self.forward(m, s)))
        self.repeats, self.warmup, self.clock = repeats, warmup, clock
        self.autocast_dtype = autocast_dtype
        layers = conv_layers(model)
        self.group_layers = {g.name: [layers[name] for name in g.layer_names] for g in groups}
        self.device = next(model.parameters()).device
        self.calls = 0
        # Called with the index of the assignment about to be timed (progress display).
        self.on_pass: Optional[Callable[[int], None]] = None

    def set_configs(self, assignment: Assignment) -> None:
        for group, convs in self.group_layers.items():
            for conv in convs:
                conv.config = assignment[group]

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def run_once(self) -> float:
        """Seconds of one pass over every sample with the configs currently set."""
        total = 0.0
        training = self.mode == "training"
        self.model.train(training)
        for sample in self.samples:
            sample = fresh(sample)
            if training:
                for p in self.model.parameters():
                    p.grad = None
            self._sync()
            start = self.clock()
            if training:
                with self._autocast():
                    loss = self.loss(self.model, sample)
                loss.backward()
            else:
                with torch.no_grad(), self._autocast():
                    self.forward(self.model, sample)
            self._sync()
            total += self.clock() - start
        return total

    def measure_runs(self, assignments: Sequence[Assignment]) -> List[List[float]]:
        """Seconds of every timed round of each assignment, timed round-robin (one pass each per
        round, ``warmup`` rounds first, the order rotated each round) so drifting load and the
        state one run leaves to the next hit all alike."""
        times: List[List[float]] = [[] for _ in assignments]
        n = len(assignments)
        for i in range(self.warmup + self.repeats):
            for k in [(i + j) % n for j in range(n)]:  # rotated per round: no fixed position effects
                if self.on_pass is not None:
                    self.on_pass(k)
                self.set_configs(assignments[k])
                seconds = self.run_once()
                if i >= self.warmup:
                    times[k].append(seconds)
        self.calls += len(assignments)
        return times

    def measure_all(self, assignments: Sequence[Assignment]) -> List[Dict[str, float]]:
        """Median / min / max seconds of each assignment over rounds of measure_runs."""
        return [{"median_s": statistics.median(t), "min_s": min(t), "max_s": max(t)}
                for t in self.measure_runs(assignments)]

    def __call__(self, assignments: Sequence[Assignment]) -> List[float]:
        """Drift-corrected median seconds of each assignment (greedy_search's evaluate): per
        round, each time is divided by the first assignment's time in that round; the median
        ratio times the first one's median seconds. Slow changes of machine speed cancel."""
        runs = self.measure_runs(assignments)
        reference = statistics.median(runs[0])
        return [reference * statistics.median(t / r for t, r in zip(times, runs[0])) for times in runs]

    def group_forward_seconds(self, assignment: Assignment) -> Dict[str, float]:
        """Forward seconds spent in each group's layers (map building included), from one pass
        with timing hooks (eval mode, no_grad)."""
        self.set_configs(assignment)
        spent = {g: 0.0 for g in self.group_layers}
        started: Dict[int, float] = {}
        handles = []
        for group, convs in self.group_layers.items():
            for conv in convs:
                def before(module, args, key=id(conv)):
                    self._sync()
                    started[key] = self.clock()

                def after(module, args, output, key=id(conv), group=group):
                    self._sync()
                    spent[group] += self.clock() - started.pop(key)
                handles += [conv.register_forward_pre_hook(before), conv.register_forward_hook(after)]
        self.model.eval()
        try:
            for sample in self.samples:
                with torch.no_grad(), self._autocast():
                    self.forward(self.model, fresh(sample))
        finally:
            for handle in handles:
                handle.remove()
        return spent
