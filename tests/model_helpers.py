"""Helpers shared by the model-level tests (models, compile, export)."""
import torch

from precision import rel_err  # noqa: F401 (the models' tests import it from here)


def randomise_norms(module: torch.nn.Module, gen: torch.Generator) -> None:
    """Random running statistics and affine parameters, so eval-mode norms are not identities."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
