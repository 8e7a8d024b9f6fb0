"""Cache of kernel maps, shared by every tensor of one network pass.

A SparseTensor made by the user starts a cache; tensors derived from it (conv outputs, norms,
activations) share it by reference, so layers reuse maps with no user-supplied keys. Entries are
keyed by what defines a map: the identity of the input coordinate set and the geometry and mode.
"""
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, Optional, Tuple

import torch

from .geometry import ConvGeometry, Triple
from .kernel_map import KernelMap


@dataclass(frozen=True)
class KernelMapKey:
    coords_token: int
    geometry: ConvGeometry
    mode: str
    spatial_range: Optional[Triple]


class KernelMapCache:
    def __init__(self) -> None:
        # id(tensor) -> (token, tensor); holding the tensor keeps its id from being reused.
        self._coords: Dict[int, Tuple[int, torch.Tensor]] = {}
        self._maps: Dict[KernelMapKey, KernelMap] = {}

    def token(self, coords: torch.Tensor) -> int:
        """A small integer naming this coordinate tensor (by identity, not by value)."""
        entry = self._coords.get(id(coords))
        if entry is None or entry[1] is not coords:
            entry = (len(self._coords), coords)
            self._coords[id(coords)] = entry
        return entry[0]

    def kernel_map(self, key: KernelMapKey, build: Callable[[], KernelMap]) -> KernelMap:
        kmap = self._maps.get(key)
        if kmap is None:
            kmap = build()
            self._maps[key] = kmap
        return kmap

    def maps(self) -> Iterator[Tuple[KernelMapKey, KernelMap]]:
        return iter(self._maps.items())

    def clear(self) -> None:
        self._coords.clear()
        self._maps.clear()

    def __len__(self) -> int:
        return len(self._maps)
