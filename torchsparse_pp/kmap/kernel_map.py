"""A kernel map between an input coordinate set P and an output set Q, with its two views."""
from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional, Set, Tuple

import torch

from .. import backends, ops
from ..host import host_views, mark_host, to_host
from ..ops.validate import validate_pairs, validate_plan, validate_table
from .dispatch import kmap_backend_for, kmap_ops
from .geometry import ConvGeometry, Triple

# out_in rows are padded to this multiple (the largest CTA tile) so tiled kernels skip bounds checks.
OUT_IN_ROW_PADDING = 128


class GeometryKey(NamedTuple):
    """A ConvGeometry's fields as a named tuple (what keys and maps keep)."""
    kernel_size: Triple
    stride: Triple
    dilation: Triple
    padding: Triple

    @staticmethod
    def of(geometry: ConvGeometry) -> "GeometryKey":
        return GeometryKey(geometry.kernel_size, geometry.stride, geometry.dilation, geometry.padding)


@dataclass
class PairsView:
    """Weight-stationary view: the (in_idx, out_idx) pairs of offset k are
    ``[offsets[k], offsets[k+1])``, sorted by output or input row; each output and each input
    appears once per offset. On the GPU path the lists may be longer than ``offsets[K]`` (room
    for every cell, so that no count is read to the host); entries past it are never read.

    ``host_offsets`` and ``host_identity`` are CPU copies of ``offsets`` and ``identity`` (the
    same tensors for maps the CPU path decides for), read from the device once, when first asked:
    schedules that loop over the offsets on the host (gather_scatter) read them, so no later call
    synchronises, and dataflows that read the counts on the device (fetch_on_demand,
    implicit_gemm) never cost the read. ``host`` holds them once read (validation brings them).

    (A plain dataclass, not a frozen one: torch.compile can rebuild it when a traced graph
    returns a cache that holds it.)
    """
    in_idx: torch.Tensor
    out_idx: torch.Tensor
    offsets: torch.Tensor
    identity: torch.Tensor
    host: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
    bounded: bool = False  # lists sized for every cell (kmap_pairs_bounded), the pairs first

    def _host(self) -> Tuple[torch.Tensor, torch.Tensor]:
        if self.host is None:
            if backends.decision_device_type(self.offsets.device) == "cpu":
                self.host = (self.offsets, self.identity)
            else:  # one read for both
                k = self.identity.numel()
                both = to_host(torch.cat([self.offsets, self.identity.to(self.offsets.dtype)]))
                offsets, identity = host_views(both, 0, k + 1, 2 * k + 1)
                self.host = (offsets, mark_host(identity.bool()))
        return self.host

    @property
    def host_offsets(self) -> torch.Tensor:
        return self._host()[0]

    @property
    def host_identity(self) -> torch.Tensor:
        return self._host()[1]

    def exact(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(in_idx, out_idx)`` holding the pairs only (for readers of whole lists: pooling); for
        bounded lists this reads their length to the host once."""
        if not self.bounded:
            return self.in_idx, self.out_idx
        total = int(self.host_offsets[-1])
        return self.in_idx[:total], self.out_idx[:total]

    @property
    def pairs_per_offset(self) -> torch.Tensor:
        return self.offsets.diff()

    @property
    def counts(self) -> List[int]:
        """Pairs per offset, from the host copy."""
        return self.host_offsets.diff().tolist()


def validates_views(device: torch.device, backend: str) -> bool:
    """Whether views of maps on ``device`` built by ``backend`` are validated when built (one host
    read each): on GPUs, whose kernels check nothing per call (the CPU ops check their arguments
    on every call), for maps of the native CUDA builders, which have not yet run on a GPU. Maps of
    the torch and Triton builders, equal to the native CPU maps in every mode (tests/test_kmap_*),
    are trusted, so a GPU forward reads nothing back for them. Never while torch.compile / export
    traces: validation reads its findings on the host, which a graph must not do.
    ``backends.validate_plans`` validates in the ops on every call, whatever built the map."""
    return (backends.decision_device_type(device) != "cpu" and backend == "native"
            and not torch.compiler.is_compiling())


class KernelMap:
    """``out_in[q, k]`` = row of P read by output q through offset k (-1 if none).

    ``mode`` says how Q was made: 'submanifold' (Q = P), 'spconv', 'minkowski' (strided output
    sets) or 'generative' (P is the generated fine set, Q the coarse input of a generative
    transposed conv). Transposed convs use the map with inputs and outputs swapped.

    ``backend`` names the kernel-map implementation that built it ('native', 'torch' or 'triton'; None
    asks ``backends.kmap_backend`` for out_in's device); its views are built by the same one.

    On GPUs every view (tables, pairs, plans) is validated once, on the device, when it is built
    (torchsparse_pp.ops.validate): the kernels that follow it check nothing per call, so conv
    calls over a cached map never synchronise.
    """

    def __init__(self, in_coords: torch.Tensor, out_coords: torch.Tensor, geometry: ConvGeometry,
                 mode: str, out_in: torch.Tensor, in_range: Optional[Triple],
                 out_range: Optional[Triple], build_seconds: float, backend: Optional[str] = None):
        self.in_coords = in_coords
        self.out_coords = out_coords
        # A named tuple, not the ConvGeometry: torch.compile can carry a map out of a graph.
        self._geometry = GeometryKey.of(geometry)
        self.mode = mode
        self.out_in = out_in
        self.in_range = in_range
        self.out_range = out_range
        self._build_seconds = build_seconds
        self.backend = kmap_backend_for(out_in.device) if backend is None else backend
        kmap_ops(self.backend)  # rejects an unknown name now rather than at the first view
        self._pairs: Dict[str, PairsView] = {}
        self._in_out: Optional[torch.Tensor] = None
        self._plans: Dict[Tuple[str, int, int, int], Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._validated_tables: Set[str] = set()
        self._row_groups: Dict[Tuple[str, int, int, int], Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    @property
    def build_seconds(self) -> float:
        """Seconds the build took (on a GPU read from CUDA events, which waits for the build)."""
        if callable(self._build_seconds):
            self._build_seconds = self._build_seconds()
        return self._build_seconds

    @property
    def geometry(self) -> ConvGeometry:
        return ConvGeometry(*self._geometry)

    @property
    def _ops(self):
        """The ops of the backend that built this map (its views come from them too)."""
        return kmap_ops(self.backend)

    @property
    def num_in(self) -> int:
        return self.in_coords.shape[0]

    @property
    def num_out(self) -> int:
        return self.out_coords.shape[0]

    @property
    def pairs(self) -> PairsView:
        """Pairs of each offset sorted by output row."""
        return self.pairs_sorted_by("out")

    @property
    def symmetric(self) -> bool:
        """Whether q reads p through offset k exactly when p reads q through offset K-1-k: a
        submanifold map (Q = P) of a centred kernel (odd size, padding d (k - 1) / 2, stride 1),
        as the builders make it. Its transposed views then follow from the direct ones."""
        g = self.geometry
        return self.mode == "submanifold" and all(
            s == 1 and k % 2 == 1 and 2 * p == d * (k - 1)
            for k, s, d, p in zip(g.kernel_size, g.stride, g.dilation, g.padding))

    def pairs_sorted_by(self, side: str) -> PairsView:
        """The same pairs, sorted within each offset by output row ('out') or input row ('in')."""
        if side not in self._pairs:
            if side == "out":
                ins, outs, offsets, identity = self._pairs_of(self.out_in, self.num_in, self.num_out)
            elif side == "in" and self.symmetric and not torch.compiler.is_compiling():
                out = self.pairs_sorted_by("out")
                on_host = backends.decision_device_type(out.offsets.device) == "cpu"
                ins, outs, offsets, identity = self._mirrored(out) if on_host else self._mirrored_on_device(out)
            elif side == "in" and self._out_sorted_by_in():
                out = self.pairs_sorted_by("out")
                ins, outs, offsets, identity = out.in_idx, out.out_idx, out.offsets, out.identity
            elif side == "in":
                # Pairs of the transposed table come sorted by input; swap back to map roles.
                outs, ins, offsets, identity = self._pairs_of(self.in_out, self.num_out, self.num_in)
            else:
                raise ValueError(f"side must be 'out' or 'in', got {side!r}")
            host = None
            if validates_views(offsets.device, self.backend):
                # One pass on the device; its single read to the host also brings the counts.
                host = validate_pairs(ins, outs, offsets, identity, self.num_in, self.num_out,
                                      sorted_by="dst" if side == "out" else "src", unique_src=True)
            self._pairs[side] = PairsView(ins, outs, offsets, identity, host, self._uses_bounded(ins.device))
        return self._pairs[side]

    def _out_sorted_by_in(self) -> bool:
        """Whether the pairs sorted by output are sorted by input as well within each offset, so
        that they are the input-sorted pairs too (each input appears once per offset, so that
        order is unique). A strided map over sorted coordinates is (input 2 o + d grows with
        output o at a fixed offset d): its transposed conv then reads the same arrays instead of
        kmap_transpose + kmap_pairs (~2-4 ms per MinkUNet 0.5x inference by the profiler).
        Checked on CPU maps only (the check reads its answer on the host)."""
        out = self.pairs_sorted_by("out")
        if backends.decision_device_type(out.in_idx.device) != "cpu" or torch.compiler.is_compiling():
            return False
        if out.in_idx.numel() < 2:
            return True
        rises = out.in_idx[1:] > out.in_idx[:-1]
        # A fall where offset k's pairs give way to offset k + 1's is allowed.
        starts = out.host_offsets[1:-1]
        starts = starts[(starts > 0) & (starts < out.in_idx.numel())]
        rises[starts - 1] = True
        return bool(rises.all())

    @staticmethod
    def _mirrored(out: PairsView) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """A symmetric map's ``(in_idx, out_idx, offsets, identity)`` sorted by input: offset k's
        pairs are offset K-1-k's sorted by output with the roles swapped (the arrays kmap_pairs
        makes of the transposed table, without building that table: 0.18 instead of 4.8 ms on a
        90k-row scan's 3x3x3 map)."""
        bounds = out.host_offsets.tolist()
        segments = [(bounds[k], bounds[k + 1]) for k in reversed(range(len(bounds) - 1))]
        in_idx = torch.cat([out.out_idx[a:b] for a, b in segments])
        out_idx = torch.cat([out.in_idx[a:b] for a, b in segments])
        offsets = torch.zeros_like(out.host_offsets)
        torch.cumsum(out.host_offsets.diff().flip(0), 0, out=offsets[1:])
        return in_idx, out_idx, offsets.to(out.offsets.device), out.identity.flip(0)

    @staticmethod
    def _mirrored_on_device(out: PairsView) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """_mirrored with no host read: each position of the mirrored lists finds its offset k by
        searchsorted and reads position ``p - new_offsets[k]`` of offset K-1-k's segment."""
        K = out.identity.numel()
        offsets = torch.zeros_like(out.offsets)
        torch.cumsum(out.offsets.diff().flip(0), 0, out=offsets[1:])
        position = torch.arange(out.in_idx.numel(), device=out.in_idx.device)
        k = torch.searchsorted(offsets[1:], position, right=True)
        source = out.offsets[K - 1 - k] + position - offsets[k]
        return out.out_idx[source], out.in_idx[source], offsets, out.identity.flip(0)

    @property
    def in_out(self) -> torch.Tensor:
        """Output-stationary view of the transposed map: ``in_out[p, k]`` = the output that reads
        input p through offset k (-1 if none), rows padded like ``out_in``."""
        if self._in_out is None:
            # A symmetric map's transpose is its own table with the offsets reversed (~20x faster).
            self._in_out = (self.out_in.flip(1).contiguous() if self.symmetric else
                            self._ops.kmap_transpose(self.out_in, self.num_out, self.num_in, OUT_IN_ROW_PADDING))
        return self._in_out

    def _uses_bounded(self, device) -> bool:
        """Whether this map's pair lists come from kmap_pairs_bounded (every view of one map takes
        the same branch, the mirrored and reused ones included)."""
        return (getattr(self._ops, "kmap_pairs_bounded", None) is not None
                and backends.decision_device_type(device) != "cpu" and not backends.validate_plans
                and not validates_views(device, self.backend) and not torch.compiler.is_compiling())

    def _pairs_of(self, table: torch.Tensor, num_in: int, num_out: int):
        """kmap_pairs of one table; on the GPU path, from a builder that offers it, the bounded
        form (lists with room for every cell, counts on the device: no host read), unless
        validation (which checks exact lengths) is asked for."""
        if self._uses_bounded(table.device):
            return self._ops.kmap_pairs_bounded(table, num_in, num_out)
        return self._ops.kmap_pairs(table, num_in, num_out)

    def _rows_and_sources(self, side: str) -> Tuple[int, int]:
        """(rows, source rows) of the table of ``side``: outputs and inputs for 'out'."""
        return (self.num_out, self.num_in) if side == "out" else (self.num_in, self.num_out)

    def table(self, side: str) -> torch.Tensor:
        """``out_in`` (rows are outputs, side 'out') or ``in_out`` (rows are inputs, side 'in')."""
        if side not in ("out", "in"):
            raise ValueError(f"side must be 'out' or 'in', got {side!r}")
        table = self.out_in if side == "out" else self.in_out
        if side not in self._validated_tables:
            if validates_views(table.device, self.backend):
                validate_table(table, *self._rows_and_sources(side))
            self._validated_tables.add(side)
        return table

    def plan(self, side: str, split_mask_num: int, tile_rows: int, sort_window: int = 0):
        """Cached implicit-GEMM plan ``(bounds, order, tile_masks)`` of one table (see kmap_plan)."""
        key = (side, split_mask_num, tile_rows, sort_window)
        if key not in self._plans:
            rows, sources = self._rows_and_sources(side)
            table = self.table(side)
            plan = self._ops.kmap_plan(table, rows, split_mask_num, tile_rows, sort_window)
            if validates_views(table.device, self.backend):
                validate_plan(table, rows, sources, *plan, tile_rows)
            self._plans[key] = plan
        return self._plans[key]

    def row_groups(self, side: str, split_mask_num: int, tile_rows: int, sort_window: int = 0):
        """Cached operands of the CPU implicit-GEMM register kernels for a plan (see
        ops.implicit_gemm_row_groups): built by the native op whichever backend built the map,
        since only the native CPU kernels read them."""
        key = (side, split_mask_num, tile_rows, sort_window)
        if key not in self._row_groups:
            rows = self._rows_and_sources(side)[0]
            self._row_groups[key] = ops.implicit_gemm_row_groups(self.table(side), rows,
                                                                 *self.plan(side, split_mask_num, tile_rows,
                                                                            sort_window), tile_rows)
        return self._row_groups[key]

    def __repr__(self) -> str:
        g = self.geometry
        return (f"KernelMap(mode={self.mode}, k={g.kernel_size}, s={g.stride}, d={g.dilation}, "
                f"pad={g.padding}, {self.num_in} -> {self.num_out}, backend={self.backend})")
