"""torch.compile(fullgraph=True) of MinkUNet and CenterPoint on CPU: compiled == eager.

fullgraph=True makes any graph break an error, so these tests fail on the first one. The
oracle is the same model run eagerly on the same inputs: outputs within rel 1e-4, gradients
within rel 1e-3.

Backends: each model has an inductor test (inference: the compiled graph is inductor's generated
C++ plus our custom ops). The training steps use "aot_eager": the same dynamo graph capture (the
fullgraph check) and the same AOT-autograd forward / backward graphs with the custom ops'
autograd formulas, without inductor's C++ code generation, which alone takes 1.5 minutes for a
MinkUNet training graph on two cores (TSPP_COMPILE_TEST_INDUCTOR_TRAINING=1 runs the training
steps with inductor too).
"""
import copy
import os

import pytest
import torch

import torchsparse_pp as tsp
from torchsparse_pp.data import generate_scan
from torchsparse_pp.models import CenterPoint, CenterPointConfig, MinkUNet
from torchsparse_pp.models.centerpoint import build_targets, voxelize
from torchsparse_pp.models.centerpoint.loss import focal_heatmap_loss, regression_loss
from conftest import fresh_seed, random_coords
from model_helpers import randomise_norms
from precision import FACTOR, FLOOR, assert_as_accurate_as_plain, rel_err

TRAINING_BACKEND = "inductor" if os.environ.get("TSPP_COMPILE_TEST_INDUCTOR_TRAINING") == "1" else "aot_eager"


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def step_results(net: torch.nn.Module) -> dict:
    """Every parameter's gradient and floating-point buffer (BatchNorm's running statistics)."""
    assert all(p.grad is not None for p in net.parameters() if p.requires_grad)
    return {**{n: p.grad for n, p in net.named_parameters() if p.requires_grad},
            **{n: b for n, b in net.named_buffers() if b.is_floating_point()}}


def assert_step_as_accurate(compiled: torch.nn.Module, eager: torch.nn.Module, exact: torch.nn.Module, what: str):
    """A compiled training step sums in other orders than eager: its gradients and running
    statistics are as accurate as eager's against the same step in float64 (precision.py)."""
    grads = [n for n, p in eager.named_parameters() if p.requires_grad]
    assert_as_accurate_as_plain(step_results(compiled), step_results(eager), step_results(exact), what=what,
                                jointly=grads)


# --------------------------------------------------------------------------------------------
# MinkUNet
# --------------------------------------------------------------------------------------------
def minkunet_input(gen: torch.Generator, points: int = 500):
    coords = random_coords(gen, points, batch=2, low=-8, high=8)
    return torch.randn(len(coords), 4, generator=gen), coords


def test_minkunet_inference_inductor_fullgraph():
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = MinkUNet(in_channels=4, num_classes=5, cr=0.125).eval()
    randomise_norms(model, gen)
    compiled = torch.compile(model, fullgraph=True, backend="inductor", dynamic=True)
    exact_model = copy.deepcopy(model).double()
    for points in (500, 380):
        feats, coords = minkunet_input(gen, points)
        with torch.no_grad():
            expected = model(tsp.SparseTensor(feats, coords))
            got = compiled(tsp.SparseTensor(feats, coords))
            exact = exact_model(tsp.SparseTensor(feats.double(), coords))
        assert got.shape == expected.shape and got.dtype == expected.dtype
        assert_as_accurate_as_plain(got, expected, exact, what="inductor MinkUNet")
        if points == 500:
            # A new point cloud (other sizes, other maps) reuses the graph: the coordinate-set
            # sizes are symbolic, nothing was specialised on this scan.
            torch.compiler.set_stance("fail_on_recompile")
    torch.compiler.set_stance("default")



def test_compiled_inference_folds_the_norms():
    """Compiled inference folds each BatchNorm into its conv like eager inference does (in the
    graph): the convs run the fused kernel with ReLU in its epilogue, no normalising or ReLU op is
    left, and the output equals eager's. A training-mode graph keeps them."""
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    model = MinkUNet(in_channels=4, num_classes=5, cr=0.125).eval()
    randomise_norms(model, gen)
    targets = []

    def capture(gm, example_inputs):
        targets.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return gm.forward
    feats, coords = minkunet_input(gen)
    with torch.no_grad():
        expected = model(tsp.SparseTensor(feats, coords))
        got = torch.compile(model, fullgraph=True, backend=capture)(tsp.SparseTensor(feats, coords))
        exact = copy.deepcopy(model).double()(tsp.SparseTensor(feats.double(), coords))
    assert_as_accurate_as_plain(got, expected, exact, what="compiled MinkUNet")
    (ops,) = targets
    assert "torchsparse_pp.fetch_on_demand_forward_fused" in ops
    assert not [t for t in ops if "relu" in t or "addcmul" in t or "batch_norm" in t], ops
    torch._dynamo.reset()
    targets.clear()
    torch.compile(model.train(), fullgraph=True, backend=capture)(tsp.SparseTensor(feats, coords))
    (ops,) = targets
    # Training keeps each norm in its own pass (the library's BatchNorm function, ReLU inside it).
    assert "autograd_function_apply" in ops and "torchsparse_pp.fetch_on_demand_forward_fused" not in ops, ops


def test_minkunet_training_step_fullgraph():
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    eager = MinkUNet(in_channels=4, num_classes=5, cr=0.125).train()
    model, exact_model = copy.deepcopy(eager), copy.deepcopy(eager).double()
    feats, coords = minkunet_input(gen)
    labels = torch.randint(0, 5, (len(coords),), generator=gen)

    def step(net, feats, coords, labels):
        logits = net(tsp.SparseTensor(feats, coords))
        return torch.nn.functional.cross_entropy(logits, labels)

    compiled = torch.compile(step, fullgraph=True, backend=TRAINING_BACKEND)
    loss_eager = step(eager, feats, coords, labels)
    loss_eager.backward()
    loss = compiled(model, feats, coords, labels)
    loss.backward()
    loss_exact = step(exact_model, feats.double(), coords, labels)
    loss_exact.backward()
    # A scalar: its error is a few float32 rounding draws, far under FLOOR (precision.MIN_ELEMENTS).
    assert rel_err(loss, loss_exact) <= FACTOR * rel_err(loss_eager, loss_exact) + FLOOR
    # Gradients, and BatchNorm's running statistics moved the same way in the compiled step.
    assert_step_as_accurate(model, eager, exact_model, "compiled MinkUNet step")


# --------------------------------------------------------------------------------------------
# CenterPoint
# --------------------------------------------------------------------------------------------
# A 12.8 m square at 0.2 m (a 8 x 8 BEV map after the backbone), narrow 2-D layers.
TINY = dict(point_cloud_range=(-6.4, -6.4, -2.0, 6.4, 6.4, 4.0), bev_layer_nums=(1, 1), bev_filters=(8, 16),
            bev_upsample_filters=(8, 8), head_channels=8)


def centerpoint_sample(seed: int, config: CenterPointConfig):
    scan = generate_scan(32, seed=seed, return_boxes=True)
    boxes, labels = torch.from_numpy(scan["boxes"]), torch.from_numpy(scan["box_labels"])
    lo, hi = config.point_cloud_range[:2], config.point_cloud_range[3:5]
    inside = (boxes[:, 0] > lo[0]) & (boxes[:, 0] < hi[0]) & (boxes[:, 1] > lo[1]) & (boxes[:, 1] < hi[1])
    return scan["points"], boxes[inside], labels[inside]


def test_centerpoint_inference_inductor_fullgraph():
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    config = CenterPointConfig.synthetic(**TINY)
    model = CenterPoint(config).eval()
    randomise_norms(model, gen)
    points, _, _ = centerpoint_sample(seed, config)
    x = voxelize([points], config)
    with torch.no_grad():
        expected = model(x, 1)
        got = torch.compile(model, fullgraph=True, backend="inductor")(voxelize([points], config), 1)
        exact = copy.deepcopy(model).double()(x.replace_feats(x.F.double()), 1)
    assert set(got) == set(expected)
    for key in expected:
        assert got[key].shape == expected[key].shape and got[key].dtype == expected[key].dtype
    assert_as_accurate_as_plain(got, expected, exact, what="inductor CenterPoint")


def test_centerpoint_training_step_fullgraph():
    seed = fresh_seed()
    torch.manual_seed(seed)
    config = CenterPointConfig.synthetic(**TINY)
    eager = CenterPoint(config).train()
    model, exact_model = copy.deepcopy(eager), copy.deepcopy(eager).double()
    points, boxes, labels = centerpoint_sample(seed, config)
    heat_shape = (config.bev_size[1], config.bev_size[0])
    # The targets depend on the boxes only (host-side drawing of gaussians): built once, outside.
    targets = build_targets([boxes], [labels], config, heat_shape, torch.device("cpu"))

    def step(net, voxels, targets):
        outputs = net(voxels, 1)
        heat = focal_heatmap_loss(outputs["heatmap"], targets.heatmap)
        return heat + config.loc_weight * regression_loss(outputs, targets, net.code_weights)

    loss_eager = step(eager, voxelize([points], config), targets)
    loss_eager.backward()
    # model.loss, as training calls it, gives the same loss as the step written out here.
    with torch.no_grad():
        assert rel_err(eager.loss(eager(voxelize([points], config), 1), [boxes], [labels])["loss"], loss_eager) < 1e-6
    loss = torch.compile(step, fullgraph=True, backend=TRAINING_BACKEND)(model, voxelize([points], config), targets)
    loss.backward()
    voxels = voxelize([points], config)
    loss_exact = step(exact_model, voxels.replace_feats(voxels.F.double()), targets)
    loss_exact.backward()
    assert rel_err(loss, loss_exact) <= FACTOR * rel_err(loss_eager, loss_exact) + FLOOR
    assert_step_as_accurate(model, eager, exact_model, "compiled CenterPoint step")
