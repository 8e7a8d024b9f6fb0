"""tune(): group discovery, the greedy search, a final check against every uniform config,
and per-group measurements, on a model and a few sample inputs."""
import copy
import datetime
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn
from tqdm import tqdm

from ..nn.functional.config import PassConfigs, get_default_config
from .binding import BINDINGS, MODES, slots
from .groups import ForwardFn, Group, conv_layers, discover_groups
from .identity import device_name, model_device, structural_hash
from .measure import EndToEndTimer, LossFn, fresh
from .search import Assignment, SearchResult, greedy_search, uniform
from .space import config_name, design_space, tile_mode


@dataclass
class TuneResult:
    """What a tuning run found; ``save(path)`` writes it as a tuned file, ``apply(model)`` sets it."""
    model_class: str
    structural_hash: str
    device_type: str
    device_name: str
    dtype: str
    mode: str
    binding: Optional[str]
    space: str
    samples: int
    repeats: int
    min_gain: float
    groups: List[Group]
    start: str                                # 'best_uniform' or 'default'
    default: Assignment
    assignment: Assignment
    search: SearchResult
    selected: str                             # name of the fastest final candidate ('greedy', ...)
    final: Dict[str, Dict[str, float]]        # final check: candidate -> median/min/max seconds
    group_seconds_before: Dict[str, float]    # forward seconds per group, default configs
    group_seconds_after: Dict[str, float]     # forward seconds per group, tuned configs
    tuning_seconds: float
    unreached: List[str] = field(default_factory=list)  # convs the sample did not reach (not tuned)
    date: str = field(default_factory=lambda: datetime.datetime.now().astimezone().isoformat(timespec="seconds"))

    def final_stats(self, label: str) -> Dict[str, float]:
        """Final-check stats of 'default', 'greedy' or 'uniform <config>', also when that
        candidate was timed under a joined name."""
        return next(v for k, v in self.final.items() if label in candidate_labels(k))

    def uniform_stats(self) -> Dict[str, Dict[str, float]]:
        """Final-check stats of every uniform config, by config name."""
        return {label[len(UNIFORM):]: v for k, v in self.final.items() for label in candidate_labels(k)
                if label.startswith(UNIFORM)}

    @property
    def before_seconds(self) -> float:
        return self.final_stats("default")["median_s"]

    @property
    def after_seconds(self) -> float:
        return self.final[self.selected]["median_s"]

    def layer_configs(self) -> Dict[str, PassConfigs]:
        return {layer: self.assignment[g.name] for g in self.groups for layer in g.layer_names}

    def apply(self, model: nn.Module) -> None:
        layers = conv_layers(model)
        for name, configs in self.layer_configs().items():
            layers[name].config = configs

    def save(self, path, meta: Optional[Dict[str, Any]] = None) -> None:
        """Writes the tuned file; ``meta``: more entries for its meta section."""
        from .configfile import save_tuned
        save_tuned(self, path, meta)

    def spread(self) -> float:
        """The timing noise of this run: the largest (max - min) / median of a final-check candidate."""
        return max((v["max_s"] - v["min_s"]) / v["median_s"] for v in self.final.values())

    def noise_warnings(self) -> List[str]:
        """Why the differences this result reports may be noise (empty when they are not)."""
        found = []
        spread = self.spread()
        if self.repeats < MIN_TRUSTED_REPEATS:
            found.append(
                f"--repeats {self.repeats}: each trial of the search is the median of {self.repeats} pass(es) and the "
                f"per-group times one pass, while passes of the final check spread by {spread:.0%} here; choices "
                f"that differ by less are noise (min gain {self.min_gain:.0%}). Use --repeats "
                f"{MIN_TRUSTED_REPEATS * 2 - 1} or more to trust the per-group picks")
        gain = self.before_seconds / self.after_seconds - 1
        if "default" not in candidate_labels(self.selected) and abs(gain) < spread:
            found.append(f"the selected configs' gain over the default ({gain:+.0%}) is within the final check's "
                         f"spread ({spread:.0%}): it may be noise; re-run with more --repeats or on a quieter machine")
        return found

    def table(self) -> str:
        from .report import format_table
        return format_table(self)


STARTS = ("best_uniform", "default")
MIN_TRUSTED_REPEATS = 3  # fewer timed passes per trial give no idea of the spread
UNIFORM = "uniform "
JOINED = " = "  # identical final candidates are timed once, under their labels joined by this


def candidate_labels(name: str) -> List[str]:
    """The labels of a final-check candidate ('greedy = uniform fetch_on_demand' has two)."""
    return name.split(JOINED)


def _merge_equal(named: Sequence[Tuple[str, Assignment]], groups: Sequence[str]) -> Dict[str, Assignment]:
    """Candidates of the final check, identical assignments timed once under a joined name
    ('greedy = uniform fetch_on_demand')."""
    merged: Dict[tuple, Tuple[List[str], Assignment]] = {}
    for name, assignment in named:
        key = tuple(assignment[g] for g in groups)
        merged.setdefault(key, ([], assignment))[0].append(name)
    return {JOINED.join(labels): assignment for labels, assignment in merged.values()}


def _final_check(timer: EndToEndTimer, candidates: Dict[str, Assignment], progress: bool,
                 desc: str) -> Dict[str, Dict[str, float]]:
    """Times every candidate round-robin, with a bar that names the one being timed."""
    names = list(candidates)
    rounds = timer.warmup + timer.repeats
    bar = tqdm(total=rounds * len(names), desc=desc, unit="pass", disable=not progress, dynamic_ncols=True)

    def on_pass(k: int) -> None:
        bar.update(1)
        bar.set_postfix(timing=names[k][:40], refresh=False)
    timer.on_pass = on_pass
    try:
        stats = timer.measure_all(list(candidates.values()))
    finally:
        timer.on_pass = None
        bar.close()
    return dict(zip(names, stats))


def _report_selected(final: Dict[str, Dict[str, float]], selected: str, progress: bool) -> None:
    """One line after the bars: what the table will say was chosen (the search bar showed the
    greedy picks, which the final check may overrule)."""
    if progress:
        stats = final[selected]
        tqdm.write(f"selected: {selected} ({1e3 * stats['median_s']:.1f} ms); the greedy picks "
                   f"{'are it' if 'greedy' in candidate_labels(selected) else 'measured slower in the final check'}")


def tune(model: nn.Module, samples: Sequence[Any], mode: str = "inference", binding: Optional[str] = None,
         space: str = "full", forward: Optional[ForwardFn] = None, loss: Optional[LossFn] = None,
         start: str = "best_uniform", repeats: int = 3, warmup: int = 1, min_gain: float = 0.05,
         final_rounds: Optional[int] = None,
         autocast_dtype: Optional[torch.dtype] = None, progress: bool = True) -> TuneResult:
    """Tunes the dataflow of every group of ``model`` on ``samples`` (inputs of
    ``forward(model, sample)``, default ``model(sample)``) by measured end-to-end latency.

    - ``mode``: 'inference' (forward under no_grad) or 'training' (forward + backward of
      ``loss(model, sample)``, default: mean of squared outputs), with ``binding`` 'workload'
      (the default), 'mapping' or 'none' (see tune.binding); inference takes no binding;
    - ``space``: 'full' or 'compact' (one config per dataflow), limited to the device's dataflows;
    - ``start``: the configs groups hold before their turn. 'best_uniform' (default) first times
      every config of the space on all groups at once (|space| more trials, ``final_rounds``
      rounds) and starts from the
      fastest, so the search only departs from it where a group gains more than ``min_gain``;
      'default' starts from the library default, as in TorchSparse++;
    - every trial is the median of ``repeats`` passes over all samples after ``warmup`` passes;
      a slot's choices are timed round-robin, and the slot keeps its current config unless a
      choice is more than ``min_gain`` faster (below that, timing noise would decide) and gains
      no more than the group's own time (forward time of its layers, x3 in training);
    - afterwards the greedy result, the default and every uniform config are timed round-robin
      (``final_rounds``, default max(repeats, 3)) and the fastest is selected.

    The model's weights, buffers, gradients, train/eval mode and layer configs are restored
    afterwards. "default" is the global default config (``set_default_config``); apply the result with
    ``result.apply(model)`` or save it with ``result.save(path)``.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode == "training":
        binding = binding or "workload"
        if binding not in BINDINGS:
            raise ValueError(f"binding must be one of {BINDINGS} for training, got {binding!r}")
    elif binding is not None:
        raise ValueError(f"binding={binding!r} applies to mode='training' only (inference tunes the forward pass)")
    if not samples:
        raise ValueError("tune needs at least one sample")
    if start not in STARTS:
        raise ValueError(f"start must be one of {STARTS}, got {start!r}")
    started = time.perf_counter()
    device = model_device(model)
    dtype = autocast_dtype or next(p.dtype for p in model.parameters())
    choices = design_space(device.type, space, tile_mode(dtype))
    layers = conv_layers(model)
    saved_configs = {name: conv.config for name, conv in layers.items()}
    saved_state = copy.deepcopy(model.state_dict())
    saved_grads = {name: None if p.grad is None else p.grad.clone() for name, p in model.named_parameters()}
    was_training = model.training
    try:
        groups = discover_groups(model, fresh(samples[0]), forward)
        timer = EndToEndTimer(model, samples, groups, mode, forward, loss, repeats, warmup, autocast_dtype)
        names = [g.name for g in groups]
        default = uniform(names, get_default_config(device.type))
        uniforms = [uniform(names, PassConfigs.of(c)) for c in choices]
        # The start and the final check decide most of the outcome: they get more rounds.
        careful = EndToEndTimer(model, samples, groups, mode, forward, loss, final_rounds or max(repeats, 3), 1,
                                autocast_dtype)
        if start == "best_uniform":
            seconds = careful(uniforms)
            start_assignment = uniforms[min(range(len(uniforms)), key=seconds.__getitem__)]
        else:
            start_assignment = default
        per_group = [(g.name, slots(mode, binding, choices)) for g in groups]
        # What a group can save at most: its own time (training: forward, dgrad and wgrad, about
        # three times its forward).
        measured: Dict[tuple, Dict[str, float]] = {}

        def group_seconds(assignment: Assignment) -> Dict[str, float]:
            """Per-group forward seconds, measured once per distinct assignment."""
            key = tuple(assignment[g] for g in names)
            if key not in measured:
                measured[key] = timer.group_forward_seconds(assignment)
            return measured[key]

        share = group_seconds(start_assignment)
        max_gain = {g: (3.0 if mode == "training" else 1.0) * t for g, t in share.items()}
        search = greedy_search(start_assignment, per_group, timer, min_gain, max_gain, progress=progress,
                               desc=f"tuning ({mode})")

        named = [("default", default), ("greedy", search.assignment)]
        named += [(UNIFORM + config_name(c), u) for c, u in zip(choices, uniforms)]
        candidates = _merge_equal(named, names)
        final = _final_check(careful, candidates, progress, f"final check ({mode})")
        selected = min(final, key=lambda n: (final[n]["median_s"], "default" in candidate_labels(n)))
        _report_selected(final, selected, progress)
        assignment = candidates[selected]
        before, after = group_seconds(default), group_seconds(assignment)
    finally:
        for name, conv in layers.items():
            conv.config = saved_configs[name]
        model.load_state_dict(saved_state)
        for name, p in model.named_parameters():
            p.grad = saved_grads[name]
        model.train(was_training)
    grouped = {layer for g in groups for layer in g.layer_names}
    unreached = [name for name in layers if name not in grouped]
    return TuneResult(type(model).__name__, structural_hash(model), device.type, device_name(device),
                      str(dtype).replace("torch.", ""), mode, binding, space, len(samples), repeats, min_gain, groups,
                      start, default, assignment, search, selected, final, before, after, time.perf_counter() - started,
                      unreached)
