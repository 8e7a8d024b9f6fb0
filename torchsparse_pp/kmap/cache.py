"""Cache of kernel maps, shared by every tensor of one network pass.

A SparseTensor made by the user starts a cache; tensors derived from it (conv outputs, norms,
activations) share it by reference, so layers reuse maps with no user-supplied keys. Entries are
keyed by what defines a map: the identity of the input coordinate set and the geometry and mode.
"""
from typing import Callable, Dict, Iterator, List, NamedTuple, Optional, Tuple

import torch

from .geometry import ConvGeometry, Triple
from .kernel_map import GeometryKey, KernelMap


class KernelMapKey(NamedTuple):
    """What defines a map: the input coordinate set (its token in the cache), the geometry, the
    mode and the spatial range. Named tuples (no frozen dataclasses), so torch.compile can carry
    cache entries out of a graph."""
    coords_token: int
    geometry: GeometryKey
    mode: str
    spatial_range: Optional[Triple]

    @staticmethod
    def of(coords_token: int, geometry: ConvGeometry, mode: str, spatial_range: Optional[Triple]) -> "KernelMapKey":
        return KernelMapKey(coords_token, GeometryKey.of(geometry), mode, spatial_range)


class KernelMapCache:
    def __init__(self) -> None:
        # The coordinate tensors seen, in order: a tensor's token is its index (found by
        # identity; a network pass has a handful). No id(): torch.compile traces this code and
        # can carry these lists back to a cache that came in from outside the graph.
        self._coords: List[torch.Tensor] = []
        self._maps: Dict[KernelMapKey, KernelMap] = {}

    def token(self, coords: torch.Tensor) -> int:
        """A small integer naming this coordinate tensor (by identity, not by value)."""
        for token, known in enumerate(self._coords):
            if known is coords:
                return token
        self._coords.append(coords)
        return len(self._coords) - 1

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
