"""spconv's module containers and the small modules model code uses with them."""
from collections import OrderedDict

from torch import nn

from .tensor import SparseConvTensor


class SparseModule(nn.Module):
    """Marks a module that takes a SparseConvTensor inside SparseSequential."""

    def __init__(self, name=None):
        super().__init__()
        self.name = name
        self._sparse_unique_name = ""


class _OnFeatures:
    """A torch module that also takes a SparseConvTensor (applied to its features)."""

    def forward(self, input):
        if isinstance(input, SparseConvTensor):
            return input.replace_feature(super().forward(input.features))
        return super().forward(input)


class SparseBatchNorm(_OnFeatures, nn.BatchNorm1d):
    pass


class SparseSyncBatchNorm(_OnFeatures, nn.SyncBatchNorm):
    pass


class SparseReLU(_OnFeatures, nn.ReLU):
    pass


class SparseIdentity(_OnFeatures, nn.Identity):
    pass


def is_spconv_module(module: nn.Module) -> bool:
    return isinstance(module, (SparseModule, SparseBatchNorm, SparseReLU))


class SparseSequential(SparseModule):
    """Sequential container: sparse modules get the SparseConvTensor, any other module (a dense
    norm, activation, ...) gets its features (skipped on an empty tensor, as in spconv)."""

    def __init__(self, *args, **kwargs):
        super().__init__()
        if len(args) == 1 and isinstance(args[0], OrderedDict):
            for key, module in args[0].items():
                self.add_module(key, module)
        else:
            for index, module in enumerate(args):
                self.add_module(str(index), module)
        for key, module in kwargs.items():
            if key in self._modules:
                raise ValueError(f"name {key!r} exists.")
            self.add_module(key, module)

    def __getitem__(self, index: int):
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} is out of range")
        return list(self._modules.values())[index]

    def __len__(self) -> int:
        return len(self._modules)

    def add(self, module, name=None) -> None:
        if name is None:
            name = str(len(self._modules))
            if name in self._modules:
                raise KeyError("name exists")
        self.add_module(name, module)

    def forward(self, input):
        for module in self._modules.values():
            if is_spconv_module(module) or not isinstance(input, SparseConvTensor):
                input = module(input)
            elif input.indices.shape[0] != 0:
                input = input.replace_feature(module(input.features))
        return input


class Identity(nn.Module):
    def forward(self, input):
        return input

    def input_spatial_size(self, out_size):
        return out_size


class ToDense(SparseModule):
    """SparseConvTensor -> dense [B, C, *spatial]."""

    def forward(self, x: SparseConvTensor):
        return x.dense()


class RemoveGrid(SparseModule):
    """Drops spconv's pre-allocated grid buffer (kept only for API compatibility)."""

    def forward(self, x: SparseConvTensor):
        x.grid = None
        return x


def assign_name_for_sparse_modules(module: nn.Module) -> None:
    for name, child in module.named_modules():
        if isinstance(child, SparseModule):
            child._sparse_unique_name = name
