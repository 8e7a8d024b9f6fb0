"""Validation of the index structures the dataflow kernels follow: weight-stationary pair lists,
output-stationary tables and implicit-GEMM plans.

The GPU kernels (native CUDA and Triton) trust these: a bad index would fault the device or read
another tensor's memory, and a plan that misses a neighbour would drop it silently. The library
therefore validates each view of a kernel map once, when it builds and caches it (KernelMap, on
GPUs, for maps of the native CUDA builders; see kernel_map.validates_views; the CPU ops check
their arguments on every call anyway), and a conv call afterwards only launches kernels: no host
copy, no synchronisation, capturable in a CUDA graph.
``torchsparse_pp.backends.validate_plans = True`` makes the op wrappers of torchsparse_pp.ops
validate their arguments before every call (tests, debugging).

Every check is a vectorised torch op on the tensors' own device; the findings come back to the
host in one copy at the end (the one synchronisation of a validation). Messages are those of the
CPU ops' checks.
"""
from typing import List, Optional, Tuple

import torch

from ..host import mark_host, to_host

SORT_SIDES = (None, "src", "dst")


def _fail(message: str):
    raise RuntimeError(message)


def _per_offset(flags: torch.Tensor, segment: torch.Tensor, volume: int) -> torch.Tensor:
    """How many of the flagged items each offset holds ([volume], int64)."""
    return torch.zeros(volume, dtype=torch.int64, device=flags.device).index_add_(0, segment, flags.long())


def _repeats(idx: torch.Tensor, segment: torch.Tensor, size: int, volume: int) -> torch.Tensor:
    """Per offset, how many pairs repeat an index of an earlier pair of the same offset."""
    width = max(size, 1)
    keys = torch.sort(segment * width + idx.clamp(0, width - 1)).values
    same = keys[1:] == keys[:-1]
    return _per_offset(same, keys[1:] // width, volume)


def _descents(idx: torch.Tensor, segment: torch.Tensor, volume: int) -> torch.Tensor:
    """Per offset, how many pairs do not exceed the index of the pair before them."""
    bad = (segment[1:] == segment[:-1]) & (idx[1:] <= idx[:-1])
    return _per_offset(bad, segment[1:], volume)


def validate_pairs(src_idx: torch.Tensor, dst_idx: torch.Tensor, offsets: torch.Tensor, identity: torch.Tensor,
                   num_src: int, num_dst: int, sorted_by: Optional[str] = None,
                   unique_src: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """Checks weight-stationary pairs (the pairs of offset k are ``[offsets[k], offsets[k+1])``):
    offsets run from 0 to the number of pairs without decreasing, indices lie in
    ``[0, num_src)`` and ``[0, num_dst)``, an offset flagged ``identity`` pairs every row j with
    row j, and each offset names a destination at most once. ``sorted_by`` ('src' or 'dst')
    also requires that side to ascend strictly within each offset; ``unique_src`` requires each
    offset to name a source at most once (true of every kernel map).

    ``offsets`` and ``identity`` may be host (CPU) copies of device pairs. Raises RuntimeError
    naming the first problem; returns ``(offsets, identity)`` as CPU tensors, read in the same
    copy as the findings.
    """
    if sorted_by not in SORT_SIDES:
        raise ValueError(f"sorted_by must be one of {SORT_SIDES}, got {sorted_by!r}")
    if not (src_idx.dtype == dst_idx.dtype == torch.int32 and src_idx.dim() == 1 and src_idx.shape == dst_idx.shape):
        _fail("pair indices must be two int32 vectors of equal length")
    if identity.dtype != torch.bool or identity.dim() != 1:
        _fail(f"identity must be a bool vector of length K, got {identity.dtype} {list(identity.shape)}")
    volume = identity.shape[0]
    if offsets.dtype != torch.int64 or offsets.dim() != 1 or offsets.shape[0] != volume + 1:
        _fail(f"offsets must be an int64 vector of length K + 1 = {volume + 1}, got {list(offsets.shape)}")
    if src_idx.device != dst_idx.device:
        _fail(f"pair indices on different devices: {src_idx.device} and {dst_idx.device}")
    if num_dst < 0:
        _fail(f"num_dst must be >= 0, got {num_dst}")
    device, num_pairs = src_idx.device, src_idx.shape[0]
    off, ident = offsets.to(device), identity.to(device)
    src, dst = src_idx.long(), dst_idx.long()
    counts = off.diff()

    scalars = [off[0].ne(0) | off[volume].ne(num_pairs),
               src.lt(0).any() | src.ge(num_src).any(),
               dst.lt(0).any() | dst.ge(num_dst).any()]
    zero = torch.zeros(volume, dtype=torch.int64, device=device)
    identity_count = (ident & (counts.ne(num_src) | (num_src != num_dst))).long()
    identity_rows = dst_repeats = src_repeats = zero
    if volume and num_pairs:
        pair = torch.arange(num_pairs, device=device)
        # The offset of each pair (memory-safe whatever the offsets hold: clamped).
        segment = torch.searchsorted(off[1:], pair, right=True).clamp_(max=volume - 1)
        row = pair - off[segment]
        identity_rows = _per_offset(ident[segment] & (src.ne(row) | dst.ne(row)), segment, volume)
        dst_repeats = (_descents(dst, segment, volume) if sorted_by == "dst"
                       else _repeats(dst, segment, num_dst, volume))
        if sorted_by == "src":
            src_repeats = _descents(src, segment, volume)
        elif unique_src:
            src_repeats = _repeats(src, segment, num_src, volume)
    host = torch.cat([off, ident.long(), torch.stack(scalars).long(), identity_count, identity_rows, dst_repeats,
                      src_repeats])
    host = to_host(host)
    values: List[int] = host.tolist()
    host_offsets = mark_host(host[:volume + 1].clone())
    host_identity = mark_host(host[volume + 1:2 * volume + 1].bool())
    o = values[:volume + 1]
    bad_bounds, src_range, dst_range = values[2 * volume + 1:2 * volume + 4]
    per_k = [values[2 * volume + 4 + i * volume:2 * volume + 4 + (i + 1) * volume] for i in range(4)]
    identity_count, identity_rows, dst_repeats, src_repeats = per_k

    # Same order and messages as the CPU ops' check_pairs.
    if bad_bounds:
        _fail(f"offsets must start at 0 and end at the number of pairs ({num_pairs}), got {o[0]} and {o[volume]}")
    for k in range(volume):
        if o[k] > o[k + 1]:
            _fail(f"offsets must be non-decreasing, got offsets[{k}] = {o[k]} > offsets[{k + 1}] = {o[k + 1]}")
    if src_range:
        _fail(f"a source index is out of range [0, {num_src})")
    if dst_range:
        _fail(f"a destination index is out of range [0, {num_dst})")
    for k in range(volume):
        if identity_count[k]:
            _fail(f"identity[{k}] is set but offset {k} does not pair all {num_src} sources with as many destinations")
        if identity_rows[k]:
            _fail(f"identity[{k}] is set but offset {k} does not map every row j to row j")
    for k in range(volume):
        if dst_repeats[k]:
            if sorted_by == "dst":
                _fail(f"the pairs of offset {k} are not sorted by destination (unique, ascending), as kmap_pairs "
                      "returns them; fetch-on-demand needs that order")
            _fail(f"offset {k} pairs some destination row more than once; the pairs of one offset must name each "
                  "destination at most once (as kmap_pairs builds them)")
        if src_repeats[k]:
            _fail(f"offset {k} pairs some source row more than once" if sorted_by != "src" else
                  f"the pairs of offset {k} are not sorted by source (unique, ascending), as kmap_pairs returns them")
    return host_offsets, host_identity


def _table_findings(table: torch.Tensor, num_rows: int, num_src: int) -> torch.Tensor:
    rows = table[:num_rows]
    return (rows.lt(-1) | rows.ge(num_src)).sum()


def _check_table_shape(table: torch.Tensor, num_rows: int):
    if table.dtype != torch.int32 or table.dim() != 2:
        _fail(f"the map must be an int32 [rows, K] tensor, got {table.dtype} {list(table.shape)}")
    if not 0 <= num_rows <= table.shape[0]:
        _fail(f"num rows ({num_rows}) must be in [0, {table.shape[0]}]")


def validate_table(table: torch.Tensor, num_rows: int, num_src: int) -> None:
    """Checks an output-stationary table ``[rows >= num_rows, K]``: its first ``num_rows`` rows
    hold source rows in ``[-1, num_src)`` (-1: no neighbour)."""
    _check_table_shape(table, num_rows)
    bad = int(_table_findings(table, num_rows, num_src))
    if bad:
        _fail(f"the map has {bad} entries outside [-1, {num_src})")


# Elements of the [slots, K] neighbour masks formed at once while checking plan coverage.
_COVERAGE_CHUNK = 1 << 24


def validate_plan(table: torch.Tensor, num_rows: int, num_src: int, bounds: torch.Tensor, order: torch.Tensor,
                  tile_masks: torch.Tensor, tile_rows: int) -> None:
    """Checks an implicit-GEMM plan from kmap_plan against its table: the table's entries lie in
    ``[-1, num_src)``; ``bounds`` splits the K offsets into increasing ranges from 0 to K;
    ``order`` (sorted plans) lists every row once per split, -1 as padding; ``tile_masks``
    (``[splits, tiles, words]``) has the bit of every offset that a row of the plan tile has. Raises
    RuntimeError naming the first problem."""
    _check_table_shape(table, num_rows)
    volume = table.shape[1]
    if tile_rows < 1:
        _fail(f"tile_rows must be >= 1, got {tile_rows}")
    if bounds.dtype != torch.int64 or bounds.dim() != 1 or bounds.shape[0] < 2:
        _fail(f"bounds must be an int64 vector [splits + 1], got {bounds.dtype} {list(bounds.shape)}")
    splits = bounds.shape[0] - 1
    tiles = -(-num_rows // tile_rows)
    if tile_masks.dtype != torch.int64 or tile_masks.dim() != 3 or tuple(tile_masks.shape[:2]) != (splits, tiles) \
            or tile_masks.shape[2] < 1:
        _fail(f"tile_masks must be int64 [splits = {splits}, tiles = {tiles}, words], got {list(tile_masks.shape)}")
    is_sorted = order.numel() > 0
    if is_sorted and (order.dtype != torch.int32 or tuple(order.shape) != (splits, tiles * tile_rows)):
        _fail(f"order must be int32 [splits = {splits}, {tiles * tile_rows}], got {list(order.shape)}")
    for name, t in (("bounds", bounds), ("order", order), ("tile_masks", tile_masks)):
        if t.numel() and t.device != table.device:
            _fail(f"the plan's {name} is on {t.device} but the map is on {table.device}")
    device, words = table.device, tile_masks.shape[2]

    b = bounds
    widths = b.diff()
    bad_bounds = b[0].ne(0) | b[splits].ne(volume) | widths.le(0).any()
    too_narrow = widths.max().gt(words * 64)
    table_bad = _table_findings(table, num_rows, num_src)
    order_bad = torch.zeros((), dtype=torch.int64, device=device)
    rows_bad = torch.zeros((), dtype=torch.int64, device=device)
    slots = tiles * tile_rows
    if is_sorted:
        o = order.long()
        order_bad = (o.lt(-1) | o.ge(num_rows)).sum()
        listed = o.ge(0) & o.lt(num_rows)
        flat = (torch.arange(splits, device=device)[:, None] * num_rows + o.clamp(0, max(num_rows - 1, 0)))[listed]
        seen = torch.zeros(splits * num_rows, dtype=torch.int64, device=device).index_add_(
            0, flat, torch.ones_like(flat))
        rows_bad = seen.ne(1).sum()

    # Coverage: every neighbour's offset bit is set in the mask of its slot's plan tile.
    uncovered = torch.zeros((), dtype=torch.int64, device=device)
    if volume and slots:
        k = torch.arange(volume, device=device)
        split_of = torch.searchsorted(b[1:], k, right=True).clamp_(max=splits - 1)
        bit = (k - b[split_of]).clamp_(0, words * 64 - 1)
        word, shift = bit // 64, bit % 64
        tiles_per_chunk = max(1, _COVERAGE_CHUNK // (tile_rows * volume))
        for s in range(splits):
            in_split = split_of.eq(s)
            for t0 in range(0, tiles, tiles_per_chunk):
                t1 = min(tiles, t0 + tiles_per_chunk)
                slot = torch.arange(t0 * tile_rows, t1 * tile_rows, device=device)
                row = order[s, t0 * tile_rows:t1 * tile_rows].long() if is_sorted else torch.where(
                    slot < num_rows, slot, -1)
                valid = row.ge(0) & row.lt(num_rows)
                nbr = table[row.clamp(0, max(num_rows - 1, 0))] if num_rows else table.new_full((len(slot), volume), -1)
                present = nbr.ge(0) & valid[:, None] & in_split[None, :]
                masks = tile_masks[s, t0:t1][:, word]                      # [tiles, K]
                has = ((masks >> shift) & 1).bool().repeat_interleave(tile_rows, 0)  # [slots, K]
                uncovered = uncovered + (present & ~has).sum()
    found = torch.stack([bad_bounds.long(), too_narrow.long(), table_bad, order_bad, rows_bad, uncovered]).tolist()
    bad_bounds, too_narrow, table_bad, order_bad, rows_bad, uncovered = found
    if bad_bounds:
        _fail(f"bounds must increase from 0 to K = {volume}, got {b.tolist()}")
    if too_narrow:
        _fail(f"tile_masks has {words} 64-bit words per tile, too few for the widest split of {b.tolist()}")
    if table_bad:
        _fail(f"the map has {table_bad} entries outside [-1, {num_src})")
    if order_bad:
        _fail(f"the plan's order has {order_bad} entries outside [-1, {num_rows})")
    if rows_bad:
        _fail(f"the plan's order must list every row once per split; {rows_bad} (split, row) do not")
    if uncovered:
        _fail(f"the plan does not cover the map: {uncovered} neighbours have offsets their tile's mask lacks "
              "(a plan of another map?)")
