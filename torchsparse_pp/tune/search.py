"""Greedy group-by-group search on measured end-to-end latency (TorchSparse++'s autotuner).

Group k's slots try every choice with groups before k at their tuned configs and groups after k
at their starting configs; the fastest choice is kept. Trials: sum over groups and slots of the
slot's choices, i.e. linear in groups x choices.
"""
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

from tqdm import tqdm

from ..nn.functional.config import PassConfigs
from .binding import Choice, choice_name, with_choice

Assignment = Dict[str, PassConfigs]  # group name -> configs of its three passes
EvaluateMany = Callable[[Sequence[Assignment]], Sequence[float]]


@dataclass
class Trial:
    group: str
    slot: str
    choice: str
    seconds: float


@dataclass
class SlotResult:
    group: str
    slot: str
    choice: str
    seconds: float            # best end-to-end latency of the slot's trials
    start_seconds: float      # the slot's trial with the config it started from (None if not tried)


@dataclass
class SearchResult:
    assignment: Assignment
    trials: List[Trial] = field(default_factory=list)
    slots: List[SlotResult] = field(default_factory=list)

    @property
    def best_seconds(self) -> float:
        return self.slots[-1].seconds if self.slots else float("nan")


def greedy_search(start: Assignment, group_slots: Sequence[tuple], evaluate: EvaluateMany,
                  min_gain: float = 0.0, max_gain_seconds: Optional[Dict[str, float]] = None,
                  progress: bool = True, desc: str = "tuning") -> SearchResult:
    """``group_slots``: per group (in order) ``(group_name, [(slot_name, [choice, ...]), ...])``.

    ``evaluate(assignments)`` returns the end-to-end seconds of each whole assignment (every
    group); it gets a slot's candidates together so it can time them round-robin. Each candidate
    is one trial. Ties keep the current config, else the earlier choice. A slot keeps its current config unless the
    fastest choice beats it by more than ``min_gain`` (a fraction of the current end-to-end
    time) and, when ``max_gain_seconds[group]`` is given, by no more than those seconds (a group
    cannot save more time than it takes: a larger gain is timing noise)."""
    if not 0.0 <= min_gain < 1.0:
        raise ValueError(f"min_gain must lie in [0, 1), got {min_gain}")
    assignment = dict(start)
    total = sum(len(choices) for _, slots in group_slots for _, choices in slots)
    result = SearchResult(assignment)
    bar = tqdm(total=total, desc=desc, unit="trial", disable=not progress, dynamic_ncols=True)
    best_text = "-"
    watches = progress and hasattr(evaluate, "on_pass")  # an EndToEndTimer reports each timed pass
    try:
        for group, slots in group_slots:
            for slot, choices in slots:
                bar.set_description(f"{desc} {group} [{slot}]")
                candidates = [with_choice(assignment[group], choice) for choice in choices]
                names = [choice_name(choice) for choice in choices]
                if watches:
                    evaluate.on_pass = lambda k: bar.set_postfix(choice=names[k][:32], pick=best_text, refresh=False)
                seconds = [float(s) for s in evaluate([dict(assignment, **{group: c}) for c in candidates])]
                if len(seconds) != len(candidates):
                    raise RuntimeError(f"evaluate returned {len(seconds)} times for {len(candidates)} candidates")
                result.trials += [Trial(group, slot, n, t) for n, t in zip(names, seconds)]
                best = min(range(len(candidates)), key=lambda i: (seconds[i], i))
                current = next((i for i, c in enumerate(candidates) if c == assignment[group]), None)
                start_seconds = None if current is None else seconds[current]
                if current is not None:
                    gain = start_seconds - seconds[best]
                    cap = (max_gain_seconds or {}).get(group, float("inf"))
                    if gain <= min_gain * start_seconds or gain > cap:
                        best = current
                assignment[group] = candidates[best]
                result.slots.append(SlotResult(group, slot, names[best], seconds[best], start_seconds))
                best_text = f"{group} {names[best][:32]} {1e3 * seconds[best]:.1f}ms"
                bar.update(len(candidates))
                bar.set_postfix(pick=best_text)  # the slot's pick; the final check may overrule it
    finally:
        if watches:
            evaluate.on_pass = None
        bar.close()
    return result


def uniform(groups: Sequence[str], configs: PassConfigs) -> Assignment:
    return {g: configs for g in groups}


__all__ = ["Assignment", "Choice", "EvaluateMany", "SearchResult", "SlotResult", "Trial", "greedy_search", "uniform"]
