"""torch.autocast on CPU (bfloat16): the dtype of every layer's output, eager and compiled, and of
every custom op's real and fake outputs; values against float32; model training steps.

Oracles: the matching torch layer run under the same autocast (nn.Conv3d, BatchNorm1d,
GroupNorm, activations); the float32 eager result for values; the eager result for compiled
code. Pooling keeps its input dtype (max is exact in any dtype; means accumulate in float32);
torch's CPU autocast lists its dense 3-D pooling under float32, its CUDA autocast does not.
"""
import copy

import pytest
import torch

import torchsparse_pp as tsp
from torchsparse_pp import nn as spnn
from torchsparse_pp.models import CenterPoint, CenterPointConfig, MinkUNet
from torchsparse_pp.models.centerpoint import voxelize
from conftest import fresh_seed, random_coords
from test_opcheck_all import CASES, Maps
from precision import assert_as_accurate_as_plain, assert_rounded_once, plain_sparse_convs

BF16 = torch.bfloat16


# The layers of Layers whose results are convolutions (held to the plain convs' error).
CONV_OUTPUTS = ("conv", "pointwise", "down", "up", "generative", "fused", "fused_residual")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def autocast():
    return torch.autocast("cpu", dtype=BF16)


def torch_dtypes(dtype: torch.dtype) -> dict:
    """What the matching torch layers return under CPU bf16 autocast for a ``dtype`` input."""
    x = torch.randn(2, 4, 3, 3, 3, dtype=dtype)
    rows = torch.randn(6, 4, dtype=dtype)
    with autocast():
        return {
            "conv": torch.nn.functional.conv3d(x, torch.randn(4, 4, 3, 3, 3)).dtype,
            "conv_transposed": torch.nn.functional.conv_transpose3d(x, torch.randn(4, 4, 2, 2, 2), stride=2).dtype,
            "batch_norm": torch.nn.BatchNorm1d(4)(rows).dtype,
            "group_norm": torch.nn.GroupNorm(2, 4)(rows).dtype,
            "instance_norm": torch.nn.GroupNorm(4, 4)(rows).dtype,
            "relu": torch.relu(rows).dtype,
            "leaky_relu": torch.nn.functional.leaky_relu(rows).dtype,
            "silu": torch.nn.functional.silu(rows).dtype,
            "linear": torch.nn.functional.linear(rows, torch.randn(3, 4)).dtype,
        }


class Layers(torch.nn.Module):
    """Every layer of torchsparse_pp.nn once, each on the input (or on the strided output it needs)."""

    def __init__(self):
        super().__init__()
        self.conv = spnn.Conv3d(4, 4, 3, bias=True)
        self.down = spnn.Conv3d(4, 4, 2, stride=2)
        self.up = spnn.Conv3d(4, 4, 2, stride=2, transposed=True)
        self.generative = spnn.Conv3d(4, 4, 2, stride=2, transposed=True, generative=True)
        self.pointwise = spnn.Conv3d(4, 4, 1)
        self.batch_norm = spnn.BatchNorm(4)
        self.sync_batch_norm = spnn.SyncBatchNorm(4)
        self.group_norm = spnn.GroupNorm(2, 4)
        self.instance_norm = spnn.InstanceNorm(4, affine=True)
        self.relu, self.leaky_relu, self.silu = spnn.ReLU(), spnn.LeakyReLU(), spnn.SiLU()
        self.max_pool, self.avg_pool = spnn.MaxPool3d(2), spnn.AvgPool3d(2)
        self.global_avg, self.global_max = spnn.GlobalAvgPool(), spnn.GlobalMaxPool()
        self.to_dense = spnn.ToDense(spatial_range=(12, 12, 12), batch_size=2)
        fused_conv = spnn.Conv3d(4, 4, 3)
        self.fused = spnn.FusedConv3d(fused_conv, torch.nn.BatchNorm1d(4).eval(), relu=True)

    def forward(self, x: tsp.SparseTensor):
        down = self.down(x)
        out = {name: getattr(self, name)(x).F for name in
               ("conv", "pointwise", "batch_norm", "sync_batch_norm", "group_norm", "instance_norm", "relu",
                "leaky_relu", "silu", "max_pool", "avg_pool")}
        out["down"] = down.F
        out["up"] = self.up(down).F
        out["generative"] = self.generative(down).F
        out["global_avg"] = self.global_avg(x)
        out["global_max"] = self.global_max(x)
        out["to_dense"] = self.to_dense(x)
        out["fused"] = self.fused(x).F
        out["fused_residual"] = self.fused(x, x).F
        return out


def expected_dtypes(dtype: torch.dtype) -> dict:
    t = torch_dtypes(dtype)
    conv = {k: t["conv"] for k in ("conv", "pointwise", "down", "fused", "fused_residual")}
    keep = {k: dtype for k in ("max_pool", "avg_pool", "global_avg", "global_max", "to_dense")}
    return {**conv, "up": t["conv_transposed"], "generative": t["conv_transposed"], "batch_norm": t["batch_norm"],
            "sync_batch_norm": t["batch_norm"], "group_norm": t["group_norm"], "instance_norm": t["instance_norm"],
            "relu": t["relu"], "leaky_relu": t["leaky_relu"], "silu": t["silu"], **keep}


def layers_input(gen: torch.Generator, dtype: torch.dtype):
    # Coordinates in [0, 12) (ToDense's grid): the k2 s2 pools and convs see full and partial windows.
    coords = random_coords(gen, 400, batch=2, low=0, high=12)
    return tsp.SparseTensor(torch.randn(len(coords), 4, generator=gen).to(dtype), coords)


def layers_and_input(dtype: torch.dtype, training: bool):
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    layers = Layers().eval()
    for name, child in layers.named_children():
        child.train(training and name != "fused")  # a fused conv is inference-only
    return layers, layers_input(gen, dtype)


def reference_and_plain(layers: Layers, x: tsp.SparseTensor):
    """Float64 outputs of copies of ``layers`` (as they are now) and bf16-autocast outputs with
    plain convs (precision.py)."""
    reference_layers, plain_layers = copy.deepcopy(layers).double(), copy.deepcopy(layers)
    with torch.no_grad():
        reference = reference_layers(tsp.SparseTensor(x.F.double(), x.C))
        with autocast(), plain_sparse_convs():
            plain = plain_layers(tsp.SparseTensor(x.F, x.C))
    return reference, plain


def check_layer_values(out: dict, plain: dict, reference: dict, what: str):
    for name, value in out.items():
        assert torch.isfinite(value.float()).all(), name
    convs = list(CONV_OUTPUTS)
    assert_as_accurate_as_plain({k: out[k] for k in convs}, {k: plain[k] for k in convs},
                                {k: reference[k] for k in convs}, what=f"convs {what}")
    # The other layers round their result once at most (their inputs are exact: float32, or
    # bf16 already): norm-wise within bf16's unit roundoff of float64.
    others = sorted(set(out) - set(convs))
    assert_rounded_once({k: out[k] for k in others}, {k: reference[k] for k in others}, what=f"layers {what}")


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
@pytest.mark.parametrize("training", [False, True])
def test_every_layer_dtype_and_values_under_autocast(dtype, training):
    layers, x = layers_and_input(dtype, training)
    reference, plain = reference_and_plain(layers, x)
    with torch.no_grad(), autocast():
        out = layers(tsp.SparseTensor(x.F, x.C))
    assert {k: v.dtype for k, v in out.items()} == expected_dtypes(dtype)
    check_layer_values(out, plain, reference, "under autocast")


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
@pytest.mark.parametrize("training", [False, True])
def test_every_layer_dtype_under_autocast_compiled(dtype, training):
    """The fake kernels and the traced casts give the eager dtypes (and values) under compile."""
    layers, x = layers_and_input(dtype, training)
    reference, plain = reference_and_plain(layers, x)
    compiled = torch.compile(copy.deepcopy(layers), fullgraph=True, backend="aot_eager")
    with torch.no_grad(), autocast():
        eager = layers(tsp.SparseTensor(x.F, x.C))
        got = compiled(tsp.SparseTensor(x.F, x.C))
    assert {k: v.dtype for k, v in got.items()} == {k: v.dtype for k, v in eager.items()} == expected_dtypes(dtype)
    check_layer_values(got, plain, reference, "compiled under autocast")


FLOAT_OPS = ["sparse_conv", "gather_scatter_forward", "gather_scatter_wgrad", "fetch_on_demand_forward",
             "fetch_on_demand_wgrad", "fetch_on_demand_forward_fused", "implicit_gemm_forward", "implicit_gemm_wgrad",
             "implicit_gemm_forward_grouped",
             "pool_pairs_max", "pool_pairs_mean", "segment_max", "segment_mean", "sample_group_norm",
             "triton_fetch_on_demand_forward", "triton_fetch_on_demand_forward_owned", "triton_fetch_on_demand_wgrad",
             "triton_implicit_gemm_forward", "triton_implicit_gemm_wgrad", "triton_gather_scatter_forward",
             "triton_gather_scatter_wgrad"]
# float32 / float64 only: bf16 features take F.batch_norm (nn.functional.norm.batch_norm_act).
WIDE_FLOAT_OPS = ["batch_norm_stats", "batch_norm_apply", "batch_norm_apply_masked", "batch_norm_backward"]


def test_float_ops_list_is_complete():
    """Every op with a floating-point tensor argument is in FLOAT_OPS (the rest take indices)."""
    m = Maps(torch.Generator().manual_seed(0))
    floating = {op for op, cases in CASES.items() for _, args in cases
                if any(isinstance(a, torch.Tensor) and a.is_floating_point()
                       or isinstance(a, (list, tuple)) and any(isinstance(t, torch.Tensor) and t.is_floating_point()
                                                               for t in a) for a in args(m))}
    assert floating == set(FLOAT_OPS) | set(WIDE_FLOAT_OPS)


@pytest.mark.parametrize("op", WIDE_FLOAT_OPS)
def test_wide_float_ops_reject_bfloat16(op, generator):
    m = Maps(generator)
    for _, make in CASES[op]:
        args = tuple(_to_bf16(a) for a in make(m))
        with pytest.raises(RuntimeError, match="float32 or float64"):
            getattr(torch.ops.torchsparse_pp, op)(*args)


def _to_bf16(value):
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.detach().to(BF16).requires_grad_(value.requires_grad)
    return value


@pytest.mark.parametrize("op", FLOAT_OPS)
def test_ops_in_bfloat16_under_autocast(op, generator):
    """Each custom op with bf16 operands, under autocast: opcheck (the fake kernel's dtypes and
    shapes equal the real outputs', autograd and AOT dispatch), and the real outputs' dtypes."""
    m = Maps(generator)
    for _, make in CASES[op]:
        args = tuple(_to_bf16(a) for a in make(m))
        with autocast():
            torch.library.opcheck(getattr(torch.ops.torchsparse_pp, op).default, args)
            out = getattr(torch.ops.torchsparse_pp, op)(*args)
        out = out if isinstance(out, tuple) else (out,)
        if op == "sample_group_norm":
            assert [t.dtype for t in out] == [BF16, torch.float32, torch.float32]  # statistics in float32
        elif op == "pool_pairs_max":
            assert [t.dtype for t in out] == [BF16, torch.int64]
        else:
            assert [t.dtype for t in out] == [BF16]


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------
def gradients(net: torch.nn.Module) -> dict:
    return {name: p.grad for name, p in net.named_parameters()}


def test_minkunet_autocast_training_step_eager_and_compiled():
    """A training step under bf16 autocast, eager and compiled: the logits and the parameters'
    gradients (jointly: precision.assert_as_accurate_as_plain) held to the same step with plain
    bf16 convs, against float64. (bf16 rounding compounds through a deep net's backward with
    batch-statistics BatchNorm: the first layers' gradients are tens of % off float64 in any
    bf16 computation.)"""
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    eager = MinkUNet(in_channels=4, num_classes=5, cr=0.125).train()
    model, plain_model, reference = copy.deepcopy(eager), copy.deepcopy(eager), copy.deepcopy(eager).double()
    coords = random_coords(gen, 1500, batch=2, low=-16, high=16)
    feats = torch.randn(len(coords), 4, generator=gen)
    labels = torch.randint(0, 5, (len(coords),), generator=gen)

    def step(net, feats, coords, labels):
        with autocast():
            logits = net(tsp.SparseTensor(feats, coords))
            return logits, torch.nn.functional.cross_entropy(logits, labels)

    def results(net, logits, loss):
        # The loss is cross_entropy of the logits (checked below), in float32 as autocast runs it.
        assert torch.equal(loss, torch.nn.functional.cross_entropy(logits.to(loss.dtype), labels))
        loss.backward()
        return {"logits": logits, **gradients(net)}

    logits64 = reference(tsp.SparseTensor(feats.double(), coords))
    expected = results(reference, logits64, torch.nn.functional.cross_entropy(logits64, labels))
    logits, loss = step(eager, feats, coords, labels)
    assert loss.dtype == torch.float32  # cross_entropy autocasts to float32
    got_eager = results(eager, logits, loss)
    with plain_sparse_convs():
        plain = results(plain_model, *step(plain_model, feats, coords, labels))
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    got_compiled = results(model, *compiled(model, feats, coords, labels))
    for got in (got_eager, got_compiled):
        assert got["logits"].dtype == BF16
        for name, p in model.named_parameters():
            assert got[name].dtype == torch.float32 and torch.isfinite(got[name]).all(), name
    grads = list(gradients(eager))
    assert_as_accurate_as_plain(got_eager, plain, expected, what="eager training step", jointly=grads)
    assert_as_accurate_as_plain(got_compiled, plain, expected, what="compiled training step", jointly=grads)


@pytest.mark.parametrize("kind", ["submanifold", "strided", "transposed", "generative"])
def test_conv_gradients_under_autocast(kind):
    """One conv under autocast: bf16 output, float32 gradients, as accurate as the plain bf16 conv."""
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    coords = random_coords(gen, 500, batch=2, low=-8, high=8)
    feats = torch.randn(len(coords), 4, generator=gen)
    down = spnn.Conv3d(4, 4, 2, stride=2)
    conv = {"submanifold": spnn.Conv3d(4, 6, 3, bias=True), "strided": spnn.Conv3d(4, 6, 3, stride=2),
            "transposed": spnn.Conv3d(4, 6, 2, stride=2, transposed=True),
            "generative": spnn.Conv3d(4, 6, 2, stride=2, transposed=True, generative=True)}[kind]
    grad_seed = int(torch.randint(0, 2 ** 31, (1,), generator=gen))

    def run(down, conv, feats):
        """Output, then the gradients of feats, kernel and bias for a fixed random output gradient."""
        feats = feats.clone().requires_grad_(True)
        params = [feats, conv.kernel] + ([conv.bias] if conv.bias is not None else [])
        x = tsp.SparseTensor(feats, coords)
        out = conv(down(x) if kind in ("transposed", "generative") else x).F
        grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(grad_seed)).to(out.dtype)
        return [out, *torch.autograd.grad(out, params, grad_out)]

    expected = run(copy.deepcopy(down).double(), copy.deepcopy(conv).double(), feats.double())
    with autocast():
        got = run(down, conv, feats)
        with plain_sparse_convs():
            plain = run(down, conv, feats)
    assert got[0].dtype == BF16 and all(g.dtype == torch.float32 for g in got[1:])
    names = ["output", "feats grad", "kernel grad", "bias grad"][:len(got)]
    assert_as_accurate_as_plain(dict(zip(names, got)), dict(zip(names, plain)), dict(zip(names, expected)),
                                what=f"{kind} conv under autocast")


def test_centerpoint_autocast_inference_compiled():
    from test_compile import TINY, centerpoint_sample
    seed = fresh_seed()
    torch.manual_seed(seed)
    config = CenterPointConfig.synthetic(**TINY)
    model = CenterPoint(config).eval()
    points, _, _ = centerpoint_sample(seed, config)
    x = voxelize([points], config)
    with torch.no_grad():
        reference = copy.deepcopy(model).double()(x.replace_feats(x.F.double()), 1)
        with autocast():
            eager = model(x, 1)
            got = torch.compile(model, fullgraph=True, backend="aot_eager")(voxelize([points], config), 1)
            with plain_sparse_convs():
                plain = model(x, 1)
    for key in reference:
        assert eager[key].dtype == got[key].dtype == BF16, key
    assert_as_accurate_as_plain(eager, plain, reference, what="CenterPoint eager")
    assert_as_accurate_as_plain(got, plain, reference, what="CenterPoint compiled")
