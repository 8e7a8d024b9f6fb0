"""spconv's table modules: join, add and branch SparseConvTensors that share indices."""
from typing import List

import torch

from .modules import SparseModule
from .tensor import SparseConvTensor


def _check_aligned(inputs: List[SparseConvTensor], what: str) -> None:
    first = inputs[0]
    for t in inputs:
        if (t.spatial_shape != first.spatial_shape or t.batch_size != first.batch_size
                or t.features.shape[1] != first.features.shape[1] or t.indices.shape[0] != first.indices.shape[0]):
            raise ValueError(f"you can't use {what} on sparse tensors with different indices")


class JoinTable(SparseModule):
    def forward(self, input: List[SparseConvTensor]) -> SparseConvTensor:
        _check_aligned(input, "JoinTable")
        return input[0].replace_feature(torch.cat([t.features for t in input], 1))

    def input_spatial_size(self, out_size):
        return out_size


class AddTable(SparseModule):
    def forward(self, input: List[SparseConvTensor]) -> SparseConvTensor:
        _check_aligned(input, "AddTable")
        return input[0].replace_feature(sum(t.features for t in input))

    def input_spatial_size(self, out_size):
        return out_size


class ConcatTable(SparseModule):
    def forward(self, input):
        return [module(input) for module in self._modules.values()]

    def add(self, module):
        self._modules[str(len(self._modules))] = module
        return self

    def input_spatial_size(self, out_size):
        return self._modules["0"].input_spatial_size(out_size)
