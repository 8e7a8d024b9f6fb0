"""Mixin that applies a torch module to the features of a SparseTensor."""
from ...tensor import SparseTensor


class FeatureWise:
    """Runs the torch module it is mixed into on ``input.F``; coordinates and caches pass through."""

    def forward(self, input: SparseTensor) -> SparseTensor:
        if not isinstance(input, SparseTensor):
            raise TypeError(f"{type(self).__name__} expects a SparseTensor, got {type(input).__name__}")
        return input.replace_feats(super().forward(input.F))
