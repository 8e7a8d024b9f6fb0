"""BatchNorm with its residual add and ReLU in one pass (the CPU kernels behind BatchNorm and the
model blocks) against torch's own batch_norm + add + relu in float64, torch.autograd.gradcheck,
and the blocks against their module-by-module forward."""
import copy

import pytest
import torch
import torch.nn.functional as TF
from torch import nn

from conftest import shuffled_coords
import torchsparse_pp as tsp
from torchsparse_pp import SparseTensor
from torchsparse_pp import ops
from torchsparse_pp.models.blocks import ConvBNReLU, ResidualBlock, conv_bn_relu
from torchsparse_pp.nn import BatchNorm, LeakyReLU, ReLU
from torchsparse_pp.nn.functional.norm import batch_norm_act


def random_feats(gen, n, c, dtype=torch.float64, offset=2.0):
    scale = torch.rand(c, generator=gen, dtype=torch.float64) * 3 + 0.2
    shift = torch.randn(c, generator=gen, dtype=torch.float64) * offset
    return (torch.randn(n, c, generator=gen, dtype=torch.float64) * scale + shift).to(dtype)


def torch_reference(feats, running_mean, running_var, weight, bias, training, momentum, eps, residual, relu,
                    kept=None):
    """``kept`` (optional) is the ReLU's pass mask to use instead of ``out > 0``."""
    out = TF.batch_norm(feats, running_mean, running_var, weight, bias, training, momentum, eps)
    if residual is not None:
        out = out + residual
    if not relu:
        return out
    return TF.relu(out) if kept is None else out * kept


def relu_mask_within_rounding(ours, pre, rtol):
    """Our ReLU's pass mask, checked against the float64 pre-activation ``pre``: the two may
    differ only where ``pre`` is within float rounding of zero (there a float32 kernel may land
    on either side, and that flips the element's gradient between 0 and grad_out)."""
    kept = ours.detach().double() > 0
    flipped = kept != (pre > 0)
    near_zero = pre.abs() <= rtol * pre.abs().max()
    assert bool((flipped <= near_zero).all()), "the ReLU passed or blocked elements far from zero"
    return kept.double()


def leaves(gen, n, c, dtype, affine, with_residual):
    feats = random_feats(gen, n, c, dtype)
    weight = (torch.rand(c, generator=gen, dtype=torch.float64) + 0.5).to(dtype) if affine else None
    bias = torch.randn(c, generator=gen, dtype=torch.float64).to(dtype) if affine else None
    residual = random_feats(gen, n, c, dtype, offset=0.5) if with_residual else None
    return [t if t is None else t.clone().requires_grad_(True) for t in (feats, weight, bias, residual)]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("relu", [False, True])
def test_training_matches_torch(gen, dtype, affine, with_residual, relu):
    """Forward, every gradient and the running statistics against F.batch_norm + add + relu in
    float64 (rows spanning several of the kernel's parts and blocks)."""
    n, c = 4133, 7
    ours = leaves(gen, n, c, dtype, affine, with_residual)
    ref = [t if t is None else t.detach().double().requires_grad_(True) for t in ours]
    stats = [torch.randn(c, generator=gen, dtype=torch.float64), torch.rand(c, generator=gen, dtype=torch.float64) + 1]
    ours_stats = [s.clone().to(dtype) for s in stats]
    out = batch_norm_act(ours[0], *ours_stats, ours[1], ours[2], True, 0.3, 1e-5, ours[3], relu)
    tol = dict(rtol=1e-10, atol=1e-10) if dtype == torch.float64 else dict(rtol=2e-5, atol=2e-5)
    with torch.no_grad():  # the float64 pre-activation (on copies of the statistics it updates)
        pre = torch_reference(ref[0], *[s.clone() for s in stats], ref[1], ref[2], True, 0.3, 1e-5, ref[3], False)
    kept = relu_mask_within_rounding(out, pre, tol["rtol"]) if relu else None
    expected = torch_reference(ref[0], *stats, ref[1], ref[2], True, 0.3, 1e-5, ref[3], relu, kept)
    assert out.dtype == dtype and expected.std() > 0
    torch.testing.assert_close(out.double(), expected, **tol)
    for ours_s, ref_s in zip(ours_stats, stats):
        torch.testing.assert_close(ours_s.double(), ref_s, **tol)
    grad_out = torch.randn(n, c, generator=gen, dtype=torch.float64)
    out.backward(grad_out.to(dtype))
    expected.backward(grad_out)
    for a, b in zip(ours, ref):
        if a is not None:
            scale = b.grad.abs().max().item()
            assert scale > 0
            assert (a.grad.double() - b.grad).abs().max().item() <= tol["rtol"] * 10 * scale


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("with_residual", [False, True])
def test_eval_matches_torch(gen, dtype, with_residual):
    """Running statistics, with and without autograd (the one-pass kernel runs without)."""
    n, c = 777, 12
    ours = leaves(gen, n, c, dtype, True, with_residual)
    stats = [torch.randn(c, generator=gen, dtype=torch.float64).to(dtype),
             (torch.rand(c, generator=gen, dtype=torch.float64) + 0.1).to(dtype)]
    expected = torch_reference(*[t if t is None else t.detach().double() for t in ours[:1]],
                               *[s.double() for s in stats],
                               *[t if t is None else t.detach().double() for t in ours[1:3]], False, 0.1, 1e-5,
                               None if ours[3] is None else ours[3].detach().double(), True)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        fast = batch_norm_act(ours[0], *stats, ours[1], ours[2], False, 0.1, 1e-5, ours[3], True)
    torch.testing.assert_close(fast.double(), expected, **tol)
    tracked = batch_norm_act(ours[0], *stats, ours[1], ours[2], False, 0.1, 1e-5, ours[3], True)
    assert tracked.requires_grad
    torch.testing.assert_close(tracked.double(), expected, **tol)


def test_gradcheck(gen):
    feats, weight, bias, residual = leaves(gen, 40, 3, torch.float64, True, True)
    for relu in (False, True):
        torch.autograd.gradcheck(
            lambda f, w, b, r: batch_norm_act(f, None, None, w, b, True, 0.1, 1e-5, r, relu),
            (feats, weight, bias, residual))


def test_double_backward_raises(gen):
    feats, weight, bias, _ = leaves(gen, 30, 3, torch.float64, True, False)
    out = batch_norm_act(feats, None, None, weight, bias, True, 0.1, 1e-5, None, True)
    (grad,) = torch.autograd.grad(out.square().sum(), feats, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        grad.sum().backward()
    # With the switch off, ATen's batch_norm: its double backward against float64 finite differences.
    tsp.backends.native_batch_norm = False
    try:
        torch.autograd.gradgradcheck(
            lambda f, w, b: batch_norm_act(f, None, None, w, b, True, 0.1, 1e-5, None, True), (feats, weight, bias))
    finally:
        tsp.backends.native_batch_norm = True
    with pytest.raises(TypeError, match="native_batch_norm must be a bool"):
        tsp.backends.native_batch_norm = 1


def test_statistics_keep_digits_under_a_large_mean(gen):
    """float32 features whose mean is 2000x their spread: the variance (shifted sums in double)
    stays within float32 rounding of the float64 truth."""
    feats = (torch.randn(20000, 5, generator=gen, dtype=torch.float64) * 0.5 + 1000.0)
    mean, invstd, var = ops.batch_norm_stats(feats.float(), 1e-5)
    torch.testing.assert_close(mean.double(), feats.mean(0), rtol=1e-6, atol=0)
    torch.testing.assert_close(var.double(), feats.var(0), rtol=1e-4, atol=0)


def test_results_do_not_depend_on_thread_count(gen):
    feats, weight, bias, residual = leaves(gen, 9000, 20, torch.float32, True, True)
    grad_out = torch.randn(9000, 20, generator=gen)
    results = []
    threads = torch.get_num_threads()
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            for x in (feats, weight, bias, residual):
                x.grad = None
            out = batch_norm_act(feats, None, None, weight, bias, True, 0.1, 1e-5, residual, True)
            out.backward(grad_out)
            results.append([out.detach()] + [x.grad.clone() for x in (feats, weight, bias, residual)])
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(*results):
        assert torch.equal(a, b)


# --------------------------------------------------------------------------------------------
# Modules and blocks
# --------------------------------------------------------------------------------------------
def sparse_input(gen, n, c, dtype=torch.float64):
    coords = shuffled_coords(gen, [n // 2, n - n // 2], -12, 12)
    return SparseTensor(random_feats(gen, n, c, dtype).requires_grad_(True), coords)


def randomise(module, gen):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.3 + (1.0 if p.dim() == 1 else 0.0))


def module_by_module(block, x):
    """The block run one module at a time (no fused norm passes)."""
    if isinstance(block, ResidualBlock):
        return block.relu(nn.Sequential.forward(block.body, x) + block.shortcut(x))
    return nn.Sequential.forward(block, x)


@pytest.mark.parametrize("make", [lambda: conv_bn_relu(5, 6, 3), lambda: ResidualBlock(5, 6),
                                  lambda: ResidualBlock(6, 6)], ids=["conv_bn_relu", "residual_1x1", "residual_id"])
@pytest.mark.parametrize("training", [True, False])
def test_blocks_equal_module_by_module(gen, make, training):
    block = make().double()
    randomise(block, gen)
    block.train(training)
    if not training:  # running statistics of a few steps
        block.train()
        for _ in range(2):
            block(sparse_input(gen, 300, block_in(block)))
        block.eval()
    reference = copy.deepcopy(block)
    x = sparse_input(gen, 500, block_in(block))
    x_ref = SparseTensor(x.F.detach().clone().requires_grad_(True), x.C)
    out, expected = block(x), module_by_module(reference, x_ref)
    assert expected.F.std() > 0
    torch.testing.assert_close(out.F, expected.F, rtol=1e-10, atol=1e-10)
    grad_out = torch.randn(out.F.shape, generator=gen, dtype=torch.float64)
    out.F.backward(grad_out)
    expected.F.backward(grad_out)
    torch.testing.assert_close(x.F.grad, x_ref.F.grad, rtol=1e-10, atol=1e-10)
    for (name, p), q in zip(block.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-10, atol=1e-10, msg=name)
    for (name, b), c in zip(block.named_buffers(), reference.buffers()):
        torch.testing.assert_close(b, c, rtol=1e-10, atol=1e-10, msg=name)


@pytest.mark.parametrize("make", [lambda: conv_bn_relu(5, 6, 3), lambda: conv_bn_relu(5, 6, 2, stride=2),
                                  lambda: ResidualBlock(5, 6), lambda: ResidualBlock(6, 6)],
                         ids=["conv_bn_relu", "strided", "residual_1x1", "residual_id"])
def test_blocks_in_inference_fold_their_norms(gen, make):
    """Eval without autograd: each conv (the 1x1 shortcut's too) runs with its BatchNorm folded in
    and the add / ReLU in its epilogue (the norms are not called); the result equals the
    module-by-module forward."""
    block = make().double()
    randomise(block, gen)
    block.train()
    for _ in range(2):
        block(sparse_input(gen, 300, block_in(block)))
    block.eval()
    norms = [m for m in block.modules() if isinstance(m, BatchNorm)]
    calls = []
    for m in norms:
        m.register_forward_hook(lambda *args: calls.append(1))
    x = sparse_input(gen, 500, block_in(block))
    with torch.no_grad():
        out = block(SparseTensor(x.F.detach(), x.C))
        folded_calls = len(calls)
        expected = module_by_module(block, SparseTensor(x.F.detach(), x.C))
    assert expected.F.std() > 0 and (expected.F == 0).any()
    torch.testing.assert_close(out.F, expected.F, rtol=1e-10, atol=1e-10)
    assert folded_calls == 0  # every norm folded, a 1x1 shortcut's too
    calls.clear()
    with_grad = block(x)  # autograd on: the norms run (in their own pass)
    assert len(calls) == len(norms)
    torch.testing.assert_close(with_grad.F.detach(), expected.F, rtol=1e-10, atol=1e-10)
    # The folded kernels are kept between calls, and refolded once a statistic or parameter changes.
    block.train()
    block(sparse_input(gen, 300, block_in(block)))  # running statistics move
    with torch.no_grad():
        next(block.parameters()).mul_(0.5)  # a parameter changes in place
    block.eval()
    with torch.no_grad():
        again = block(SparseTensor(x.F.detach(), x.C))
        expected = module_by_module(block, SparseTensor(x.F.detach(), x.C))
    assert (again.F - out.F).abs().max() > 1e-3
    torch.testing.assert_close(again.F, expected.F, rtol=1e-10, atol=1e-10)


def test_conv_norm_arguments_are_checked(gen):
    conv, bn = conv_bn_relu(4, 5, 3).double()[:2]
    x = sparse_input(gen, 50, 4)
    with pytest.raises(ValueError, match="only with the norm"):
        conv(x, relu=True)
    with pytest.raises(ValueError, match="channel mismatch"):
        conv(x, norm=BatchNorm(4).double())
    with pytest.raises(TypeError, match="residual must be a SparseTensor"):
        conv(x, norm=bn, residual=x.F)
    with pytest.raises(TypeError, match="norm must be a torchsparse_pp BatchNorm"):
        conv(x, norm=nn.BatchNorm1d(5).double())


def block_in(block):
    first = block[0] if isinstance(block, ConvBNReLU) else block.body[0]
    return first.in_channels


def test_block_with_another_activation_runs_its_modules(gen):
    """A ConvBNReLU whose ReLU was swapped runs the module it now holds."""
    block = conv_bn_relu(4, 5, 3).double()
    block[2] = LeakyReLU(0.2)
    x = sparse_input(gen, 200, 4)
    out = block(x)
    expected = TF.leaky_relu(block[1](block[0](x)).F, 0.2)
    assert (out.F < 0).any()
    torch.testing.assert_close(out.F, expected, rtol=1e-12, atol=1e-12)


def test_state_dict_keys_unchanged():
    block = conv_bn_relu(4, 5, 3)
    plain = nn.Sequential(*[copy.deepcopy(m) for m in block])
    assert list(block.state_dict()) == list(plain.state_dict())
    assert isinstance(block, nn.Sequential) and isinstance(block[2], ReLU)


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------
def test_residual_mismatches_raise(gen):
    bn = BatchNorm(4).double()
    x = sparse_input(gen, 50, 4)
    with pytest.raises(ValueError, match="same coordinates"):
        bn(x, residual=sparse_input(gen, 50, 4))
    with pytest.raises(TypeError, match="residual must be a SparseTensor"):
        bn(x, residual=x.F)
    with pytest.raises(ValueError, match="residual must match"):
        batch_norm_act(x.F, None, None, None, None, True, 0.1, 1e-5, x.F[:10])
    with pytest.raises(ValueError, match="channel mismatch"):
        bn(sparse_input(gen, 50, 3))


def test_one_point_in_training_raises(gen):
    bn = BatchNorm(4).double()
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        bn(sparse_input(gen, 1, 4))


def test_ops_reject_bad_tensors(gen):
    with pytest.raises(RuntimeError, match="float32 or float64"):
        ops.batch_norm_stats(torch.ones(5, 3, dtype=torch.int32), 1e-5)
    with pytest.raises(RuntimeError, match="more than one point"):
        ops.batch_norm_stats(torch.randn(1, 3, generator=gen), 1e-5)
    x = torch.randn(6, 3, generator=gen)
    with pytest.raises(RuntimeError, match="scale must have 3 entries"):
        ops.batch_norm_apply(x, torch.ones(4), torch.zeros(3), None, False)
    with pytest.raises(RuntimeError, match="residual must be"):
        ops.batch_norm_apply(x, torch.ones(3), torch.zeros(3), torch.randn(5, 3, generator=gen), False)
    with pytest.raises(RuntimeError, match="contiguous"):
        ops.batch_norm_apply(torch.randn(3, 6, generator=gen).t(), torch.ones(3), torch.zeros(3), None, False)
    mean, invstd = torch.zeros(3), torch.ones(3)
    with pytest.raises(RuntimeError, match="relu_mask must be a contiguous int16"):
        ops.batch_norm_backward(x, x, mean, invstd, None, torch.zeros(6, 1, dtype=torch.int32), False)
    with pytest.raises(RuntimeError, match=r"relu_mask must be \[6, 1\]"):
        ops.batch_norm_backward(x, x, mean, invstd, None, torch.zeros(6, 2, dtype=torch.int16), False)


def test_folded_kernels_under_autocast_follow_parameter_changes(gen):
    """Under autocast the folded kernels are also kept in the autocast dtype; an in-place change
    of a parameter or statistic refolds and recasts them (the result equals a fresh copy's)."""
    block = ResidualBlock(6, 8)
    randomise(block, gen)
    block.eval()
    x = sparse_input(gen, 400, 6, dtype=torch.float32)

    def run(module):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            return module(x).F

    first = run(block)
    assert first.dtype == torch.bfloat16 and torch.equal(run(block), first)
    with torch.no_grad():
        block.body[0].kernel.mul_(-0.5)  # the first conv's weight changes in place
        next(m for m in block.modules() if isinstance(m, BatchNorm)).running_var.mul_(3.0)
    again = run(block)
    assert not torch.equal(again, first)
    fresh = copy.deepcopy(block)  # copies leave the cache out: this one folds afresh
    assert not any("_folded_cache" in m.__dict__ for m in fresh.modules())
    assert any("_folded_cache" in m.__dict__ for m in block.modules())
    assert torch.equal(again, run(fresh))


def test_folded_kernels_follow_storage_swaps(gen):
    """`p.data = ...` (old-style weight loading) gives a parameter new storage without a new
    version: the folded kernels must not be reused then (they were, silently)."""
    block = ResidualBlock(5, 6).double()
    randomise(block, gen)
    block.eval()
    x = sparse_input(gen, 300, 5)
    with torch.no_grad():
        first = block(x).F
        norm = next(m for m in block.modules() if isinstance(m, BatchNorm))
        block.body[0].kernel.data = block.body[0].kernel.data * -2.0
        norm.running_mean.data = norm.running_mean.data + 0.5
        again = block(x).F
        expected = module_by_module(block, x)
    assert (again - first).abs().max() > 1e-3
    torch.testing.assert_close(again, expected.F, rtol=1e-10, atol=1e-10)
