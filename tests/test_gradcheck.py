"""torch.autograd.gradcheck in float64 for every convolution variant."""
import pytest
import torch

import torchsparse_pp as tsp
from torchsparse_pp.nn.functional import conv3d
from conftest import random_coords

CASES = {
    "submanifold k3": dict(kernel_size=3),
    "submanifold (3,1,1) dilation 2": dict(kernel_size=(3, 1, 1), dilation=2),
    "strided spconv k3 s2": dict(kernel_size=3, stride=2, padding=1),
    "strided minkowski k2 s2": dict(kernel_size=2, stride=2, downsample_mode="minkowski"),
    "strided k3 s(2,1,1) dilation 2": dict(kernel_size=3, stride=(2, 1, 1), dilation=2, padding=0),
    "generative k2 s2": dict(kernel_size=2, stride=2, transposed=True, generative=True),
    "pointwise k1": dict(kernel_size=1),
}


@pytest.mark.parametrize("name", list(CASES))
def test_gradcheck(name, generator):
    kwargs = CASES[name]
    coords = random_coords(generator, 30, batch=2, low=0, high=5)
    stride = 2 if kwargs.get("generative") else 1
    x = tsp.SparseTensor(torch.randn(coords.shape[0], 3, generator=generator, dtype=torch.float64), coords,
                         stride=stride)
    k = kwargs["kernel_size"]
    volume = k ** 3 if isinstance(k, int) else k[0] * k[1] * k[2]
    weight = torch.randn(volume, 3, 2, generator=generator, dtype=torch.float64, requires_grad=True)
    feats = x.F.clone().requires_grad_(True)

    def fn(f, w):
        return conv3d(x.replace_feats(f), w, **kwargs).F

    assert torch.autograd.gradcheck(fn, (feats, weight), eps=1e-6, atol=1e-8)


def test_gradcheck_transposed(generator):
    coords = random_coords(generator, 30, batch=2, low=0, high=6)
    fine = tsp.SparseTensor(torch.randn(coords.shape[0], 2, generator=generator, dtype=torch.float64), coords)
    coarse = conv3d(fine, torch.randn(27, 2, 3, generator=generator, dtype=torch.float64), 3, stride=2, padding=1)
    weight = torch.randn(27, 3, 2, generator=generator, dtype=torch.float64, requires_grad=True)
    feats = coarse.F.detach().clone().requires_grad_(True)

    def fn(f, w):
        return conv3d(coarse.replace_feats(f), w, 3, stride=2, padding=1, transposed=True).F

    assert torch.autograd.gradcheck(fn, (feats, weight), eps=1e-6, atol=1e-8)


def test_double_backward_raises(generator):
    """The conv passes have no derivatives of their own: a second backward through the input
    gradient raises instead of running through kernels autograd knows nothing about (it once
    ran with only a warning, giving no second-order terms)."""
    coords = random_coords(generator, 40, batch=2, low=0, high=5)
    feats = torch.randn(coords.shape[0], 3, generator=generator, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(27, 3, 2, generator=generator, dtype=torch.float64, requires_grad=True)
    out = conv3d(tsp.SparseTensor(feats, coords), weight, 3).F
    (grad,) = torch.autograd.grad(out.square().sum(), feats, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        grad.sum().backward()
