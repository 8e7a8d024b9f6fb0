"""A kernel map seen from one convolution's direction."""
from dataclasses import dataclass

import torch

from ....kmap import KernelMap


@dataclass(frozen=True)
class OrientedMap:
    """Sources are the rows a conv reads, destinations the rows it writes.

    A forward conv reads the map's inputs and writes its outputs; a transposed conv reuses the
    same map the other way round.
    """
    kmap: KernelMap
    transposed: bool

    @property
    def num_src(self) -> int:
        return self.kmap.num_out if self.transposed else self.kmap.num_in

    @property
    def num_dst(self) -> int:
        return self.kmap.num_in if self.transposed else self.kmap.num_out

    def pairs(self, sorted_by: str = "any"):
        """``(src_idx, dst_idx, offsets, identity)`` of the weight-stationary view, sorted within
        each offset by destination ('dst'), by source ('src'), or as first built ('any')."""
        side = "out" if sorted_by == "any" else self.side(sorted_by)
        p = self.kmap.pairs_sorted_by(side)
        if self.transposed:
            return p.out_idx, p.in_idx, p.offsets, p.identity
        return p.in_idx, p.out_idx, p.offsets, p.identity

    def host_counts(self):
        """``(offsets, identity)`` of the weight-stationary view as host (CPU) tensors, read once
        when the view was built: what schedules that loop over the offsets on the host need,
        with no device read per call. The same for every sort order."""
        p = self.kmap.pairs_sorted_by("out")
        return p.host_offsets, p.host_identity

    def side(self, rows: str) -> str:
        """The map side ('out' or 'in') whose table has one row per destination ('dst') or source ('src')."""
        wants_out = (rows == "dst") != self.transposed
        return "out" if wants_out else "in"

    def table(self, rows: str) -> torch.Tensor:
        return self.kmap.table(self.side(rows))
