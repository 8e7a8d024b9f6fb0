"""The Sparse Autotuner (torchsparse_pp.tune): group discovery by kernel map, the design space,
binding schemes, the greedy search under injected deterministic costs (never real timings),
tuned files (round trip, strict checks, malformed files), exactness of tuned models, and the
``tune`` CLI end to end with ``train`` / ``eval --tuned``.

Inputs are small crops of generated LiDAR scans drawn from fresh seeds. Tests run with one
torch thread (restored afterwards): tuning runs many tiny passes, and two threads fighting
over two cores make them ten times slower. Nothing here asserts on wall-clock speed.
"""
import copy
import dataclasses
import importlib
import itertools
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from torch import nn

import torchsparse_pp as tsp
from conftest import fresh_seed, lidar_coords
from precision import assert_as_accurate_as_plain, rel_err
from torchsparse_pp.models import CenterPoint, CenterPointConfig, MinkUNet
from torchsparse_pp.models.centerpoint import VoxelResBackBone8x, voxelize
from torchsparse_pp.data import generate_scan
from torchsparse_pp.nn import BatchNorm, Conv3d, ReLU
from torchsparse_pp.nn.functional.config import ConvConfig, PassConfigs
from torchsparse_pp.tune import (DESIGN_SPACE, EndToEndTimer, TunedFileError, apply, config_name, design_space,
                                 device_name, discover_groups, greedy_search, load_tuned, slots, structural_hash,
                                 tune, uniform)
from torchsparse_pp.tune.space import config_from_dict, config_to_dict

config_module = importlib.import_module("torchsparse_pp.nn.functional.config")

REPO = Path(__file__).resolve().parent.parent
DEFAULT = PassConfigs.of(ConvConfig(backend="native"))  # the library default on the CPU: native gather_scatter for every pass
PASSES = ("forward", "dgrad", "wgrad")


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def lidar_tensor(seed: int, batch: int = 1, voxel: float = 0.3, box: int = 16, channels: int = 4,
                 dtype=torch.float32) -> tsp.SparseTensor:
    coords = lidar_coords(seed, batch=batch, voxel=voxel, box=box)
    gen = torch.Generator().manual_seed(seed)
    return tsp.SparseTensor(torch.randn(len(coords), channels, generator=gen, dtype=dtype), coords)


def sparse_convs(model: nn.Module):
    """Every Conv3d of the model with a kernel larger than 1x1x1, by name (independent of the tuner)."""
    return {name: m for name, m in model.named_modules()
            if isinstance(m, Conv3d) and tuple(m.kernel_size) != (1, 1, 1)}


def layer_configs(model: nn.Module):
    return {name: m.config for name, m in model.named_modules() if isinstance(m, Conv3d)}


# --------------------------------------------------------------------------------------------
# Expected groups, written out from the architectures (module names as named_modules prints them)
# --------------------------------------------------------------------------------------------
def _body(prefix: str, blocks) -> list:
    return [f"{prefix}.{b}.body.{i}" for b in blocks for i in (0, 3)]


# MinkUNet: the stem and the last decoder stage are submanifold at stride 1; each encoder stage
# opens with a k2 s2 conv whose map its decoder's transposed conv reuses; each resolution's
# residual convs (encoder and decoder) share one submanifold map. Groups in order of first use.
MINKUNET_GROUPS = [
    ("submanifold", (3, 3, 3), (1, 1, 1), (1, 1, 1), ["stem.0.0", "stem.1.0"] + _body("decoder.3", (0, 1))),
    ("spconv", (2, 2, 2), (2, 2, 2), (1, 1, 1), ["encoder.0.0.0", "up.3.0"]),
    ("submanifold", (3, 3, 3), (1, 1, 1), (2, 2, 2), _body("encoder.0", (1, 2)) + _body("decoder.2", (0, 1))),
    ("spconv", (2, 2, 2), (2, 2, 2), (2, 2, 2), ["encoder.1.0.0", "up.2.0"]),
    ("submanifold", (3, 3, 3), (1, 1, 1), (4, 4, 4), _body("encoder.1", (1, 2)) + _body("decoder.1", (0, 1))),
    ("spconv", (2, 2, 2), (2, 2, 2), (4, 4, 4), ["encoder.2.0.0", "up.1.0"]),
    ("submanifold", (3, 3, 3), (1, 1, 1), (8, 8, 8), _body("encoder.2", (1, 2)) + _body("decoder.0", (0, 1))),
    ("spconv", (2, 2, 2), (2, 2, 2), (8, 8, 8), ["encoder.3.0.0", "up.0.0"]),
    ("submanifold", (3, 3, 3), (1, 1, 1), (16, 16, 16), _body("encoder.3", (1, 2))),
]
# 1x1x1 shortcuts of MinkUNet cr=0.5 (widths 16,16,32,64,128,128,64,48,48): encoder blocks that
# widen (stages 1-3; stage 0 keeps 16) and the first block of every decoder stage (after the concat).
MINKUNET_SHORTCUTS = ["encoder.1.1.shortcut.0", "encoder.2.1.shortcut.0", "encoder.3.1.shortcut.0",
                      "decoder.0.0.shortcut.0", "decoder.1.0.shortcut.0", "decoder.2.0.shortcut.0",
                      "decoder.3.0.shortcut.0"]

# VoxelResBackBone8x (inside CenterPoint as `backbone`): conv_input and stage 0's residual convs
# are submanifold at stride 1; stages 1-3 each open with a k3 s2 spconv conv (padding 1, the last
# (1, 1, 0)) that makes its own map, their residual convs share a submanifold map at the new
# stride; conv_out is a k(1,1,3) s(1,1,2) spconv conv at stride 8: eight groups, nothing transposed.
CENTERPOINT_GROUPS = [
    ("submanifold", (3, 3, 3), (1, 1, 1), (1, 1, 1), ["conv_input.0"] + _body("stages.0", (0, 1))),
    ("spconv", (3, 3, 3), (2, 2, 2), (1, 1, 1), ["stages.1.0.0"]),
    ("submanifold", (3, 3, 3), (1, 1, 1), (2, 2, 2), _body("stages.1", (1, 2))),
    ("spconv", (3, 3, 3), (2, 2, 2), (2, 2, 2), ["stages.2.0.0"]),
    ("submanifold", (3, 3, 3), (1, 1, 1), (4, 4, 4), _body("stages.2", (1, 2))),
    ("spconv", (3, 3, 3), (2, 2, 2), (4, 4, 4), ["stages.3.0.0"]),
    ("submanifold", (3, 3, 3), (1, 1, 1), (8, 8, 8), _body("stages.3", (1, 2))),
    ("spconv", (1, 1, 3), (1, 1, 2), (8, 8, 8), ["conv_out.0"]),
]
CENTERPOINT_PADDING = {"stages.1.0.0": (1, 1, 1), "stages.2.0.0": (1, 1, 1), "stages.3.0.0": (1, 1, 0),
                       "conv_out.0": (0, 0, 0)}

SMALL_CENTERPOINT = dict(point_cloud_range=(-12.8, -12.8, -2.0, 12.8, 12.8, 4.0), bev_filters=(32, 64),
                         bev_upsample_filters=(32, 32), head_channels=32)


def check_groups(groups, expected, model, prefix=""):
    assert [g.name for g in groups] == [f"g{i}" for i in range(len(expected))]
    assert len(groups) == len(expected)
    for group, (mode, kernel, stride, tensor_stride, members) in zip(groups, expected):
        assert group.mode == mode, group.name
        assert tuple(group.geometry.kernel_size) == kernel, group.name
        assert tuple(group.geometry.stride) == stride, group.name
        assert tuple(group.tensor_stride) == tensor_stride, group.name
        assert group.layer_names == [prefix + m for m in members], group.name
        assert group.pairs > 0 and group.num_in > 0 and group.num_out > 0
    convs = sparse_convs(model)
    grouped = [name for g in groups for name in g.layer_names]
    assert len(grouped) == len(set(grouped))  # no layer in two groups
    assert sorted(grouped) == sorted(convs)   # every non-pointwise conv in one


def neighbour_pairs(coords: torch.Tensor, reach: int = 1) -> int:
    """(out, in) pairs of a centred (2 reach + 1)^3 submanifold conv, by brute force over a dict."""
    sites = {tuple(row) for row in coords.tolist()}
    offsets = list(itertools.product(range(-reach, reach + 1), repeat=3))
    return sum((b, x + dx, y + dy, z + dz) in sites for (b, x, y, z) in sites for dx, dy, dz in offsets)


def downsample(coords: torch.Tensor) -> torch.Tensor:
    """The output sites of a k2 s2 conv: floor(x / 2) per axis (negatives included)."""
    return torch.unique(torch.cat([coords[:, :1], torch.div(coords[:, 1:], 2, rounding_mode="floor")], 1), dim=0)


# --------------------------------------------------------------------------------------------
# 1. Group discovery
# --------------------------------------------------------------------------------------------
def test_minkunet_groups_structure_and_pairs():
    seed = fresh_seed()
    model = MinkUNet(in_channels=4, num_classes=5, cr=0.5)
    x = lidar_tensor(seed, batch=2)
    was_training = model.training
    groups = discover_groups(model, x)
    assert model.training == was_training
    check_groups(groups, MINKUNET_GROUPS, model)
    # The transposed convs joined their strided conv's group; the strided ones are not transposed.
    for g in groups[1::2]:
        assert [layer.transposed for layer in g.layers] == [False, True]
    # No 1x1x1 conv is tuned, though the model has them.
    modules = dict(model.named_modules())
    grouped = {name for g in groups for name in g.layer_names}
    for name in MINKUNET_SHORTCUTS:
        assert isinstance(modules[name], Conv3d) and modules[name].kernel_size == (1, 1, 1)
        assert name not in grouped
    assert {n for n, m in modules.items() if isinstance(m, Conv3d) and m.kernel_size == (1, 1, 1)} == set(
        MINKUNET_SHORTCUTS)

    # Map sizes against brute force: the stride-1 3^3 submanifold map, the stride-2 one on the
    # downsampled sites, and k2 s2 (each input voxel in exactly one output's kernel).
    coords = x.C.long()
    down = downsample(coords)
    assert (groups[0].num_in, groups[0].num_out) == (len(coords), len(coords))
    assert groups[0].pairs == neighbour_pairs(coords)
    assert (groups[1].num_in, groups[1].num_out, groups[1].pairs) == (len(coords), len(down), len(coords))
    assert (groups[2].num_in, groups[2].pairs) == (len(down), neighbour_pairs(down))
    assert groups[0].pairs > len(coords)  # neighbours beyond the centre offset exist
    # LayerInfo macs: pairs x C_in x C_out.
    stem = groups[0].layers[0]
    assert (stem.in_channels, stem.out_channels) == (4, 16) and stem.macs == groups[0].pairs * 4 * 16


def test_centerpoint_groups_structure():
    seed = fresh_seed()
    config = CenterPointConfig.synthetic(**SMALL_CENTERPOINT)
    points = [generate_scan(32, seed=seed + b)["points"] for b in range(2)]
    x = voxelize(points, config)
    model = CenterPoint(config)
    groups = discover_groups(model, x, lambda m, v: m(v, 2))
    check_groups(groups, CENTERPOINT_GROUPS, model, prefix="backbone.")
    for g in groups:
        for layer in g.layer_names:
            name = layer[len("backbone."):]
            if name in CENTERPOINT_PADDING:
                assert tuple(g.geometry.padding) == CENTERPOINT_PADDING[name]
    assert groups[0].num_in == len(x.C) and groups[0].pairs == neighbour_pairs(x.C.long())

    # The bare backbone gives the same groups under its own names.
    backbone = VoxelResBackBone8x(config.point_features)
    check_groups(discover_groups(backbone, x), CENTERPOINT_GROUPS, backbone)


def test_discovery_rejects_model_without_maps():
    model = nn.Sequential(Conv3d(4, 8, 1), BatchNorm(8))
    with pytest.raises(ValueError, match="nothing to tune"):
        discover_groups(model, lidar_tensor(fresh_seed()))


# --------------------------------------------------------------------------------------------
# A tiny U-shaped model for search tests: three groups, module names that look like integers.
# --------------------------------------------------------------------------------------------
def tiny_model() -> nn.Sequential:
    torch.manual_seed(fresh_seed())
    return nn.Sequential(
        Conv3d(4, 8, 3), BatchNorm(8), ReLU(True),                       # 0: g0 (subm @1)
        Conv3d(8, 8, 2, stride=2), BatchNorm(8), ReLU(True),             # 3: g1 (k2 s2 @1)
        Conv3d(8, 8, 3), BatchNorm(8), ReLU(True),                       # 6: g2 (subm @2)
        Conv3d(8, 8, 2, stride=2, transposed=True), BatchNorm(8), ReLU(True),  # 9: g1
        Conv3d(8, 8, 3),                                                 # 12: g0
        Conv3d(8, 3, 1),                                                 # 13: pointwise, untuned
    )


TINY_GROUPS = {"g0": ["0", "12"], "g1": ["3", "9"], "g2": ["6"]}


def test_tiny_model_groups():
    model = tiny_model()
    groups = discover_groups(model, lidar_tensor(fresh_seed(), voxel=0.4))
    assert {g.name: g.layer_names for g in groups} == TINY_GROUPS


# --------------------------------------------------------------------------------------------
# 8. Design space
# --------------------------------------------------------------------------------------------
def test_design_space(monkeypatch):
    space = design_space("cpu")
    assert {c.backend for c in space} == {"native"}  # Triton on CPU tensors is interpreter-only
    for dataflow, grid in DESIGN_SPACE:
        for params in grid:
            assert ConvConfig(dataflow, backend="native", **params) in space
    assert {c.dataflow for c in space} == {"gather_scatter", "fetch_on_demand", "implicit_gemm"}
    gemm = {(c.sorted, c.split_mask_num) for c in space if c.dataflow == "implicit_gemm"}
    assert gemm == {(False, 0), (True, 1), (True, 2), (True, 3), (True, 4)}
    gs = {(c.epsilon, c.mm_thresh) for c in space if c.dataflow == "gather_scatter"}
    assert (0.0, 0) in gs and len(gs) > 1 and any(e > 0 and t > 0 for e, t in gs)
    assert len(space) == len(set(space)) == sum(len(grid) for _, grid in DESIGN_SPACE)

    compact = design_space("cpu", "compact")
    assert len(compact) == 4 and {c.dataflow for c in compact} == {"gather_scatter", "fetch_on_demand",
                                                                   "implicit_gemm"}
    assert all(c in space for c in compact)

    # Names are unique and readable; the file form of every config reads back to the same config.
    names = [config_name(c) for c in space]
    assert len(set(names)) == len(names)
    assert "fetch_on_demand" in names and "implicit_gemm(sorted, split=2)" in names
    for c in space:
        assert config_from_dict(config_to_dict(c), "test") == c
        assert config_to_dict(c)["dataflow"] == c.dataflow

    with pytest.raises(NotImplementedError, match="xpu"):
        design_space("xpu")
    with pytest.raises(ValueError, match="space"):
        design_space("cpu", "huge")

    monkeypatch.setitem(config_module.IMPLEMENTED, "cpu", ("gather_scatter",))
    only = design_space("cpu")
    assert only and {c.dataflow for c in only} == {"gather_scatter"}
    assert len(only) == len(dict(DESIGN_SPACE)["gather_scatter"])
    assert design_space("cpu", "compact") == [ConvConfig("gather_scatter", backend="native")]


# --------------------------------------------------------------------------------------------
# 6. Binding schemes: slots
# --------------------------------------------------------------------------------------------
def test_slots_shapes_and_errors():
    full, compact = design_space("cpu"), design_space("cpu", "compact")
    inference = slots("inference", None, full)
    assert len(inference) == 1 and len(inference[0][1]) == len(full)
    assert all(set(ch) == set(PASSES) and len(set(ch.values())) == 1 for ch in inference[0][1])

    workload = slots("training", "workload", full)
    assert [len(c) for _, c in workload] == [len(full)] * 2
    assert all(set(ch) == {"forward", "dgrad"} and ch["forward"] == ch["dgrad"] for ch in workload[0][1])
    assert all(set(ch) == {"wgrad"} for ch in workload[1][1])

    mapping = slots("training", "mapping", full)
    assert all(set(ch) == {"forward"} for ch in mapping[0][1])
    assert all(set(ch) == {"dgrad", "wgrad"} and ch["dgrad"] == ch["wgrad"] for ch in mapping[1][1])

    joint = slots("training", "none", compact)
    assert len(joint) == 1 and len(joint[0][1]) == len(compact) ** 3
    assert {tuple(ch[p] for p in PASSES) for ch in joint[0][1]} == set(itertools.product(compact, repeat=3))

    with pytest.raises(ValueError, match="compact"):
        slots("training", "none", full)  # 11^3 triples per group
    with pytest.raises(ValueError, match="mode"):
        slots("serving", "workload", full)
    with pytest.raises(ValueError, match="binding"):
        slots("training", "loose", full)
    with pytest.raises(ValueError, match="empty"):
        slots("inference", None, [])


# --------------------------------------------------------------------------------------------
# 5a / 6. The greedy search under injected costs (pure)
# --------------------------------------------------------------------------------------------
class CountingEvaluate:
    """greedy_search's evaluate: cost(assignment) for each candidate, recording every candidate."""

    def __init__(self, cost):
        self.cost = cost
        self.seen = []

    def __call__(self, assignments):
        self.seen += list(assignments)
        return [self.cost(a) for a in assignments]


def distinct_costs(rng: random.Random, *shape):
    """A nested table of distinct integer costs (exact in float sums, no ties)."""
    size = int(np.prod(shape))
    values = rng.sample(range(1, 100 * size), size)
    return np.array(values, dtype=np.float64).reshape(shape)


def test_greedy_search_additive_picks_argmin():
    rng = random.Random(fresh_seed())
    space = design_space("cpu")
    groups = [f"g{i}" for i in range(rng.randint(3, 7))]
    table = distinct_costs(rng, len(groups), len(space))
    index = {c: i for i, c in enumerate(space)}
    evaluate = CountingEvaluate(lambda a: sum(table[k][index[a[g].forward]] for k, g in enumerate(groups)))
    per_group = [(g, slots("inference", None, space)) for g in groups]
    result = greedy_search(uniform(groups, DEFAULT), per_group, evaluate, progress=False)
    for k, g in enumerate(groups):
        best = space[int(np.argmin(table[k]))]
        assert result.assignment[g] == PassConfigs.of(best), g
    assert len(result.trials) == len(evaluate.seen) == len(groups) * len(space)
    assert [t.group for t in result.trials] == [g for g in groups for _ in space]
    assert result.best_seconds == pytest.approx(table.min(1).sum())
    assert [s.choice for s in result.slots] == [config_name(space[int(np.argmin(table[k]))])
                                                for k in range(len(groups))]


def test_greedy_search_order_non_additive():
    """Group k is tuned with groups before it at their picks and groups after it at the start."""
    rng = random.Random(fresh_seed())
    space = design_space("cpu", "compact")
    n = len(space)
    groups = ["g0", "g1", "g2", "g3"]
    index = {c: i for i, c in enumerate(space)}
    unary = distinct_costs(rng, len(groups), n)
    pair = distinct_costs(rng, len(groups) - 1, n, n)  # couples neighbours: k's best depends on k-1 and k+1

    def cost(a):
        c = [index[a[g].forward] for g in groups]
        return sum(unary[k][c[k]] for k in range(len(groups))) + sum(pair[k][c[k]][c[k + 1]]
                                                                     for k in range(len(groups) - 1))

    evaluate = CountingEvaluate(cost)
    result = greedy_search(uniform(groups, DEFAULT), [(g, slots("inference", None, space)) for g in groups],
                           evaluate, progress=False)
    # The greedy definition, spelt out: positions chosen one by one, the rest at the start (index 0).
    chosen = [index[ConvConfig(backend="native")]] * len(groups)
    for k in range(len(groups)):
        chosen[k] = min(range(n), key=lambda i: (cost({g: PassConfigs.of(space[i if j == k else chosen[j]])
                                                       for j, g in enumerate(groups)}), i))
    assert [index[result.assignment[g].forward] for g in groups] == chosen
    # Each candidate the search evaluated had earlier groups at their picks, later ones at the start.
    for t, assignment in enumerate(evaluate.seen):
        k = t // n
        assert [index[assignment[g].forward] for g in groups[:k]] == chosen[:k]
        assert all(assignment[g] == DEFAULT for g in groups[k + 1:])
    assert len(evaluate.seen) == len(result.trials) == len(groups) * n

    # A hand-made case where greedy is not the global optimum: (a, b) costs, start (0, 0).
    cost2 = {(0, 0): 10.0, (1, 0): 9.0, (0, 1): 1.0, (1, 1): 8.0}
    two = [ConvConfig(backend="native"), ConvConfig("fetch_on_demand", backend="native")]
    ev = CountingEvaluate(lambda a: cost2[(two.index(a["a"].forward), two.index(a["b"].forward))])
    res = greedy_search(uniform(["a", "b"], DEFAULT), [(g, slots("inference", None, two)) for g in "ab"], ev,
                        progress=False)
    assert (res.assignment["a"].forward, res.assignment["b"].forward) == (two[1], two[1])  # cost 8, not 1
    assert len(ev.seen) == 4


def test_greedy_search_min_gain():
    space = [ConvConfig(backend="native"), ConvConfig("fetch_on_demand", backend="native"),
             ConvConfig("implicit_gemm", backend="native")]
    start = uniform(["g0"], DEFAULT)
    per_group = [("g0", slots("inference", None, space))]

    def run(costs, min_gain):
        return greedy_search(start, per_group, CountingEvaluate(lambda a: costs[space.index(a["g0"].forward)]),
                             min_gain=min_gain, progress=False)

    slight = {0: 1.0, 1: 0.95, 2: 1.2}   # fetch_on_demand only 5% faster than the start
    assert run(slight, 0.1).assignment["g0"] == DEFAULT
    assert run(slight, 0.0).assignment["g0"].forward == space[1]
    clear = {0: 1.0, 1: 0.95, 2: 0.8}    # implicit_gemm 20% faster
    assert run(clear, 0.1).assignment["g0"].forward == space[2]
    kept = run(slight, 0.1)
    assert kept.slots[0].start_seconds == 1.0 and kept.slots[0].seconds == 1.0
    # A gain larger than the group's own time is noise: max_gain_seconds caps what is believed.
    capped = greedy_search(start, per_group, CountingEvaluate(lambda a: clear[space.index(a["g0"].forward)]),
                           min_gain=0.1, max_gain_seconds={"g0": 0.1}, progress=False)
    assert capped.assignment["g0"] == DEFAULT
    believed = greedy_search(start, per_group, CountingEvaluate(lambda a: clear[space.index(a["g0"].forward)]),
                             min_gain=0.1, max_gain_seconds={"g0": 0.25}, progress=False)
    assert believed.assignment["g0"].forward == space[2]
    with pytest.raises(ValueError, match="min_gain"):
        run(slight, 1.0)
    with pytest.raises(ValueError, match="min_gain"):
        run(slight, -0.1)


@pytest.mark.parametrize("binding", ["workload", "mapping", "none"])
def test_training_bindings_bind_passes(binding):
    rng = random.Random(fresh_seed())
    space = design_space("cpu", "compact" if binding == "none" else "full")
    n = len(space)
    index = {c: i for i, c in enumerate(space)}
    groups = ["g0", "g1", "g2"]
    costs = distinct_costs(rng, len(groups), 3, n)         # separable: per group and pass
    joint = distinct_costs(rng, len(groups), n, n, n)       # non-separable: per group and triple

    def cost(a):
        if binding == "none":
            return sum(joint[k][tuple(index[c] for c in a[g])] for k, g in enumerate(groups))
        return sum(costs[k][p][index[c]] for k, g in enumerate(groups) for p, c in enumerate(a[g]))

    evaluate = CountingEvaluate(cost)
    result = greedy_search(uniform(groups, DEFAULT), [(g, slots("training", binding, space)) for g in groups],
                           evaluate, progress=False)
    per_group = n ** 3 if binding == "none" else 2 * n
    assert len(result.trials) == len(evaluate.seen) == len(groups) * per_group
    for k, g in enumerate(groups):
        f, d, w = (index[c] for c in result.assignment[g])
        if binding == "workload":
            assert f == d == int(np.argmin(costs[k][0] + costs[k][1]))
            assert w == int(np.argmin(costs[k][2]))
        elif binding == "mapping":
            assert f == int(np.argmin(costs[k][0]))
            assert d == w == int(np.argmin(costs[k][1] + costs[k][2]))
        else:
            assert (f, d, w) == np.unravel_index(int(np.argmin(joint[k])), joint[k].shape)
    # Every candidate kept the bound passes equal.
    for a in evaluate.seen:
        for g in groups:
            if binding == "workload":
                assert a[g].forward == a[g].dgrad
            elif binding == "mapping":
                assert a[g].dgrad == a[g].wgrad


# --------------------------------------------------------------------------------------------
# 5b. The search through the real EndToEndTimer with an injected clock
# --------------------------------------------------------------------------------------------
class ConfigClock:
    """A clock whose every reading advances by the cost of the configs now set on the model's
    convs, so that run_once's stop - start is exactly that cost (one sample)."""

    def __init__(self, model, cost):
        self.convs = {name: m for name, m in model.named_modules() if isinstance(m, Conv3d)}
        self.cost = cost
        self.now = 0.0
        self.readings = 0

    def __call__(self):
        self.readings += 1
        self.now += sum(self.cost(group, self.convs[name].config)
                        for group, names in TINY_GROUPS.items() for name in names)
        return self.now


@pytest.mark.parametrize("mode, binding", [("inference", None), ("training", "workload"),
                                           ("training", "mapping"), ("training", "none")])
def test_search_through_timer_with_fake_clock(mode, binding):
    rng = random.Random(fresh_seed())
    model = tiny_model()
    x = lidar_tensor(fresh_seed(), voxel=0.4, box=12)
    groups = discover_groups(model, x)
    space = design_space("cpu", "compact" if binding == "none" else "full")
    n = len(space)
    index = {c: i for i, c in enumerate(space)}
    g_index = {g: k for k, g in enumerate(TINY_GROUPS)}
    costs = distinct_costs(rng, 3, 3, n)
    joint = distinct_costs(rng, 3, n, n, n)

    def cost(group, configs):
        k = g_index[group]
        ids = [index[c] for c in configs]
        if mode == "inference":
            return costs[k][0][ids[0]]
        if binding == "none":
            return joint[k][tuple(ids)]
        return sum(costs[k][p][i] for p, i in enumerate(ids))

    clock = ConfigClock(model, cost)
    timer = EndToEndTimer(model, [x], groups, mode, repeats=2, warmup=1, clock=clock)
    start = uniform([g.name for g in groups], DEFAULT)
    result = greedy_search(start, [(g.name, slots(mode, binding, space)) for g in groups], timer, progress=False)

    per_group = {None: n, "workload": 2 * n, "mapping": 2 * n, "none": n ** 3}[binding]
    assert len(result.trials) == timer.calls == len(groups) * per_group
    assert clock.readings == 2 * (1 + 2) * timer.calls  # two readings per pass, warmup 1 + repeats 2
    for g in groups:
        k = g_index[g.name]
        f, d, w = (index[c] for c in result.assignment[g.name])
        if mode == "inference":
            assert f == d == w == int(np.argmin(costs[k][0]))
        elif binding == "workload":
            assert f == d == int(np.argmin(costs[k][0] + costs[k][1])) and w == int(np.argmin(costs[k][2]))
        elif binding == "mapping":
            assert f == int(np.argmin(costs[k][0])) and d == w == int(np.argmin(costs[k][1] + costs[k][2]))
        else:
            assert (f, d, w) == np.unravel_index(int(np.argmin(joint[k])), joint[k].shape)
    # The reported seconds are the injected costs (two layers per group in g0 and g1).
    picked = sum(cost(g, result.assignment[g]) * len(names) for g, names in TINY_GROUPS.items())
    assert result.best_seconds == pytest.approx(picked, rel=1e-9)


# --------------------------------------------------------------------------------------------
# A real tuning run, shared: MinkUNet cr=0.25, two tiny samples, training mode
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        seed = fresh_seed()
        torch.manual_seed(seed)
        model = MinkUNet(in_channels=4, num_classes=5, cr=0.25)
        samples = [lidar_tensor(seed + 7 * i, voxel=0.3, box=14) for i in range(2)]
        # Some layers carry configs of their own beforehand: tune must put them back.
        model.stem[0][0].config = ConvConfig("fetch_on_demand")
        model.up[1][0].config = (ConvConfig("implicit_gemm"), ConvConfig(), ConvConfig("fetch_on_demand"))
        model.train()
        state_before = copy.deepcopy(model.state_dict())
        configs_before = layer_configs(model)
        hash_before = structural_hash(model)
        result = tune(model, samples, mode="training", binding="workload", space="compact", repeats=1, warmup=0,
                      progress=False)
        path = tmp_path_factory.mktemp("tuned") / "minkunet.yaml"
        result.save(path)
    finally:
        torch.set_num_threads(threads)
    return dict(model=model, samples=samples, result=result, path=path, state_before=state_before,
                configs_before=configs_before, hash_before=hash_before)


# --------------------------------------------------------------------------------------------
# 9. tune() leaves the model unchanged
# --------------------------------------------------------------------------------------------
def test_tune_restores_model(tuned):
    model, before = tuned["model"], tuned["state_before"]
    after = model.state_dict()
    assert set(after) == set(before)
    for key in before:
        assert torch.equal(after[key], before[key]), key
    assert any(k.endswith("num_batches_tracked") for k in before)  # BN buffers are part of the check
    assert layer_configs(model) == tuned["configs_before"]
    assert model.stem[0][0].config == PassConfigs.of(ConvConfig("fetch_on_demand"))
    assert structural_hash(model) == tuned["hash_before"]


def test_tune_restores_bn_statistics_it_changed():
    """A training-mode tune really moves BN statistics (so the restore above is needed)."""
    model = tiny_model().train()
    x = lidar_tensor(fresh_seed(), voxel=0.4, box=12)
    before = copy.deepcopy(model.state_dict())
    moved = []
    bn = model[1]
    bn.register_forward_hook(lambda m, i, o: moved.append(int(m.num_batches_tracked)))
    tune(model, [x], mode="training", binding="mapping", space="compact", repeats=1, warmup=0, progress=False)
    assert max(moved) > int(before["1.num_batches_tracked"])  # updated during tuning
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert all(m.config is None for m in model.modules() if isinstance(m, Conv3d))


def test_tune_rejects_bad_arguments():
    model = tiny_model()
    x = lidar_tensor(fresh_seed(), voxel=0.4, box=10)
    with pytest.raises(ValueError, match="mode"):
        tune(model, [x], mode="serving", progress=False)
    with pytest.raises(ValueError, match="binding"):
        tune(model, [x], mode="training", binding="loose", progress=False)
    with pytest.raises(ValueError, match="binding"):
        tune(model, [x], mode="inference", binding="workload", progress=False)
    with pytest.raises(ValueError, match="start"):
        tune(model, [x], start="random", progress=False)
    with pytest.raises(ValueError, match="sample"):
        tune(model, [], progress=False)
    with pytest.raises(ValueError, match="repeats"):
        EndToEndTimer(model, [x], [], "inference", repeats=0)


# --------------------------------------------------------------------------------------------
# 3. Tuned file round trip
# --------------------------------------------------------------------------------------------
def test_tuned_file_round_trip(tuned):
    result, path, model = tuned["result"], tuned["path"], tuned["model"]
    text = path.read_text()
    assert "!!python" not in text and "!!" not in text
    doc = yaml.safe_load(text)  # plain YAML
    assert doc["torchsparse_pp_tuned"] == 1

    loaded = load_tuned(path)
    names = [g.name for g in result.groups]
    assert list(loaded.group_configs) == names == [f"g{i}" for i in range(9)]
    assert loaded.group_configs == result.assignment
    assert loaded.layers == {layer: g.name for g in result.groups for layer in g.layer_names}
    assert loaded.layer_configs() == result.layer_configs()
    assert len(loaded.layers) == len(sparse_convs(model)) == 42

    meta = loaded.meta
    assert meta["model"] == "MinkUNet" == result.model_class
    assert meta["structural_hash"] == result.structural_hash == structural_hash(model)
    assert meta["device"] == {"type": "cpu", "name": device_name(torch.device("cpu"))}
    assert (meta["mode"], meta["binding"], meta["space"]) == ("training", "workload", "compact")
    assert meta["dtype"] == "float32" and meta["samples"] == 2 and meta["repeats"] == 1
    assert meta["latency_before_s"] == pytest.approx(result.before_seconds, rel=1e-5)
    assert meta["latency_after_s"] == pytest.approx(result.after_seconds, rel=1e-5)
    assert meta["latency_before_s"] > 0 and meta["latency_after_s"] > 0
    assert meta["date"] == result.date
    assert meta["library"] == tsp.__version__ and meta["torch"] == str(torch.__version__)
    assert meta["selected"] == result.selected and meta["selected"] in meta["final_check"]
    assert meta["trials"] == len(result.search.trials) == 9 * 2 * 4
    for g in result.groups:
        entry = doc["groups"][g.name]
        assert entry["pairs"] == g.pairs and entry["key"] == g.key()
        assert entry["key"]["tensor_stride"] == list(g.tensor_stride)

    # workload binding: forward and dgrad equal in every group of the greedy result.
    for configs in result.search.assignment.values():
        assert configs.forward == configs.dgrad

    # apply() sets exactly those configs on exactly those layers, and nothing on the others.
    target = MinkUNet(in_channels=4, num_classes=5, cr=0.25)
    assert all(m.config is None for m in target.modules() if isinstance(m, Conv3d))
    applied = apply(target, path)
    assert applied.layers == loaded.layers
    for name, m in target.named_modules():
        if isinstance(m, Conv3d):
            assert m.config == loaded.layer_configs().get(name), name
    # The TuneResult's own apply does the same.
    other = MinkUNet(in_channels=4, num_classes=5, cr=0.25)
    result.apply(other)
    assert layer_configs(other) == layer_configs(target)

    table = result.table()
    assert all(f"g{i} " in table for i in range(9)) and "<- selected" in table


# --------------------------------------------------------------------------------------------
# 2. A tuned model computes what the untuned one does
# --------------------------------------------------------------------------------------------
def mixed_assignment(groups):
    """Different dataflows per group and per pass, walking the full space with three offsets."""
    space = design_space("cpu")
    return {g.name: PassConfigs(space[k % len(space)], space[(k + 4) % len(space)], space[(k + 8) % len(space)])
            for k, g in enumerate(groups)}


def outputs_and_grads(model, x, weight):
    model.zero_grad(set_to_none=True)
    feats = x.F.clone().requires_grad_(True)
    out = model(tsp.SparseTensor(feats, x.C))
    (out * weight).sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, feats.grad.clone()


def run_models(models, x, weight, training):
    results = []
    for model in models:
        model.train(training)
        results.append(outputs_and_grads(model, x, weight))
    return results


def compare_models(reference, tuned_model, x, training=True):
    """The tuned model's output, input gradient and parameter gradients against the untuned one's.
    float64: equal within float64 rounding; float32: as accurate as the untuned model's against
    the untuned model in float64 (precision.py: the dataflows sum in other orders)."""
    gen = torch.Generator().manual_seed(fresh_seed())
    weight = torch.randn(len(x.C), reference.num_classes, generator=gen, dtype=x.F.dtype)
    (out_a, grads_a, in_a), (out_b, grads_b, in_b) = run_models((reference, tuned_model), x, weight, training)
    assert out_a.std() > 0
    if x.F.dtype == torch.float32:
        exact_model = copy.deepcopy(reference).double()
        (out, grads, feats_grad), = run_models([exact_model], x.replace_feats(x.F.double()), weight.double(), training)
        results = lambda o, g, i: {"output": o, "input grad": i, **g}  # noqa: E731
        assert_as_accurate_as_plain(results(out_b, grads_b, in_b), results(out_a, grads_a, in_a),
                                    results(out, grads, feats_grad), what="tuned model", jointly=grads)
        return
    assert x.F.dtype == torch.float64
    assert rel_err(out_b, out_a) < 1e-10
    assert rel_err(in_b, in_a) < 1e-10
    scale = max(g.abs().max().item() for g in grads_a.values())
    assert scale > 0
    for name in grads_a:
        a, b = grads_a[name], grads_b[name]
        assert (b - a).abs().max().item() <= 1e-10 * max(a.abs().max().item(), 1e-3 * scale), name


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_tuned_mixed_configs_match_untuned(tuned, tmp_path, dtype):
    result = tuned["result"]
    mix = mixed_assignment(result.groups)
    per_pass = {p: {getattr(c, p).dataflow for c in mix.values()} for p in PASSES}
    assert all(v == {"gather_scatter", "fetch_on_demand", "implicit_gemm"} for v in per_pass.values())
    assert any(len({c.dataflow for c in configs}) == 3 for configs in mix.values())
    path = tmp_path / "mixed.yaml"
    dataclasses.replace(result, assignment=mix).save(path)

    reference = copy.deepcopy(tuned["model"]).to(dtype)
    for m in reference.modules():
        if isinstance(m, Conv3d):
            m.config = None  # library default everywhere
    tuned_model = copy.deepcopy(reference)
    apply(tuned_model, path)
    convs = dict(tuned_model.named_modules())
    for g in result.groups:
        for name in g.layer_names:
            assert convs[name].config == mix[g.name]
    x = lidar_tensor(fresh_seed(), batch=2, voxel=0.25, box=16, dtype=dtype)
    # float32 runs in eval mode (BatchNorm on running statistics; every conv pass still runs):
    # train-mode BatchNorm over a few hundred points turns float32 rounding into errors of 1e-3 ..
    # 5e-2 against float64 on some parameters of either model, which would test the draw.
    compare_models(reference, tuned_model, x, training=dtype == torch.float64)


def test_real_tuned_file_matches_untuned(tuned):
    reference = MinkUNet(in_channels=4, num_classes=5, cr=0.25)
    tuned_model = copy.deepcopy(reference)
    applied = apply(tuned_model, tuned["path"])
    for name, m in tuned_model.named_modules():
        if isinstance(m, Conv3d):
            assert m.config == applied.layer_configs().get(name), name
    reference, tuned_model = reference.double(), tuned_model.double()
    x = lidar_tensor(fresh_seed(), voxel=0.3, box=16, dtype=torch.float64)
    compare_models(reference, tuned_model, x)


# --------------------------------------------------------------------------------------------
# 4. Mismatched, malformed and unrunnable files
# --------------------------------------------------------------------------------------------
def edited(tmp_path, source, name, edit):
    doc = yaml.safe_load(Path(source).read_text())
    edit(doc)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_apply_to_other_model_raises(tuned):
    path = tuned["path"]
    wider = MinkUNet(in_channels=4, num_classes=5, cr=0.5)
    with pytest.raises(TunedFileError, match="structural hash"):
        apply(wider, path)
    assert all(m.config is None for m in wider.modules() if isinstance(m, Conv3d))  # nothing half-applied
    with pytest.warns(UserWarning, match="structural hash"):
        loaded = apply(wider, path, strict=False)
    for name, m in wider.named_modules():
        if isinstance(m, Conv3d):
            assert m.config == loaded.layer_configs().get(name), name

    backbone = VoxelResBackBone8x(4)
    with pytest.raises(TunedFileError, match="structural hash"):
        apply(backbone, path)
    with pytest.warns(UserWarning) as record:
        apply(backbone, path, strict=False)
    messages = " ".join(str(w.message) for w in record)
    assert "structural hash" in messages and "no sparse conv" in messages
    assert all(m.config is None for m in backbone.modules() if isinstance(m, Conv3d))


@pytest.mark.parametrize("field, value", [("name", "Imaginary Accelerator 9000"), ("type", "cuda")])
def test_apply_on_other_device_raises(tuned, tmp_path, field, value):
    path = edited(tmp_path, tuned["path"], "device.yaml", lambda d: d["meta"]["device"].__setitem__(field, value))
    model = MinkUNet(in_channels=4, num_classes=5, cr=0.25)
    with pytest.raises(TunedFileError, match="made on"):
        apply(model, path)
    assert all(m.config is None for m in model.modules() if isinstance(m, Conv3d))
    with pytest.warns(UserWarning, match=value):
        apply(model, path, strict=False)
    assert model.stem[0][0].config == load_tuned(path).group_configs["g0"]


def _del(*keys):
    def edit(doc):
        for key in keys[:-1]:
            doc = doc[key]
        del doc[keys[-1]]
    return edit


def _set(value, *keys):
    def edit(doc):
        for key in keys[:-1]:
            doc = doc[key]
        doc[keys[-1]] = value
    return edit


@pytest.mark.parametrize("edit, message", [
    (_del("groups"), "missing 'groups'"),
    (_del("layers"), "missing 'layers'"),
    (_del("meta", "structural_hash"), "structural_hash"),
    (_del("meta", "device"), "device"),
    (_del("groups", "g1", "wgrad"), "missing 'wgrad'"),
    (_set("warp_drive", "groups", "g0", "forward", "dataflow"), "warp_drive"),
    (_set({"dataflow": "fetch_on_demand", "epsilon": 0.5}, "groups", "g2", "dgrad"), "epsilon"),
    (_set({"sorted": True}, "groups", "g2", "dgrad"), "dataflow"),
    (_set("g42", "layers", "stem.0.0"), "g42"),
    (_set(2, "torchsparse_pp_tuned"), "a tuned file of version 2; torchsparse_pp .* reads version 1"),
])
def test_malformed_files_raise(tuned, tmp_path, edit, message):
    path = edited(tmp_path, tuned["path"], "bad.yaml", edit)
    model = MinkUNet(in_channels=4, num_classes=5, cr=0.25)
    with pytest.raises(TunedFileError, match=message):
        load_tuned(path)
    with pytest.raises(TunedFileError, match=message):
        apply(model, path, strict=False)
    assert all(m.config is None for m in model.modules() if isinstance(m, Conv3d))


def test_not_a_tuned_file(tmp_path):
    model = MinkUNet(in_channels=4, num_classes=5, cr=0.25)
    with pytest.raises(TunedFileError, match="not a torchsparse_pp tuned file"):
        apply(model, REPO / "configs" / "demo_minkunet.yaml")
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    with pytest.raises(TunedFileError, match="not a torchsparse_pp tuned file"):
        load_tuned(listing)
    broken = tmp_path / "broken.yaml"
    broken.write_text("torchsparse_pp_tuned: 1\ngroups: [unclosed\n")
    with pytest.raises(TunedFileError, match="not valid YAML"):
        load_tuned(broken)
    pickled = tmp_path / "tagged.yaml"
    pickled.write_text("torchsparse_pp_tuned: 1\nmeta: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(TunedFileError):
        load_tuned(pickled)  # safe_load: python tags are refused, never run
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tuned(tmp_path / "missing.yaml")
    with pytest.raises(FileNotFoundError):
        apply(model, tmp_path / "missing.yaml")


def test_unimplemented_dataflow_raises(tuned, tmp_path, monkeypatch):
    result = tuned["result"]
    path = tmp_path / "mixed.yaml"
    dataclasses.replace(result, assignment=mixed_assignment(result.groups)).save(path)
    model = MinkUNet(in_channels=4, num_classes=5, cr=0.25)
    monkeypatch.setitem(config_module.IMPLEMENTED, "cpu", ("gather_scatter", "fetch_on_demand"))
    for strict in (True, False):
        with pytest.raises(TunedFileError, match="implicit_gemm"):
            apply(model, path, strict=strict)
    assert all(m.config is None for m in model.modules() if isinstance(m, Conv3d))
    monkeypatch.undo()
    apply(model, path)  # fine once the kernels exist
    assert model.encoder[0][0][0].config == mixed_assignment(result.groups)["g1"]


def test_tiny_model_file_with_integer_like_layer_names(tmp_path):
    """Module names '0', '12' (nn.Sequential) stay strings through the YAML file."""
    model = tiny_model()
    x = lidar_tensor(fresh_seed(), voxel=0.4, box=12)
    result = tune(model, [x], mode="inference", space="compact", repeats=1, warmup=0, progress=False)
    path = tmp_path / "tiny.yaml"
    result.save(path)
    loaded = load_tuned(path)
    assert loaded.layers == {name: g for g, names in TINY_GROUPS.items() for name in names}
    fresh_model = copy.deepcopy(model)
    apply(fresh_model, path)
    assert fresh_model[12].config == loaded.group_configs["g0"] == fresh_model[0].config
    assert fresh_model[13].config is None


# --------------------------------------------------------------------------------------------
# 7. CLI end to end
# --------------------------------------------------------------------------------------------
SMALL_DATA = ["data.voxel_size=0.4", "data.crop=8.0"]
DEMO_CONFIG = str(REPO / "configs" / "demo_minkunet.yaml")


def run_cli(*args, timeout=180):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "torchsparse_pp.cli", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def cli_tuned(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "t.yaml"
    proc = run_cli("tune", "--config", DEMO_CONFIG, "--synthetic", "--samples", 1, "--repeats", 1,
                   "--warmup", 0, "--space", "compact", "--threads", 1, "--out", out, *SMALL_DATA)
    return proc, out


def test_cli_tune_then_train_and_eval(cli_tuned, tmp_path, capsys):
    from torchsparse_pp.cli import main
    from torchsparse_pp.data.synth import write_synthetic

    proc, out = cli_tuned
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    for i in range(9):
        assert any(line.startswith(f"g{i} ") for line in lines), i
    assert "<- selected" in proc.stdout and f"wrote {out}" in proc.stdout
    assert out.is_file()
    loaded = load_tuned(out)
    assert loaded.meta["model"] == "MinkUNet" and loaded.meta["mode"] == "inference"
    assert loaded.meta["binding"] is None and loaded.meta["samples"] == 1
    assert list(loaded.group_configs) == [f"g{i}" for i in range(9)] and len(loaded.layers) == 42

    root = tmp_path / "data"
    write_synthetic(root, format="semantickitti", scans=1, seed=fresh_seed() % 10000, progress=False)
    common = [f"data.root={root}", "data.batch_size=1", "train.threads=1", "train.progress=false",
              f"train.run_dir={tmp_path / 'run'}", *SMALL_DATA]
    assert main(["train", "--config", DEMO_CONFIG, "--tuned", str(out), "train.max_steps=1",
                 "train.epochs=1", *common]) == 0
    printed = capsys.readouterr().out
    assert f"tuned configs from {out} on 42 sparse convs" in printed
    checkpoint = tmp_path / "run" / "last.pt"
    assert checkpoint.is_file()
    assert main(["eval", "--config", DEMO_CONFIG, "--checkpoint", str(checkpoint),
                 "--tuned", str(out), *common]) == 0
    printed = capsys.readouterr().out
    assert f"tuned configs from {out}" in printed and "mIoU" in printed

    # A file from another machine: an error by default, a warning with train.tuned_strict=false.
    other = tmp_path / "other_machine.yaml"
    doc = yaml.safe_load(out.read_text())
    doc["meta"]["device"]["name"] = "Some Other CPU 9000"
    other.write_text(yaml.safe_dump(doc))
    assert main(["eval", "--config", DEMO_CONFIG, "--checkpoint", str(checkpoint), "--tuned", str(other),
                 *common]) == 2
    assert "tuned_strict" in capsys.readouterr().err
    assert main(["eval", "--config", DEMO_CONFIG, "--checkpoint", str(checkpoint), "--tuned", str(other),
                 "train.tuned_strict=false", *common]) == 0
    assert "warning: the tuned file was made on cpu (Some Other CPU 9000)" in capsys.readouterr().err


def test_cli_tune_training_mapping(tmp_path):
    out = tmp_path / "train.yaml"
    proc = run_cli("tune", "--config", DEMO_CONFIG, "--synthetic", "--samples", 1, "--repeats", 1,
                   "--warmup", 0, "--space", "compact", "--threads", 1, "--mode", "training", "--binding",
                   "mapping", "--out", out, *SMALL_DATA, "data.batch_size=1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "binding mapping" in proc.stdout
    loaded = load_tuned(out)
    assert (loaded.meta["mode"], loaded.meta["binding"]) == ("training", "mapping")
    assert loaded.meta["trials"] == 9 * 2 * 4
    search = loaded.meta["search"]
    assert [(s["group"], s["slot"]) for s in search] == [(f"g{i}", slot) for i in range(9)
                                                         for slot in ("forward", "dgrad+wgrad")]
    # Whatever was selected (greedy under the mapping binding, the default or a uniform config),
    # dgrad and wgrad share one config in every group.
    for configs in loaded.group_configs.values():
        assert configs.dgrad == configs.wgrad


@pytest.mark.parametrize("args, message", [
    (["--samples", "0"], "argument --samples: must be >= 1"),
    (["--repeats", "0"], "argument --repeats: must be >= 1"),
    (["--warmup", "-1"], "argument --warmup: must be >= 0"),
    (["--dtype", "float16"], "float16"),
    (["--binding", "mapping"], "--binding applies to --mode training only"),
])
def test_cli_rejects_bad_arguments(tmp_path, capsys, args, message):
    from torchsparse_pp.cli import main

    assert main(["tune", "--config", DEMO_CONFIG, "--synthetic", "--out", str(tmp_path / "x.yaml"), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x.yaml").exists()


def test_cli_bad_arguments_exit_nonzero(tmp_path):
    proc = run_cli("tune", "--config", DEMO_CONFIG, "--synthetic", "--samples", 0,
                   "--out", tmp_path / "x.yaml", timeout=60)
    assert proc.returncode == 2 and "--samples: must be >= 1" in proc.stderr
    proc = run_cli("tune", "--config", DEMO_CONFIG, "--mode", "serving", "--out", tmp_path / "x.yaml",
                   timeout=60)
    assert proc.returncode == 2 and "--mode" in proc.stderr
