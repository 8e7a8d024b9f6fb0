"""Which passes share a config while tuning (binding schemes), and the choices of each slot.

A slot is a set of passes of one group tuned together. Inference tunes the forward pass only
(dgrad and wgrad follow it). Training tunes forward, dgrad and wgrad:
- ``workload``: forward and dgrad bound (the same GEMM shapes), wgrad on its own: 2|S| trials;
- ``mapping``: dgrad and wgrad bound (one map view serves both), forward on its own: 2|S| trials;
- ``none``: the three passes independent, every triple tried jointly: |S|^3 trials (a baseline
  for small spaces).
"""
import itertools
from typing import Dict, List, Sequence, Tuple

from ..nn.functional.config import ConvConfig, PassConfigs
from .space import config_name

PASSES = ("forward", "dgrad", "wgrad")
MODES = ("inference", "training")
BINDINGS = ("workload", "mapping", "none")

# Largest |S|^3 that binding='none' accepts per group.
MAX_JOINT_CHOICES = 512

Choice = Dict[str, ConvConfig]  # pass -> config; passes left out keep their current config


def slots(mode: str, binding: str, space: Sequence[ConvConfig]) -> List[Tuple[str, List[Choice]]]:
    """The slots of one group, in tuning order, each with its choices."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if not space:
        raise ValueError("the design space is empty")
    if mode == "inference":
        return [("forward", [dict.fromkeys(PASSES, c) for c in space])]
    if binding not in BINDINGS:
        raise ValueError(f"binding must be one of {BINDINGS}, got {binding!r}")
    if binding == "workload":
        return [("forward+dgrad", [{"forward": c, "dgrad": c} for c in space]),
                ("wgrad", [{"wgrad": c} for c in space])]
    if binding == "mapping":
        return [("forward", [{"forward": c} for c in space]),
                ("dgrad+wgrad", [{"dgrad": c, "wgrad": c} for c in space])]
    if len(space) ** 3 > MAX_JOINT_CHOICES:
        raise ValueError(f"binding='none' tries |space|^3 = {len(space) ** 3} triples per group (limit "
                         f"{MAX_JOINT_CHOICES}); use space='compact' or the workload / mapping binding")
    return [("forward,dgrad,wgrad", [dict(zip(PASSES, triple)) for triple in itertools.product(space, repeat=3)])]


def with_choice(configs: PassConfigs, choice: Choice) -> PassConfigs:
    return PassConfigs(*(choice.get(p, getattr(configs, p)) for p in PASSES))


def choice_name(choice: Choice) -> str:
    names = {p: config_name(c) for p, c in choice.items()}
    if len(set(names.values())) == 1:
        return next(iter(names.values()))
    return ", ".join(f"{p}={n}" for p, n in names.items())
