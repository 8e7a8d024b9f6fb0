"""``torchsparse.backend.GPUHashTable`` / ``GPUHashTable32``: torchsparse 2.1's coordinate hash
table (as SPVNAS's ``core/models/utils.py`` builds its point-voxel queries on it), in plain torch
ops on the tables' own device, CPU or CUDA.

As in 2.1: ``GPUHashTable(keys, vals)`` is a table over the given slot tensors (int64 keys for
GPUHashTable, int32 for GPUHashTable32; int32 values), written in place;
``GPUHashTable(capacity)`` owns new zeroed ones, made on the device of the first tensor it is given.
``insert_coords(coords [N, 4] int32)`` stores row i + 1 under the 64-bit FNV-1a hash of the row
(the int32 table keeps its low 32 bits); ``insert_vals(keys)`` the same for given keys.
``lookup_vals(keys)`` / ``lookup_coords(coords, kernel_sizes, strides, kernel_volume)`` return
int32 values, 0 where absent, in ``ceil(N / 128) * 128`` rows. ``lookup_coords`` looks up, for
offset k of ``kernel_volume``, the row ``(c0 * s0 + o0, c1 * s1 + o1, c2 * s2 + o2, c3)`` with
``o_i = t_i - (ks_i - 1) // 2``, where the digits t_i of k (base ks_i) run column 0 fastest for an
odd ``kernel_volume`` and column 2 fastest for an even one. Where the GPU kernels would loop
forever (a full table) this raises, or stops after one pass for a lookup.
"""
from typing import Optional

import torch

from . import probing
from .fnv import fnv1a64, low32

ROWS_ALIGNMENT = 128  # 2.1 pads its lookup results to its CTA height


def _padded(rows: int) -> int:
    return (rows + ROWS_ALIGNMENT - 1) // ROWS_ALIGNMENT * ROWS_ALIGNMENT


def _check_coords(coords: torch.Tensor) -> None:
    if not isinstance(coords, torch.Tensor) or coords.dim() != 2 or coords.shape[1] != 4:
        raise ValueError(f"coords must be [N, 4], got {tuple(getattr(coords, 'shape', ()))}")
    if coords.dtype != torch.int32:
        raise TypeError(f"coords must be int32 (torch.int), got {coords.dtype}")


def _int_triple(values: torch.Tensor, name: str):
    if not isinstance(values, torch.Tensor) or values.dtype != torch.int32 or values.numel() != 3:
        raise TypeError(f"{name} must be an int32 tensor of 3 values, got "
                        f"{getattr(values, 'dtype', type(values).__name__)} {tuple(getattr(values, 'shape', ()))}")
    return [int(v) for v in values.reshape(-1).tolist()]


def kernel_rows(coords: torch.Tensor, kernel_sizes, strides, kernel_volume: int) -> torch.Tensor:
    """``[N, kernel_volume, 4]``: the rows lookup_coords looks up (see the module docstring)."""
    order = range(3) if kernel_volume % 2 else range(2, -1, -1)
    offsets = torch.zeros(kernel_volume, 3, dtype=torch.long, device=coords.device)
    rest = torch.arange(kernel_volume, device=coords.device)
    for axis in order:
        offsets[:, axis] = rest % kernel_sizes[axis] - (kernel_sizes[axis] - 1) // 2
        rest = rest // kernel_sizes[axis]
    scaled = coords[:, :3].long() * torch.tensor(strides, device=coords.device)
    spatial = scaled.unsqueeze(1) + offsets.unsqueeze(0)
    last = coords[:, 3:].long().unsqueeze(1).expand(-1, kernel_volume, 1)
    return torch.cat([spatial, last], 2)


class _HashTable:
    key_dtype = torch.int64

    def __init__(self, capacity_or_keys, vals: Optional[torch.Tensor] = None):
        if isinstance(capacity_or_keys, torch.Tensor):
            keys = capacity_or_keys
            if keys.dtype != self.key_dtype or keys.dim() != 1:
                raise TypeError(f"{type(self).__name__} keys must be a 1-D {self.key_dtype} tensor, got "
                                f"{keys.dtype} {tuple(keys.shape)}")
            if not isinstance(vals, torch.Tensor) or vals.dtype != torch.int32 or vals.dim() != 1:
                raise TypeError("the table's values must be a 1-D int32 tensor")
            if vals.shape[0] < keys.shape[0] or vals.device != keys.device:
                raise ValueError(f"the values ({vals.shape[0]} on {vals.device}) must cover the {keys.shape[0]} "
                                 f"key slots on {keys.device}")
            self._keys, self._vals, self.capacity = keys, vals, keys.shape[0]
        else:
            if vals is not None:
                raise TypeError(f"{type(self).__name__}(capacity) takes no values tensor")
            self._keys = self._vals = None
            self.capacity = capacity_or_keys
        if not isinstance(self.capacity, int) or isinstance(self.capacity, bool) or self.capacity < 1:
            raise ValueError(f"the table needs a capacity >= 1, got {self.capacity!r}")

    def _slots_on(self, device: torch.device):
        if self._keys is None:  # GPUHashTable(capacity): made where it is first used
            self._keys = torch.zeros(self.capacity, dtype=self.key_dtype, device=device)
            self._vals = torch.zeros(self.capacity, dtype=torch.int32, device=device)
        if self._keys.device != device:
            raise ValueError(f"the table is on {self._keys.device}, the argument on {device}")
        return self._keys, self._vals

    def _coord_keys(self, rows: torch.Tensor) -> torch.Tensor:
        h = fnv1a64(rows.unbind(-1))
        return h if self.key_dtype == torch.int64 else low32(h)

    def _check_keys(self, keys: torch.Tensor) -> None:
        if not isinstance(keys, torch.Tensor) or keys.dtype != self.key_dtype or keys.dim() != 1:
            raise TypeError(f"keys must be a 1-D {self.key_dtype} tensor, got "
                            f"{getattr(keys, 'dtype', type(keys).__name__)} {tuple(getattr(keys, 'shape', ()))}")

    def _insert(self, keys: torch.Tensor) -> None:
        table_keys, table_vals = self._slots_on(keys.device)
        rows = torch.arange(1, keys.shape[0] + 1, dtype=torch.int32, device=keys.device)
        probing.insert(table_keys, table_vals, keys, rows)

    def _lookup(self, keys: torch.Tensor, rows: int) -> torch.Tensor:
        table_keys, table_vals = self._slots_on(keys.device)
        found = probing.lookup(table_keys, table_vals, keys)
        return torch.cat([found, found.new_zeros((_padded(rows) - rows,) + tuple(found.shape[1:]))])

    def insert_vals(self, keys: torch.Tensor) -> None:
        self._check_keys(keys)
        self._insert(keys)

    def lookup_vals(self, keys: torch.Tensor) -> torch.Tensor:
        self._check_keys(keys)
        return self._lookup(keys, keys.shape[0])

    def insert_coords(self, coords: torch.Tensor) -> None:
        _check_coords(coords)
        self._insert(self._coord_keys(coords))

    def lookup_coords(self, coords: torch.Tensor, kernel_sizes: torch.Tensor, strides: torch.Tensor,
                      kernel_volume: int) -> torch.Tensor:
        _check_coords(coords)
        sizes, steps = _int_triple(kernel_sizes, "kernel_sizes"), _int_triple(strides, "strides")
        if min(sizes) < 1:
            raise ValueError(f"kernel_sizes must be >= 1, got {sizes}")
        if isinstance(kernel_volume, bool) or not hasattr(kernel_volume, "__index__") or int(kernel_volume) < 0:
            raise ValueError(f"kernel_volume must be an integer >= 0, got {kernel_volume!r}")
        kernel_volume = int(kernel_volume)  # SPVNAS passes numpy's product
        keys = self._coord_keys(kernel_rows(coords, sizes, steps, kernel_volume))
        return self._lookup(keys, coords.shape[0])


class GPUHashTable(_HashTable):
    key_dtype = torch.int64


class GPUHashTable32(_HashTable):
    key_dtype = torch.int32
