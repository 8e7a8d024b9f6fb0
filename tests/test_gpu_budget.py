"""The CUDA path, run on the CPU under backends.device_policy("cuda"): the same results as the
native CPU path, and what it costs a GPU (device ops, host syncs), counted and held to a budget.

Triton kernels run under the interpreter (conftest sets TRITON_INTERPRET=1 without a GPU), on
small LiDAR crops: the counts do not grow with the voxel count (no loop runs over rows on the
host), only the interpreter's time does.
"""
import contextlib

import pytest
import torch
import torch.nn.functional as TF

import torchsparse_pp as tsp
from torchsparse_pp import backends
from torchsparse_pp.kmap.dispatch import kmap_backend_for
from torchsparse_pp.models import MinkUNet
from torchsparse_pp.models.centerpoint import VoxelResBackBone8x
from torchsparse_pp.nn.functional.config import get_default_config, layer_kind
from torchsparse_pp.utils.gpu_cost import count_gpu_cost
from conftest import fresh_seed, lidar_coords
from model_helpers import randomise_norms

pytest.importorskip("triton", reason="the CUDA path runs the Triton kernels")

# The budgets of a GPU forward (maps built inside) and of one conv on a cached map.
INFERENCE_OPS, INFERENCE_SYNCS = 400, 5
CACHED_FORWARD_OPS, CACHED_BACKWARD_OPS = 3, 6
TRAINING_SYNCS, TRAINING_OPS_PER_INFERENCE = 5, 3


def _minkunet_input(seed: int, dtype=torch.float32):
    coords = lidar_coords(seed, voxel=0.3, box=10)
    gen = torch.Generator().manual_seed(seed)
    return tsp.SparseTensor(torch.randn(len(coords), 4, generator=gen, dtype=dtype), coords)


def _backbone_input(seed: int, dtype=torch.float32):
    coords = lidar_coords(seed, voxel=0.3, box=16)
    coords[:, 1:] -= coords[:, 1:].amin(0)
    gen = torch.Generator().manual_seed(seed)
    extent = (coords[:, 1:].amax(0) + 1).tolist()
    # The backbone's z-downsampling needs a deep enough grid (its conv_out has stride 2 in z).
    extent = [extent[0], extent[1], max(extent[2], 41)]
    return tsp.SparseTensor(torch.randn(len(coords), 5, generator=gen, dtype=dtype), coords,
                            spatial_range=extent)


def _model(kind: str, seed: int, dtype):
    torch.manual_seed(seed)
    model = MinkUNet(4, 19, cr=0.5) if kind == "minkunet" else VoxelResBackBone8x(5)
    randomise_norms(model, torch.Generator().manual_seed(seed))
    return model.to(dtype)


def _output(kind: str, out):
    return out if kind == "minkunet" else out.F


def test_policy_takes_the_cuda_decisions():
    x = torch.zeros(1, 4)
    with backends.device_policy("cuda"):
        assert backends.decision_device_type(x.device) == "cuda"
        assert kmap_backend_for(x.device) != "native"
        assert get_default_config("cuda", layer_kind(True, 64, 64)).forward.dataflow == "implicit_gemm"
        assert get_default_config("cuda", layer_kind(True, 32, 64)).forward.dataflow == "fetch_on_demand"
        assert get_default_config("cuda", layer_kind(False, 128, 128)).forward.dataflow == "fetch_on_demand"
    assert backends.decision_device_type(x.device) == "cpu"
    with pytest.raises(ValueError, match="device_policy"):
        with backends.device_policy("mps"):
            pass


@pytest.mark.parametrize("kind", ["minkunet", "backbone"])
def test_cuda_path_matches_the_native_cpu_path(kind):
    """Forward and backward of a whole model: the CUDA path's choices (Triton kernel maps and
    dataflows, ATen BatchNorm) against the native CPU path, in float64."""
    seed = fresh_seed()
    make_input = _minkunet_input if kind == "minkunet" else _backbone_input
    results = []
    for policy in (False, True):
        model = _model(kind, seed, torch.float64).train()
        x = make_input(seed, torch.float64)
        feats = x.F.clone().requires_grad_(True)
        x = x.replace_feats(feats)
        with backends.device_policy("cuda") if policy else contextlib.nullcontext():
            out = _output(kind, model(x))
            (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        results.append((out.detach(), feats.grad, grads))
    (out_cpu, dx_cpu, dw_cpu), (out_cuda, dx_cuda, dw_cuda) = results
    assert len(dw_cpu) == len(dw_cuda) > 0
    for a, b in [(out_cpu, out_cuda), (dx_cpu, dx_cuda), *zip(dw_cpu, dw_cuda)]:
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-9 * max(1.0, a.abs().max().item()))


def test_minkunet_inference_budget():
    seed = fresh_seed()
    model = _model("minkunet", seed, torch.float32).eval()
    x = _minkunet_input(seed)
    with torch.no_grad(), backends.device_policy("cuda"):
        # A first call folds each BatchNorm into its conv, once per model (kept while the weights
        # stay as they are); the budget is that of every call after it, on any input.
        half = x.num_points // 2
        model(tsp.SparseTensor(x.F[:half], x.C[:half]))
        with count_gpu_cost() as cost:
            model(tsp.SparseTensor(x.F, x.C))  # a fresh tensor: every map is built inside
    assert cost.syncs["torch.cuda.synchronize"] == 0
    assert cost.host_syncs <= INFERENCE_SYNCS, cost
    assert cost.device_ops <= INFERENCE_OPS, cost


def test_minkunet_training_step_budget():
    seed = fresh_seed()
    model = _model("minkunet", seed, torch.float32).train()
    x = _minkunet_input(seed)
    labels = torch.randint(0, 19, (x.num_points,), generator=torch.Generator().manual_seed(seed))
    with backends.device_policy("cuda"):
        with torch.no_grad(), count_gpu_cost() as inference:
            model.eval()(tsp.SparseTensor(x.F, x.C))
        model.train()
        with count_gpu_cost() as step:
            TF.cross_entropy(model(tsp.SparseTensor(x.F, x.C)), labels).backward()
    assert step.syncs["torch.cuda.synchronize"] == 0
    assert step.host_syncs <= TRAINING_SYNCS, step
    assert step.device_ops <= TRAINING_OPS_PER_INFERENCE * inference.device_ops, (step, inference)


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("channels", [32, 64])
def test_conv_on_a_cached_map_budget(stride, channels):
    """One conv whose map is cached: forward and dgrad + wgrad are launches only, no host read."""
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    coords = lidar_coords(seed, voxel=0.3, box=8)
    conv = tsp.nn.Conv3d(channels, channels, 3, stride=stride)
    feats = torch.randn(len(coords), channels, generator=gen, requires_grad=True)
    x = tsp.SparseTensor(feats, coords)
    with backends.device_policy("cuda"):
        conv(x)  # builds and caches the map and its views
        with torch.no_grad(), count_gpu_cost() as forward:
            conv(x)
        out = conv(x)
        grad = torch.randn(out.F.shape, generator=gen)
        with count_gpu_cost() as backward:
            out.F.backward(grad)
    assert forward.host_syncs == 0 and backward.host_syncs == 0, (forward, backward)
    assert forward.device_ops <= CACHED_FORWARD_OPS, forward
    assert backward.device_ops <= CACHED_BACKWARD_OPS, backward
