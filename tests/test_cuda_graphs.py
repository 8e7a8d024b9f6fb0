"""CUDA graphs and host synchronisation, on both GPU backends (skipped without a GPU).

With its maps cached (built and validated on the first call), a conv call only launches kernels:
no host copy, no synchronisation. So
- ``torch.cuda.set_sync_debug_mode("error")`` around conv forwards and backwards (submanifold,
  strided and transposed) raises nothing;
- a MinkUNet forward, and a whole training step (forward, loss, backward, SGD step), captured in a
  CUDA graph and replayed on new features give what eager execution gives.
Every dataflow on each backend; native cases need a CUDA build of torchsparse_pp (conftest skips
them otherwise). Results of replays and eager runs agree to float32 rounding: the kernels that add
with atomics (fetch-on-demand's default forward, Triton's weight gradients) may sum in another
order.
"""
import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F

import torchsparse_pp as tsp
from torchsparse_pp import backends
from torchsparse_pp.models import MinkUNet
from torchsparse_pp.nn.functional import ConvConfig, conv3d, default_config
from conftest import fresh_seed, lidar_coords

pytestmark = pytest.mark.cuda
DEVICE = "cuda"

CONFIGS = {
    "gs": ConvConfig("gather_scatter"),
    "gs_grouped": ConvConfig("gather_scatter", epsilon=0.5, mm_thresh=10 ** 9),
    "fod": ConvConfig("fetch_on_demand"),
    "ig_unsorted": ConvConfig("implicit_gemm", sorted=False, split_mask_num=0),
    "ig_sorted_split2": ConvConfig("implicit_gemm", sorted=True, split_mask_num=2),
}
CASES = [f"{name}[{backend}]" for backend in ("native", "triton") for name in CONFIGS]
GRAPH_CASES = [f"{name}[{backend}]" for backend in ("native", "triton") for name in ("gs", "fod", "ig_sorted_split2")]


def config_of(case: str) -> ConvConfig:
    name, backend = case[:-1].split("[")
    return dataclasses.replace(CONFIGS[name], backend=backend)


@pytest.fixture
def switches():
    saved = (backends.deterministic, backends.allow_tf32, backends.validate_plans)
    yield
    backends.deterministic, backends.allow_tf32, backends.validate_plans = saved
    torch.cuda.set_sync_debug_mode("default")


def sparse_input(gen, channels, dtype=torch.float32, box=24):
    coords = lidar_coords(int(torch.randint(0, 10 ** 6, (1,), generator=gen)), batch=2, voxel=0.1, box=box)
    feats = torch.randn(len(coords), channels, generator=gen).to(dtype)
    return tsp.SparseTensor(feats.to(DEVICE), coords.to(DEVICE))


# --------------------------------------------------------------------------------------------
# No synchronisation per call
# --------------------------------------------------------------------------------------------
def test_sync_debug_mode_catches_a_synchronisation(switches):
    """The check below can fail: the mode does raise on a device-to-host read."""
    torch.cuda.set_sync_debug_mode("error")
    with pytest.raises(RuntimeError):
        torch.ones(1, device=DEVICE).sum().item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["float32", "float16"])
@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
@pytest.mark.parametrize("case", CASES)
def test_conv_calls_with_cached_maps_never_synchronise(case, deterministic, dtype, switches):
    backends.deterministic = deterministic
    config = config_of(case)
    gen = torch.Generator().manual_seed(fresh_seed())
    x = sparse_input(gen, 16, dtype)
    feats = x.F.clone().requires_grad_(True)
    weights = [(torch.randn(k, ci, co, generator=gen) / (k * ci) ** 0.5).to(dtype).to(DEVICE).requires_grad_(True)
               for k, ci, co in ((27, 16, 32), (8, 32, 32), (27, 32, 32), (8, 32, 16))]

    def forward_backward():
        y1 = conv3d(x.replace_feats(feats), weights[0], 3, config=config)
        y2 = conv3d(y1, weights[1], 2, stride=2, config=config)
        y3 = conv3d(y2, weights[2], 3, config=config)
        y4 = conv3d(y3, weights[3], 2, stride=2, transposed=True, config=config)
        (y4.F.float().sum() + y1.F.float().square().sum() * 1e-3).backward()
        return y4.F

    forward_backward()  # builds and validates the maps and views, compiles Triton kernels
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    out = forward_backward()
    torch.cuda.set_sync_debug_mode("default")
    assert bool(torch.isfinite(out).all()) and bool(torch.isfinite(feats.grad).all())
    assert all(bool(torch.isfinite(w.grad).all()) for w in weights)


# --------------------------------------------------------------------------------------------
# CUDA graphs of a MinkUNet
# --------------------------------------------------------------------------------------------
def warm_up(step, times: int):
    """torch's recipe: warm-up iterations on a side stream before a capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(times):
            step(i)
    torch.cuda.current_stream().wait_stream(side)


@pytest.mark.parametrize("case", GRAPH_CASES)
def test_graphed_minkunet_forward_equals_eager(case, switches):
    seed = fresh_seed()
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = MinkUNet(in_channels=4, num_classes=19, cr=0.5).to(DEVICE).eval()
    x = sparse_input(gen, 4, box=32)  # its F is the graph's static input
    new_feats = [torch.randn(x.F.shape, generator=gen).to(DEVICE) for _ in range(4)]
    with default_config(config_of(case)), torch.no_grad():
        warm_up(lambda i: model(x), 2)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = model(x)
        for feats in new_feats:
            x.F.copy_(feats)
            graph.replay()
            eager = model(x)
            torch.testing.assert_close(static_out, eager, rtol=1e-4, atol=1e-5)
        assert not torch.equal(new_feats[0], new_feats[1])  # the replays saw different inputs


@pytest.mark.parametrize("case", GRAPH_CASES)
def test_graphed_training_step_equals_eager(case, switches):
    """forward, cross-entropy, backward and an SGD step (momentum) captured as one graph, against
    a twin model trained eagerly on the same batches."""
    seed = fresh_seed()
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = MinkUNet(in_channels=4, num_classes=19, cr=0.5).to(DEVICE).train()
    twin = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    twin_optimizer = torch.optim.SGD(twin.parameters(), lr=0.01, momentum=0.9)
    x = sparse_input(gen, 4, box=32)  # static input of the graph
    x_twin = tsp.SparseTensor(x.F.clone(), x.C)
    labels = torch.zeros(x.num_points, dtype=torch.long, device=DEVICE)  # static target
    batches = [(torch.randn(x.F.shape, generator=gen).to(DEVICE),
                torch.randint(0, 19, (x.num_points,), generator=gen).to(DEVICE)) for _ in range(6)]

    def eager_step(net, opt, inp, target):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(inp), target)
        loss.backward()
        opt.step()
        return loss

    def both_eager(i):
        feats, target = batches[i]
        x.F.copy_(feats)
        labels.copy_(target)
        eager_step(model, optimizer, x, labels)
        x_twin.F.copy_(feats)
        eager_step(twin, twin_optimizer, x_twin, target)

    with default_config(config_of(case)):
        warm_up(both_eager, 3)
        graph = torch.cuda.CUDAGraph()
        optimizer.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            static_loss = F.cross_entropy(model(x), labels)
            static_loss.backward()
            optimizer.step()
        for feats, target in batches[3:]:
            x.F.copy_(feats)
            labels.copy_(target)
            graph.replay()
            x_twin.F.copy_(feats)
            loss = eager_step(twin, twin_optimizer, x_twin, target)
            torch.testing.assert_close(static_loss, loss, rtol=1e-4, atol=1e-5)
            for (name, p), q in zip(model.named_parameters(), twin.parameters()):
                torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
        for (name, b), c in zip(model.named_buffers(), twin.buffers()):
            torch.testing.assert_close(b, c, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
