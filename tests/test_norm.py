"""Normalisation layers against torch's own normalisation ops.

BatchNorm / SyncBatchNorm are checked against torch.nn.BatchNorm1d on the same features
(for SyncBatchNorm across two gloo processes: BatchNorm1d on the concatenation of both
ranks' points); GroupNorm / InstanceNorm are checked sample by sample against
torch.nn.functional.group_norm / instance_norm on that sample's points alone.
"""
import copy
import gc
import os
import traceback
from datetime import timedelta

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as TF
from torch import nn

from torchsparse_pp import SparseTensor
from conftest import shuffled_coords
from precision import assert_as_accurate_as_plain, assert_rounded_once, rel_err
from torchsparse_pp.nn import (BatchNorm, GroupNorm, InstanceNorm, LeakyReLU, ReLU,
                               SyncBatchNorm)

EXACT = dict(rtol=1e-10, atol=1e-10)


def unique_coords(gen: torch.Generator, counts, low: int = -20, high: int = 20) -> torch.Tensor:
    return shuffled_coords(gen, counts, low, high)


def random_feats(gen, n, c, dtype=torch.float64):
    """Non-trivial features: per-channel scale and shift so every statistic matters."""
    scale = torch.rand(c, generator=gen, dtype=torch.float64) * 3 + 0.2
    shift = torch.randn(c, generator=gen, dtype=torch.float64) * 2
    return (torch.randn(n, c, generator=gen, dtype=torch.float64) * scale + shift).to(dtype)


def randomise_affine(module: nn.Module, gen: torch.Generator) -> None:
    with torch.no_grad():
        if getattr(module, "weight", None) is not None:
            module.weight.copy_(torch.rand(module.weight.shape, generator=gen, dtype=torch.float64) + 0.5)
            module.bias.copy_(torch.randn(module.bias.shape, generator=gen, dtype=torch.float64))


# --------------------------------------------------------------------------------------------
# BatchNorm
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("momentum", [0.1, None])
def test_batchnorm_matches_batchnorm1d(gen, momentum):
    channels = 6
    ours = BatchNorm(channels, momentum=momentum).double()
    ref = nn.BatchNorm1d(channels, momentum=momentum).double()
    randomise_affine(ref, gen)
    ours.load_state_dict(ref.state_dict())

    for step, n in enumerate([57, 23, 91]):  # three training steps, different sizes
        coords = unique_coords(gen, [n // 2, n - n // 2])
        feats = random_feats(gen, n, channels)
        grad_out = torch.randn(n, channels, generator=gen, dtype=torch.float64)
        a = feats.clone().requires_grad_(True)
        b = feats.clone().requires_grad_(True)
        out = ours(SparseTensor(a, coords))
        expected = ref(b)
        assert out.C is coords
        torch.testing.assert_close(out.F, expected, **EXACT)
        (out.F * grad_out).sum().backward()
        (expected * grad_out).sum().backward()
        torch.testing.assert_close(a.grad, b.grad, **EXACT)
        torch.testing.assert_close(ours.weight.grad, ref.weight.grad, **EXACT)
        torch.testing.assert_close(ours.bias.grad, ref.bias.grad, **EXACT)
        ours.zero_grad()
        ref.zero_grad()

    torch.testing.assert_close(ours.running_mean, ref.running_mean, **EXACT)
    torch.testing.assert_close(ours.running_var, ref.running_var, **EXACT)
    assert int(ours.num_batches_tracked) == int(ref.num_batches_tracked) == 3
    # The running statistics moved away from their initial values.
    assert not torch.allclose(ours.running_mean, torch.zeros(channels, dtype=torch.float64))

    ours.eval()
    ref.eval()
    coords = unique_coords(gen, [40])
    feats = random_feats(gen, 40, channels)
    a = feats.clone().requires_grad_(True)
    b = feats.clone().requires_grad_(True)
    out = ours(SparseTensor(a, coords))
    expected = ref(b)
    torch.testing.assert_close(out.F, expected, **EXACT)
    grad_out = torch.randn(40, channels, generator=gen, dtype=torch.float64)
    (out.F * grad_out).sum().backward()
    (expected * grad_out).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, **EXACT)
    torch.testing.assert_close(ours.weight.grad, ref.weight.grad, **EXACT)


def test_batchnorm_float32(gen):
    channels = 5
    ours, ref = BatchNorm(channels), nn.BatchNorm1d(channels)
    randomise_affine(ref, gen)
    ours.load_state_dict(ref.state_dict())
    coords = unique_coords(gen, [30, 45])
    feats = random_feats(gen, 75, channels, torch.float32)
    torch.testing.assert_close(ours(SparseTensor(feats, coords)).F, ref(feats), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("track", [True, False])
def test_batchnorm_eval(gen, dtype, affine, track):
    """Eval mode (one affine pass over the running statistics in float32, F.batch_norm
    otherwise) against torch.nn.BatchNorm1d in eval mode, forward and input gradient."""
    channels = 13
    ours = BatchNorm(channels, affine=affine, track_running_stats=track)
    ref = nn.BatchNorm1d(channels, affine=affine, track_running_stats=track)
    randomise_affine(ref, gen)
    if track:
        with torch.no_grad():
            ref.running_mean.copy_(torch.randn(channels, generator=gen) * 2)
            ref.running_var.copy_(torch.rand(channels, generator=gen) * 3 + 0.1)
    ours.load_state_dict(ref.state_dict())
    # Checked against the float64 module: without running statistics the input gradient cancels,
    # and float32 torch itself was off by 1.0e-5 (ours 4.4e-6) at a gradient scale of 10 (seed
    # 4038899794), so an absolute 1e-5 against it failed now and then. bfloat16 (its parameters
    # rounded too) is held to torch's own bfloat16 module, the plain computation (precision.py).
    plain = copy.deepcopy(ref).to(dtype).eval()
    ours, ref = ours.to(dtype).eval(), ref.double().eval()
    coords = unique_coords(gen, [60, 37])
    feats = random_feats(gen, 97, channels, dtype)
    a, b, c = (feats.to(t, copy=True).requires_grad_(True) for t in (dtype, torch.float64, dtype))
    out, expected, out_plain = ours(SparseTensor(a, coords)).F, ref(b), plain(c)
    assert out.dtype == dtype
    grad_out = torch.randn(97, channels, generator=gen).to(dtype)
    out.backward(grad_out)
    expected.backward(grad_out.double())
    out_plain.backward(grad_out)
    if dtype == torch.bfloat16:
        assert_as_accurate_as_plain({"output": out, "input grad": a.grad}, {"output": out_plain, "input grad": c.grad},
                                    {"output": expected, "input grad": b.grad}, what="bf16 BatchNorm")
        return
    for got, want in ((out, expected), (a.grad, b.grad)):
        scale = float(want.detach().abs().max())
        torch.testing.assert_close(got.detach().double(), want.detach(), rtol=1e-5, atol=2e-6 * scale)


def test_batchnorm_rejects_channel_mismatch(gen):
    coords = unique_coords(gen, [10])
    with pytest.raises(ValueError, match="channel"):
        BatchNorm(4)(SparseTensor(torch.randn(10, 3, generator=gen), coords))


# --------------------------------------------------------------------------------------------
# GroupNorm / InstanceNorm: per-sample statistics
# --------------------------------------------------------------------------------------------
def per_sample(coords, feats, fn):
    """Oracle: ``fn`` applied to each sample's features as a dense [1, C, n_points] tensor."""
    out = torch.empty_like(feats)
    batch = coords[:, 0].long()
    for b in batch.unique().tolist():
        rows = (batch == b).nonzero().flatten()
        out = out.index_put((rows,), fn(feats[rows].t()[None])[0].t())
    return out


COUNTS = [17, 64, 33]


@pytest.mark.parametrize("num_groups", [1, 4, 8])
def test_groupnorm_per_sample(gen, num_groups):
    channels = 8
    coords = unique_coords(gen, COUNTS)
    feats = random_feats(gen, sum(COUNTS), channels)
    # Give each sample its own offset: a batch-wide statistic would then be visibly wrong.
    feats = feats + 5 * coords[:, :1].double()
    module = GroupNorm(num_groups, channels).double()
    randomise_affine(module, gen)
    weight = module.weight.detach().clone().requires_grad_(True)
    bias = module.bias.detach().clone().requires_grad_(True)

    a = feats.clone().requires_grad_(True)
    b = feats.clone().requires_grad_(True)
    out = module(SparseTensor(a, coords))
    expected = per_sample(coords, b, lambda x: TF.group_norm(x, num_groups, weight, bias, module.eps))
    assert out.C is coords
    torch.testing.assert_close(out.F, expected, **EXACT)

    grad_out = torch.randn(out.F.shape, generator=gen, dtype=torch.float64)
    (out.F * grad_out).sum().backward()
    (expected * grad_out).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, **EXACT)
    torch.testing.assert_close(module.weight.grad, weight.grad, **EXACT)
    torch.testing.assert_close(module.bias.grad, bias.grad, **EXACT)


def test_groupnorm_float32(gen):
    channels = 12
    coords = unique_coords(gen, COUNTS)
    feats = random_feats(gen, sum(COUNTS), channels, torch.float32)
    module = GroupNorm(3, channels)
    randomise_affine(module, gen)
    out = module(SparseTensor(feats, coords))
    assert out.F.dtype == torch.float32
    expected = per_sample(coords, feats.double(), lambda x: TF.group_norm(
        x, 3, module.weight.detach().double(), module.bias.detach().double(), module.eps))
    assert rel_err(out.F, expected) < 1e-5


def test_groupnorm_bfloat16(gen):
    channels, groups = 8, 4
    coords = unique_coords(gen, COUNTS)
    feats = random_feats(gen, sum(COUNTS), channels, torch.bfloat16)
    module = GroupNorm(groups, channels)
    randomise_affine(module, gen)
    a = feats.clone().requires_grad_(True)
    out = module(SparseTensor(a, coords))
    assert out.F.dtype == torch.bfloat16

    b = feats.double().requires_grad_(True)  # same (rounded) inputs, float64 oracle
    weight = module.weight.detach().double()
    bias = module.bias.detach().double()
    expected = per_sample(coords, b, lambda x: TF.group_norm(x, groups, weight, bias, module.eps))
    grad_out = torch.randn(out.F.shape, generator=gen, dtype=torch.float64)
    (out.F * grad_out.bfloat16()).sum().backward()
    (expected * grad_out.bfloat16().double()).sum().backward()
    assert a.grad.dtype == torch.bfloat16
    # Statistics and normalisation in float32 from exact (bf16) inputs: the output rounds once.
    # The input gradient cancels (it subtracts its per-group means): held to torch's group_norm
    # on the same bfloat16 tensors, the plain computation (precision.py).
    assert_rounded_once(out.F, expected, what="bf16 GroupNorm")
    c = feats.clone().requires_grad_(True)
    plain = per_sample(coords, c, lambda x: TF.group_norm(x, groups, module.weight.detach().bfloat16(),
                                                          module.bias.detach().bfloat16(), module.eps))
    (plain * grad_out.bfloat16()).sum().backward()
    assert_as_accurate_as_plain(a.grad, c.grad, b.grad, what="bf16 GroupNorm input gradient")


def test_groupnorm_rejects_bad_groups():
    with pytest.raises(ValueError):
        GroupNorm(3, 8)


@pytest.mark.parametrize("affine", [False, True])
def test_instancenorm_per_sample(gen, affine):
    channels = 5
    coords = unique_coords(gen, COUNTS)
    feats = random_feats(gen, sum(COUNTS), channels) + 3 * coords[:, :1].double()
    module = InstanceNorm(channels, affine=affine).double()
    assert len(list(module.parameters())) == (2 if affine else 0)
    if affine:
        randomise_affine(module, gen)
        weight = module.weight.detach().clone().requires_grad_(True)
        bias = module.bias.detach().clone().requires_grad_(True)
    else:
        weight = bias = None

    a = feats.clone().requires_grad_(True)
    b = feats.clone().requires_grad_(True)
    out = module(SparseTensor(a, coords))
    expected = per_sample(coords, b, lambda x: TF.instance_norm(x, weight=weight, bias=bias,
                                                                eps=module.eps))
    torch.testing.assert_close(out.F, expected, **EXACT)
    grad_out = torch.randn(out.F.shape, generator=gen, dtype=torch.float64)
    (out.F * grad_out).sum().backward()
    (expected * grad_out).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, **EXACT)
    if affine:
        torch.testing.assert_close(module.weight.grad, weight.grad, **EXACT)
        torch.testing.assert_close(module.bias.grad, bias.grad, **EXACT)


# --------------------------------------------------------------------------------------------
# SyncBatchNorm
# --------------------------------------------------------------------------------------------
def test_syncbatchnorm_without_process_group_is_batchnorm(gen):
    channels = 7
    ref = nn.BatchNorm1d(channels).double()
    randomise_affine(ref, gen)
    sync = SyncBatchNorm(channels).double()
    sync.load_state_dict(ref.state_dict())
    for n in [40, 65]:
        coords = unique_coords(gen, [n])
        feats = random_feats(gen, n, channels)
        a = feats.clone().requires_grad_(True)
        b = feats.clone().requires_grad_(True)
        out = sync(SparseTensor(a, coords))
        expected = ref(b)
        torch.testing.assert_close(out.F, expected, **EXACT)
        grad_out = torch.randn(n, channels, generator=gen, dtype=torch.float64)
        (out.F * grad_out).sum().backward()
        (expected * grad_out).sum().backward()
        torch.testing.assert_close(a.grad, b.grad, **EXACT)
        torch.testing.assert_close(sync.weight.grad, ref.weight.grad, **EXACT)
    torch.testing.assert_close(sync.running_mean, ref.running_mean, **EXACT)
    torch.testing.assert_close(sync.running_var, ref.running_var, **EXACT)
    sync.eval()
    ref.eval()
    coords = unique_coords(gen, [30])
    feats = random_feats(gen, 30, channels)
    torch.testing.assert_close(sync(SparseTensor(feats, coords)).F, ref(feats), **EXACT)


WORLD = 2
SYNC_CHANNELS = 5


def _sync_bn_worker(rank, init_file, payload, result_dir):
    """One rank: SyncBatchNorm forward + backward on its own chunks; results go to a file."""
    result_path = os.path.join(result_dir, f"rank{rank}.pt")
    try:
        import torch.distributed as dist
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                world_size=WORLD, timeout=timedelta(seconds=60))
        model = None
        try:
            bn = SyncBatchNorm(SYNC_CHANNELS, momentum=payload["momentum"]).double()
            bn.load_state_dict(payload["state"])
            # Under DDP the gradients of weight and bias are averaged over the ranks.
            model = torch.nn.parallel.DistributedDataParallel(bn) if payload["ddp"] else bn
            steps = []
            for step in payload["steps"]:
                feats = step["feats"][rank].clone().requires_grad_(True)
                out = model(SparseTensor(feats, step["coords"][rank]))
                (out.F * step["grad_out"][rank]).sum().backward()
                steps.append({"out": out.F.detach().clone(), "grad": feats.grad.clone(),
                              "weight_grad": bn.weight.grad.clone(), "bias_grad": bn.bias.grad.clone(),
                              "same_coords": out.C is step["coords"][rank]})
                bn.zero_grad()
            bn.eval()
            with torch.no_grad():
                evaluated = bn(SparseTensor(payload["eval_feats"][rank], payload["eval_coords"][rank])).F
            torch.save({"steps": steps, "running_mean": bn.running_mean.clone(),
                        "running_var": bn.running_var.clone(),
                        "num_batches_tracked": int(bn.num_batches_tracked), "eval": evaluated},
                       result_path)
        finally:
            # The DDP wrapper is in a reference cycle: collect it (and its reducer, which holds
            # the group) now, not at interpreter exit (see train.distributed.cleanup).
            del model
            gc.collect()
            dist.barrier()
            dist.destroy_process_group()
    except BaseException:
        with open(result_path + ".err", "w") as f:
            f.write(traceback.format_exc())
        raise


@pytest.mark.parametrize("ddp", [False, True], ids=["plain", "ddp"])
def test_syncbatchnorm_two_processes_gloo(gen, tmp_path, ddp):
    channels, momentum = SYNC_CHANNELS, 0.1
    ref = nn.BatchNorm1d(channels, momentum=momentum).double()
    randomise_affine(ref, gen)
    payload = {"momentum": momentum, "state": copy.deepcopy(ref.state_dict()), "steps": [], "ddp": ddp}
    for sizes in [(37, 58), (71, 26)]:  # two steps; the ranks hold different numbers of points
        payload["steps"].append({
            "coords": [unique_coords(gen, [n]) for n in sizes],
            # Different ranks draw from different distributions: local statistics would be wrong.
            "feats": [random_feats(gen, n, channels) + 2 * r for r, n in enumerate(sizes)],
            "grad_out": [torch.randn(n, channels, generator=gen, dtype=torch.float64) for n in sizes],
        })
    payload["eval_coords"] = [unique_coords(gen, [n]) for n in (12, 19)]
    payload["eval_feats"] = [random_feats(gen, n, channels) for n in (12, 19)]

    ctx = mp.get_context("spawn")
    init_file = str(tmp_path / "dist_init")
    procs = [ctx.Process(target=_sync_bn_worker, args=(rank, init_file, payload, str(tmp_path)), daemon=True)
             for rank in range(WORLD)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(timeout=120)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    errors = [(tmp_path / f"rank{r}.pt.err") for r in range(WORLD)]
    messages = "\n".join(e.read_text() for e in errors if e.exists())
    assert all(p.exitcode == 0 for p in procs), f"exit codes {[p.exitcode for p in procs]}\n{messages}"
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]

    # Oracle: one BatchNorm1d over the concatenation of both ranks' points.
    for i, step in enumerate(payload["steps"]):
        sizes = [len(f) for f in step["feats"]]
        feats = torch.cat(step["feats"]).requires_grad_(True)
        expected = ref(feats)
        (expected * torch.cat(step["grad_out"])).sum().backward()
        for r, (out, grad) in enumerate(zip(expected.split(sizes), feats.grad.split(sizes))):
            res = results[r]["steps"][i]
            assert res["same_coords"]
            torch.testing.assert_close(res["out"], out, **EXACT)
            torch.testing.assert_close(res["grad"], grad, **EXACT)
        if ddp:
            # DDP averages the parameter gradients: every rank holds the mean of the local ones.
            for res in results:
                torch.testing.assert_close(res["steps"][i]["weight_grad"], ref.weight.grad / WORLD, **EXACT)
                torch.testing.assert_close(res["steps"][i]["bias_grad"], ref.bias.grad / WORLD, **EXACT)
        else:
            # Each rank holds the gradient of its own points; their sum is the single-process one.
            torch.testing.assert_close(sum(res["steps"][i]["weight_grad"] for res in results), ref.weight.grad,
                                       **EXACT)
            torch.testing.assert_close(sum(res["steps"][i]["bias_grad"] for res in results), ref.bias.grad, **EXACT)
            # Neither rank alone has the full gradient (the chunks carry different data).
            assert not torch.allclose(results[0]["steps"][i]["weight_grad"], ref.weight.grad)
        ref.zero_grad()

    ref.eval()
    for r in range(WORLD):
        torch.testing.assert_close(results[r]["running_mean"], ref.running_mean, **EXACT)
        torch.testing.assert_close(results[r]["running_var"], ref.running_var, **EXACT)
        assert results[r]["num_batches_tracked"] == int(ref.num_batches_tracked) == 2
        torch.testing.assert_close(results[r]["eval"], ref(payload["eval_feats"][r]), **EXACT)


def _bn_model(dtype):
    return nn.Sequential(BatchNorm(6), ReLU(), nn.Sequential(BatchNorm(6, momentum=0.3), LeakyReLU(0.1)),
                         BatchNorm(6, affine=False)).to(dtype)


def _check_converted(gen, dtype):
    channels = 6
    model = _bn_model(dtype)
    for m in model.modules():
        if isinstance(m, BatchNorm):
            randomise_affine(m, gen)
    # A few training steps make the running statistics non-trivial.
    for n in (30, 50):
        model(SparseTensor(random_feats(gen, n, channels, dtype), unique_coords(gen, [n])))
    original = copy.deepcopy(model)

    converted = SyncBatchNorm.convert_sync_batchnorm(model)
    kinds = [type(m) for m in converted.modules()]
    assert BatchNorm not in kinds
    assert kinds.count(SyncBatchNorm) == 3
    assert isinstance(converted[0], SyncBatchNorm) and isinstance(converted[2][0], SyncBatchNorm)
    assert converted[2][0].momentum == 0.3 and not converted[3].affine
    state, expected_state = converted.state_dict(), original.state_dict()
    assert state.keys() == expected_state.keys()
    for key in state:
        assert state[key].dtype == expected_state[key].dtype, key
        torch.testing.assert_close(state[key], expected_state[key], rtol=0, atol=0)
    assert all(m.training for m in converted.modules())

    converted.eval()
    original.eval()
    coords = unique_coords(gen, [25, 14])
    feats = random_feats(gen, 39, channels, dtype)
    torch.testing.assert_close(converted(SparseTensor(feats, coords)).F, original(SparseTensor(feats, coords)).F,
                               rtol=0, atol=0)

    # A bare BatchNorm converts too, keeping its eval mode.
    bn = original[0]
    sync = SyncBatchNorm.convert_sync_batchnorm(bn)
    assert isinstance(sync, SyncBatchNorm) and not sync.training
    torch.testing.assert_close(sync(SparseTensor(feats, coords)).F, bn(SparseTensor(feats, coords)).F,
                               rtol=0, atol=0)


def test_convert_sync_batchnorm(gen):
    _check_converted(gen, torch.float32)


def test_convert_sync_batchnorm_keeps_float64(gen):
    _check_converted(gen, torch.float64)


def test_convert_sync_batchnorm_reuses_parameters(gen):
    """Like torch's converter: an optimizer built before the conversion still trains the model."""
    bn = BatchNorm(4)
    model = torch.nn.Sequential(bn)
    optimizer_params = list(model.parameters())
    converted = SyncBatchNorm.convert_sync_batchnorm(model)
    assert [id(p) for p in converted.parameters()] == [id(p) for p in optimizer_params]
    assert converted[0].running_mean is bn.running_mean
