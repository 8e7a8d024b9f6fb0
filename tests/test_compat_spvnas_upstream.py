"""SPVNAS's MinkUNet, SPVCNN and SPVNAS supernet (its own code, tests/spvnas_upstream.py) run
unchanged on the torchsparse / torch_scatter adapters: forward and backward; the upstream
classes' state dicts load with strict=True and round-trip through ``torchsparse-pp convert``
(MinkUNet, SPVCNN); every sparse conv they run equals the dense float64 oracle with 2.1's kernel
layout; whole float32 outputs are as accurate as the same model with exactly rounded convs,
against a float64 run (docs/testing.md); its point-voxel helpers equal their definitions."""
import copy

import pytest
import torch

from oracle import reference_conv, sparse_weight
from precision import assert_as_accurate_as_plain, plain_sparse_convs
from spvnas_upstream import build, load, randomize_norms, scan_input

MODELS = ["MinkUNet", "SPVCNN", "SPVNAS"]
SMALL = dict(voxel=0.5, batch=1)  # ~1500 voxels of one scan: dense oracles stay small


@pytest.fixture(scope="module")
def upstream():
    return load()


@pytest.mark.parametrize("name", MODELS)
def test_forward_and_backward(name, upstream, seed):
    models, _, torchsparse = upstream
    model = build(models, name, torch.float32).train()
    x = scan_input(torchsparse, seed)
    logits = model(x)
    assert logits.shape == (x.C.shape[0], 19) and torch.isfinite(logits).all()
    torch.nn.functional.cross_entropy(logits, torch.randint(0, 19, (len(logits),))).backward()
    kernels = [(n, p) for n, p in model.named_parameters() if n.endswith("kernel") and p.grad is not None]
    assert len(kernels) > 20 and all(torch.isfinite(p.grad).all() for _, p in kernels)
    assert sum(bool(p.grad.abs().sum() > 0) for _, p in kernels) > len(kernels) // 2


@pytest.mark.parametrize("name", MODELS)
def test_state_dict_loads_strictly_into_the_upstream_class(name, upstream, seed):
    models, _, torchsparse = upstream
    source = build(models, name)
    randomize_norms(source, torch.Generator().manual_seed(seed))
    target = build(models, name)
    if name == "SPVNAS":
        target.manual_select(source.sample)
    target.load_state_dict(source.state_dict(), strict=True)
    with torch.no_grad():
        a = source.eval()(scan_input(torchsparse, seed, dtype=torch.float64, **SMALL))
        b = target.eval()(scan_input(torchsparse, seed, dtype=torch.float64, **SMALL))
    assert torch.equal(a, b)


def dense_2_1(kernel: torch.Tensor, kernel_size) -> torch.Tensor:
    """A 2.1 kernel ``[K, C_in, C_out]`` as conv3d's ``[C_out, C_in, kx, ky, kz]``: its rows run
    x fastest for odd kernel volumes and z fastest for even ones (2.1's own dense-conv test)."""
    kx, ky, kz = kernel_size
    c_in, c_out = kernel.shape[1:]
    if (kx * ky * kz) % 2:
        return kernel.reshape(kz, ky, kx, c_in, c_out).permute(4, 3, 2, 1, 0)
    return kernel.reshape(kx, ky, kz, c_in, c_out).permute(4, 3, 0, 1, 2)


def recorded_convs(torchsparse, monkeypatch):
    """Every call of torchsparse.nn.functional.conv3d (spnn.Conv3d and SPVNAS's dynamic convs
    both call it) with its operands and result."""
    calls, conv3d = [], torchsparse.nn.functional.conv3d

    def record(input, weight, kernel_size, bias=None, stride=1, padding=0, dilation=1, config=None,
               transposed=False, generative=False, training=False):
        out = conv3d(input, weight, kernel_size, bias, stride, padding, dilation, config, transposed, generative,
                     training)
        calls.append(dict(coords=input.C, feats=input.F.detach(), weight=weight.detach(), bias=bias,
                          kernel_size=torchsparse.utils.make_ntuple(kernel_size, 3),
                          stride=torchsparse.utils.make_ntuple(stride, 3), transposed=transposed,
                          out_coords=out.C, out=out.F.detach()))
        return out
    monkeypatch.setattr(torchsparse.nn.functional, "conv3d", record)
    return calls


def oracle(call, absolute: bool = False) -> torch.Tensor:
    """The dense float64 conv at the call's output coordinates: stride 1 centred (odd kernels),
    strided and transposed with 2.1's padding 0 (the k2 s2 convs of these models)."""
    f, w = call["feats"].double(), call["weight"].double()
    if absolute:
        f, w = f.abs(), w.abs()
    if w.dim() == 2:  # 2.1's 1x1x1 stride-1 kernel [C_in, C_out]
        return f @ w
    k, s = call["kernel_size"], call["stride"]
    pad = tuple((n - 1) // 2 for n in k) if s == (1, 1, 1) else (0, 0, 0)
    kernel = sparse_weight(dense_2_1(w, k), transposed=False)
    return reference_conv(call["coords"], f, kernel, call["out_coords"], k, s, 1, pad, transposed=call["transposed"])


@pytest.mark.parametrize("name", MODELS)
def test_every_conv_equals_the_dense_oracle(name, upstream, seed, monkeypatch):
    models, _, torchsparse = upstream
    model = build(models, name).eval()
    randomize_norms(model, torch.Generator().manual_seed(seed))
    calls = recorded_convs(torchsparse, monkeypatch)
    with torch.no_grad():
        model(scan_input(torchsparse, seed, dtype=torch.float64, **SMALL))
    assert {c["transposed"] for c in calls} == {False, True} and len(calls) > 30
    for i, call in enumerate(calls):
        assert call["bias"] is None and call["out"].dtype == torch.float64
        ref, scale = oracle(call), oracle(call, absolute=True)
        err = ((call["out"] - ref).norm() / scale.norm().clamp(min=1e-30)).item()
        assert err < 1e-12, f"conv {i} (kernel {call['kernel_size']}, stride {call['stride']}): {err:.3g}"


@pytest.mark.parametrize("name", MODELS)
def test_float32_outputs_against_a_float64_run(name, upstream, seed):
    """The float32 model against the same model in float64, as accurate as the float32 model whose
    sparse convs compute exactly and round once (precision.plain_sparse_convs)."""
    models, _, torchsparse = upstream
    model = build(models, name).eval()
    randomize_norms(model, torch.Generator().manual_seed(seed))
    wide = copy.deepcopy(model)
    narrow = model.float()
    with torch.no_grad():
        ref = wide(scan_input(torchsparse, seed, dtype=torch.float64, **SMALL))
        ours = narrow(scan_input(torchsparse, seed, **SMALL))
        with plain_sparse_convs():
            plain = narrow(scan_input(torchsparse, seed, **SMALL))
    assert ours.dtype == torch.float32
    assert_as_accurate_as_plain(ours, plain, ref, what=f"{name} float32")


@pytest.mark.parametrize("name", ["MinkUNet", "SPVCNN"])
def test_checkpoint_round_trips_through_convert(name, upstream, seed, tmp_path, capsys):
    """``torchsparse-pp convert --from torchsparse`` then ``--to torchsparse``: the upstream state
    dict comes back tensor for tensor, except MinkUNet's point_transforms, which its forward never
    reads and the native MinkUNet does not have."""
    from torchsparse_pp.cli import main

    models, _, _ = upstream
    source = build(models, name)
    randomize_norms(source, torch.Generator().manual_seed(seed))
    config = tmp_path / "model.yaml"
    config.write_text(f"data: {{format: semantickitti, root: {tmp_path}}}\nmodel: {{name: {name.lower()}, cr: 0.5}}\n")
    torch.save({"model": source.state_dict()}, tmp_path / "upstream.pt")
    assert main(["convert", "--from", "torchsparse", str(tmp_path / "upstream.pt"), "--model", str(config),
                 str(tmp_path / "ours.pt")]) == 0
    assert main(["convert", "--to", "torchsparse", str(tmp_path / "ours.pt"), "--model", str(config),
                 str(tmp_path / "back.pt")]) == 0
    capsys.readouterr()
    back, state = torch.load(tmp_path / "back.pt"), source.state_dict()
    unread = {k for k in state if name == "MinkUNet" and k.startswith("point_transforms.")}
    assert back.keys() == state.keys() - unread and all(torch.equal(back[k], state[k]) for k in back)
    missing, unexpected = build(models, name).load_state_dict(back, strict=not unread)
    assert set(missing) == {k for k in unread if not k.endswith("num_batches_tracked")} and not unexpected


def test_point_voxel_helpers_follow_their_definitions(upstream, gen):
    """SPVNAS's initial_voxelize / point_to_voxel / voxel_to_point on the adapters: voxels
    unique(floor(p * pres / vres)) with the mean of their points; a stride-2 voxel set's features
    at the points by trilinear weights over the present corners (2.1's + 1e-8); points into the
    voxels by mean, points without a voxel to voxel 0 (SPVNAS's clamp)."""
    _, utils, torchsparse = upstream
    points = torch.cat([torch.randint(0, 2, (300, 1), generator=gen), torch.rand(300, 3, generator=gen) * 20], 1)
    feats = torch.randn(300, 3, generator=gen, dtype=torch.float64)
    z = utils.PointTensor(feats, points.clone())
    x = utils.initial_voxelize(z, 0.1, 0.2)
    scaled = points[:, 1:] * 0.1 / 0.2
    coords, inverse = torch.unique(torch.cat([points[:, :1], torch.floor(scaled)], 1).int(), dim=0, return_inverse=True)
    assert torch.equal(x.C, coords) and torch.equal(z.C[:, 1:], scaled)
    want = torch.stack([feats[inverse == v].mean(0) for v in range(len(coords))])
    assert torch.allclose(x.F, want, rtol=1e-13, atol=1e-15)
    halves = torch.unique(coords // torch.tensor([1, 2, 2, 2], dtype=torch.int32), dim=0)
    halves = halves[torch.rand(len(halves), generator=gen) < 0.7]  # some points find no voxel
    coarse = torchsparse.SparseTensor(torch.randn(len(halves), 2, generator=gen, dtype=torch.float64), halves, 2)
    out = utils.voxel_to_point(coarse, z)
    rows = {tuple(c): i for i, c in enumerate(coarse.C.tolist())}
    for i, p in enumerate(z.C.tolist()):
        u = [v / 2 for v in p[1:]]
        lo = [int(torch.floor(torch.tensor(v))) for v in u]
        total, acc = 0.0, torch.zeros(2, dtype=torch.float64)
        for k in range(8):
            bits = ((k >> 2) & 1, (k >> 1) & 1, k & 1)
            row = rows.get((int(p[0]),) + tuple(l + b for l, b in zip(lo, bits)))
            w = float(torch.tensor([(v - l) if b else (l + 1 - v) for v, l, b in zip(u, lo, bits)]).prod())
            if row is not None:
                total, acc = total + w, acc + w * coarse.F[row]
        assert torch.allclose(out.F[i], acc / (total + 1e-8), rtol=1e-5, atol=1e-6)
    back = utils.point_to_voxel(coarse, z)
    lookup = [rows.get((int(p[0]),) + tuple(int(v // 2) for v in p[1:]), 0) for p in z.C.tolist()]
    lookup = torch.tensor(lookup)
    want = torch.stack([z.F[lookup == v].mean(0) if (lookup == v).any() else torch.zeros(3, dtype=torch.float64)
                        for v in range(int(lookup.max()) + 1)])
    assert torch.allclose(back.F, want, rtol=1e-13, atol=1e-15) and back.C is coarse.C


def test_supernet_determinizes_to_the_same_network(upstream, seed):
    """SPVNAS.determinize() (which runs the supernet on its own float32 sample): the static network
    of the sampled channels and depths gives the supernet's outputs (the same sums: equal up to
    float32 rounding)."""
    models, _, torchsparse = upstream
    supernet = build(models, "SPVNAS", torch.float32)
    randomize_norms(supernet, torch.Generator().manual_seed(seed))
    static = supernet.determinize()
    assert not any(isinstance(m, models.spvnas.RandomModule) for m in static.modules())
    with torch.no_grad():
        want = supernet.eval()(scan_input(torchsparse, seed, **SMALL))
        got = static.eval()(scan_input(torchsparse, seed, **SMALL))
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
