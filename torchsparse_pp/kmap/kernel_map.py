"""A kernel map between an input coordinate set P and an output set Q, with its two views."""
from dataclasses import dataclass
from typing import Optional

import torch

from .. import ops
from .geometry import ConvGeometry, Triple

# out_in rows are padded to this multiple (the largest CTA tile) so tiled kernels skip bounds checks.
OUT_IN_ROW_PADDING = 128


@dataclass(frozen=True)
class PairsView:
    """Weight-stationary view: the (in_idx, out_idx) pairs of offset k are
    ``[offsets[k], offsets[k+1])``, sorted by output row; each output appears once per offset."""
    in_idx: torch.Tensor
    out_idx: torch.Tensor
    offsets: torch.Tensor
    identity: torch.Tensor

    @property
    def pairs_per_offset(self) -> torch.Tensor:
        return self.offsets.diff()


class KernelMap:
    """``out_in[q, k]`` = row of P read by output q through offset k (-1 if none).

    ``mode`` says how Q was made: 'submanifold' (Q = P), 'spconv', 'minkowski' (strided output
    sets) or 'generative' (P is the generated fine set, Q the coarse input of a generative
    transposed conv). Transposed convs use the map with inputs and outputs swapped.
    """

    def __init__(self, in_coords: torch.Tensor, out_coords: torch.Tensor, geometry: ConvGeometry,
                 mode: str, out_in: torch.Tensor, in_range: Optional[Triple],
                 out_range: Optional[Triple], build_seconds: float):
        self.in_coords = in_coords
        self.out_coords = out_coords
        self.geometry = geometry
        self.mode = mode
        self.out_in = out_in
        self.in_range = in_range
        self.out_range = out_range
        self.build_seconds = build_seconds
        self._pairs: Optional[PairsView] = None

    @property
    def num_in(self) -> int:
        return self.in_coords.shape[0]

    @property
    def num_out(self) -> int:
        return self.out_coords.shape[0]

    @property
    def pairs(self) -> PairsView:
        if self._pairs is None:
            self._pairs = PairsView(*ops.kmap_pairs(self.out_in, self.num_in, self.num_out))
        return self._pairs

    def __repr__(self) -> str:
        g = self.geometry
        return (f"KernelMap(mode={self.mode}, k={g.kernel_size}, s={g.stride}, d={g.dilation}, "
                f"pad={g.padding}, {self.num_in} -> {self.num_out})")
