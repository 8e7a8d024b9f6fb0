"""Kernel-map builders and views in plain torch tensor ops: they run on any device.

Twins of the compiled ops wrapped in ``torchsparse_pp.ops.kmap`` (same signatures; results equal
element for element, dtype and shape included; same checks and messages). The compiled CPU ops
(csrc/cpu/kmap_*.cpp) define the semantics; this module reaches them with sort, unique,
searchsorted, nonzero and scatter, so it needs no kernels of its own. Per-row work is
vectorised; Python loops run over kernel offsets, mask words or splits only. Host syncs are the
sizes of nonzero / unique results and one flag per check.

Errors are ``RuntimeError`` with the compiled ops' messages, raised in the same order (so for
the same first problem), before anything large is allocated: row counts past 2^31 - 1, stride,
dilation or padding past 2^20, inputs outside the packable range or repeated.
"""
import functools
import operator
import os
from typing import List, Optional, Sequence, Tuple

import torch

Tensors2 = Tuple[torch.Tensor, torch.Tensor]
Tensors3 = Tuple[torch.Tensor, torch.Tensor, torch.Tensor]

# Packing of csrc/common/coords.h: 15 bits of batch, 16 signed bits per spatial axis.
BATCH_MAX = (1 << 15) - 1
SPATIAL_MIN = -(1 << 15)
SPATIAL_MAX = (1 << 15) - 1
MAX_KERNEL_AXIS = 32  # csrc/common/kernel_geometry.h
INT32_MAX = (1 << 31) - 1
# Per-axis bound of stride, dilation and padding (kmap_common.h kMaxGeometryValue).
GEOMETRY_VALUE_MAX = 1 << 20
# Elements per temporary [rows, offsets] block of the submanifold search (bounds memory).
SEARCH_BLOCK = 1 << 24
# Bytes per (kernel tap, input) while strided / generative candidates are formed: int64 keys,
# the validity masks, the nonzero indices and the selected keys, rows and offsets.
CANDIDATE_BYTES = 48
# Bytes per pair while the pair lists are formed: the int64 (offset, row) indices of nonzero and
# the int32 in / out rows.
PAIR_BYTES = 24

RANGE_TEXT = f"batch in [0, {BATCH_MAX}], x/y/z in [{SPATIAL_MIN}, {SPATIAL_MAX}]"
UNIQUE_HINT = (": the coordinates of a SparseTensor must be unique "
               "(torchsparse_pp.utils.sparse_quantize removes duplicates)")


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise RuntimeError(message)


MEMORY_LIMIT_VARIABLE = "TSPP_MEMORY_LIMIT_BYTES"
# Below this size the memory checks read nothing (no /proc read per map build), unless
# TSPP_MEMORY_LIMIT_BYTES is set: as check_memory in csrc/cpu/checks_cpu.cpp.
UNCHECKED_BYTES = 64 << 20


def _memory_limit_override() -> int:
    """TSPP_MEMORY_LIMIT_BYTES as a byte count (a test hook, also a way to make a job fail fast
    below the machine's memory); -1 when unset. Read by the native checks alike."""
    text = os.environ.get(MEMORY_LIMIT_VARIABLE, "")
    if text == "":
        return -1
    _check(len(text) <= 18 and all("0" <= ch <= "9" for ch in text),
           f"{MEMORY_LIMIT_VARIABLE} must be a number of bytes (digits only, at most 18), got '{text}'")
    return int(text)


def _measured_available_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type != "cpu":
        return -1
    available = -1
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            used = int(f.read().strip())
        if limit != "max":
            left = max(int(limit) - used, 0)
            available = left if available < 0 else min(available, left)
    except (OSError, ValueError):
        pass
    return available


def _available_memory(device: torch.device) -> int:
    """Bytes this process may still allocate on ``device`` (CPU: MemAvailable capped by the cgroup
    limit, as csrc/cpu/checks_cpu.cpp reads them; CUDA: the free device memory), capped by
    TSPP_MEMORY_LIMIT_BYTES when set; -1 when unknown."""
    measured, cap = _measured_available_memory(device), _memory_limit_override()
    if cap < 0:
        return measured
    return cap if measured < 0 else min(measured, cap)


def _format_bytes(n: int) -> str:
    return f"{n / 2 ** 30:.2f} GiB ({n} bytes)"


def _memory_checked(bytes_at_most: int) -> bool:
    """Whether an allocation of up to ``bytes_at_most`` is checked at all."""
    return bytes_at_most >= UNCHECKED_BYTES or _memory_limit_override() >= 0


def _check_memory(needed: int, what: str, device: torch.device) -> None:
    """RuntimeError before an allocation that cannot fit (the compiled ops' check_memory)."""
    cap = _memory_limit_override()
    if cap < 0 and needed < UNCHECKED_BYTES:
        return
    measured = _measured_available_memory(device)
    capped = cap >= 0 and (measured < 0 or cap <= measured)
    available = cap if capped else measured
    if 0 <= available < needed:
        source = MEMORY_LIMIT_VARIABLE if capped else (
            "the free device memory" if device.type == "cuda" else "MemAvailable and the cgroup limit")
        raise RuntimeError(f"{what} needs {_format_bytes(needed)}, but only {_format_bytes(available)} are "
                           f"available ({source}): refused before allocating")


# --- arguments -----------------------------------------------------------------------------------
def _ints(values: Sequence[int]) -> List[int]:
    return [operator.index(v) for v in values]


class _Geometry:
    """Per-axis kernel size, stride, dilation and padding, checked like make_geometry."""

    def __init__(self, kernel_size, stride, dilation, padding):
        ks, st, dil, pad = _ints(kernel_size), _ints(stride), _ints(dilation), _ints(padding)
        _check(len(ks) == 3 and len(st) == 3 and len(dil) == 3 and len(pad) == 3,
               "kernel_size, stride, dilation and padding must have 3 entries (x, y, z)")
        for a in range(3):
            _check(1 <= ks[a] <= MAX_KERNEL_AXIS, f"kernel_size must be in [1, {MAX_KERNEL_AXIS}] per axis, got {ks}")
            _check(st[a] >= 1, f"stride must be >= 1 per axis, got {st}")
            _check(dil[a] >= 1, f"dilation must be >= 1 per axis, got {dil}")
            _check(pad[a] >= 0, f"padding must be >= 0 per axis, got {pad}")
        for a in range(3):
            for name, values in (("stride", st), ("dilation", dil), ("padding", pad)):
                _check(values[a] <= GEOMETRY_VALUE_MAX, f"{name} must be at most 2^20 = {GEOMETRY_VALUE_MAX} per "
                       f"axis (coordinates span 2^16), got {values}")
        self.k, self.s, self.d, self.pad = ks, st, dil, pad
        self.volume = ks[0] * ks[1] * ks[2]


# ATen's names of scalar types, so that messages read like the compiled ops'.
_ATEN_NAMES = {torch.uint8: "Byte", torch.int8: "Char", torch.int16: "Short", torch.int32: "Int",
               torch.int64: "Long", torch.float16: "Half", torch.bfloat16: "BFloat16", torch.float32: "Float",
               torch.float64: "Double", torch.bool: "Bool"}


def _dtype_name(dtype: torch.dtype) -> str:
    return _ATEN_NAMES.get(dtype, str(dtype))


def _check_rows(n: int, what: str) -> None:
    """kmap_common.h check_rows: rows are indexed with int32."""
    _check(n <= INT32_MAX, f"{what} has {n} rows; at most 2^31 - 1 = {INT32_MAX} are supported "
           "(rows are indexed with int32)")


def _check_coord_rows(coords: torch.Tensor, name: str) -> None:
    """kmap_common.h check_coord_rows: the rows of an int32 [N, 4] tensor, before any copy."""
    if coords.dtype == torch.int32 and coords.dim() == 2 and coords.shape[1] == 4:
        _check_rows(coords.shape[0], name)


def _checked_coords(coords: torch.Tensor, name: str) -> torch.Tensor:
    _check(coords.dtype == torch.int32, f"{name} must be int32 (batch, x, y, z), got {_dtype_name(coords.dtype)}")
    _check(coords.dim() == 2 and coords.shape[1] == 4,
           f"{name} must have shape [N, 4] (batch, x, y, z), got {list(coords.shape)}")
    _check_rows(coords.shape[0], name)  # before the copy (as hash_cpu.cpp checked_coords)
    return coords.contiguous()


def _padded_rows(n: int, pad_rows_to: int) -> int:
    _check(pad_rows_to >= 1, f"pad_rows_to must be >= 1, got {pad_rows_to}")
    return (n + pad_rows_to - 1) // pad_rows_to * pad_rows_to


def _checked_range(out_range: Optional[Sequence[int]]) -> Optional[List[int]]:
    if out_range is None:
        return None
    values = _ints(out_range)
    _check(len(values) == 3, f"out_range must have 3 entries, got {values}")
    _check(min(values) >= 1, f"out_range must be positive, got {values}")
    return values


def _checked_minkowski_mode(mode: str, out_range) -> bool:
    _check(mode in ("spconv", "minkowski"), f"unknown downsample mode '{mode}'; expected 'spconv' or 'minkowski'")
    minkowski = mode == "minkowski"
    _check(not (minkowski and out_range is not None),
           "out_range does not apply to the minkowski output set (floor(p/s) needs no clip)")
    return minkowski


def _check_table_shape(table: torch.Tensor, num_rows: int, K: int, num_src: int) -> None:
    """The part of check_table that reads no data: an int32 [rows >= num_rows, K] map."""
    _check(table.dtype == torch.int32 and table.dim() == 2 and table.shape[1] == K and table.is_contiguous(),
           f"the map must be a contiguous int32 [rows, K = {K}] tensor, got {_dtype_name(table.dtype)} "
           f"{list(table.shape)}")
    _check(0 <= num_rows <= table.shape[0], f"num rows ({num_rows}) must be in [0, {table.shape[0]}]")
    _check_rows(num_rows, "the map (num rows)")
    _check_rows(num_src, "the map's source (num_src)")


def _check_table(table: torch.Tensor, num_rows: int, K: int, num_src: int) -> None:
    """csrc/cpu/checks_cpu.cpp check_table: an int32 [rows >= num_rows, K] map, entries in [-1, num_src)."""
    _check_table_shape(table, num_rows, K, num_src)
    if num_rows > 0:
        head = table[:num_rows]
        # One host sync for both bounds.
        outside = torch.stack([head.min() < -1, head.max() >= num_src]).any()
        _check(not bool(outside), f"the map holds a row index outside [-1, {num_src})")


# --- packed keys ---------------------------------------------------------------------------------
def _pack(b: torch.Tensor, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Packed int64 key of in-range int64 fields (coords.h pack_coord); broadcasts."""
    return (b << 48) | ((x - SPATIAL_MIN) << 32) | ((y - SPATIAL_MIN) << 16) | (z - SPATIAL_MIN)


def _unpack(keys: torch.Tensor) -> torch.Tensor:
    """[M, 4] int32 coordinates of packed keys."""
    fields = [keys >> 48, ((keys >> 32) & 0xFFFF) + SPATIAL_MIN, ((keys >> 16) & 0xFFFF) + SPATIAL_MIN,
              (keys & 0xFFFF) + SPATIAL_MIN]
    return torch.stack(fields, 1).to(torch.int32)


def _row_text(coords: torch.Tensor, row: int) -> str:
    return "(" + ", ".join(str(int(v)) for v in coords[row].tolist()) + ")"


def _spatial_ok(v: torch.Tensor) -> torch.Tensor:
    return (v >= SPATIAL_MIN) & (v <= SPATIAL_MAX)


def _batch_ok(b: torch.Tensor) -> torch.Tensor:
    return (b >= 0) & (b <= BATCH_MAX)


def _first_true(mask: torch.Tensor) -> int:
    """Index of the first True of a flattened bool tensor that has one."""
    return int(torch.argmax(mask.reshape(-1).to(torch.int32)))


def _pack_checked(coords: torch.Tensor, name: str) -> torch.Tensor:
    """Packed keys; raises for the first row outside the packable range (pack_coords_cpu)."""
    c = coords.to(torch.int64)
    ok = _batch_ok(c[:, 0]) & _spatial_ok(c[:, 1:]).all(1)
    if not bool(ok.all()):
        row = _first_true(~ok)
        raise RuntimeError(f"{name} row {row} = {_row_text(coords, row)} is outside the supported coordinate "
                           f"range: {RANGE_TEXT}")
    return _pack(c[:, 0], c[:, 1], c[:, 2], c[:, 3])


def _sorted_unique_keys(coords: torch.Tensor) -> Tensors2:
    """(keys ascending, the row of each): sort_coords_checked, duplicates named by their rows."""
    n = coords.shape[0]
    _check(n <= INT32_MAX, f"at most 2^31-1 coordinates are supported, got {n}")
    keys, rows = torch.sort(_pack_checked(coords, "coords"), stable=True)
    if n > 1:
        repeats = keys[1:] == keys[:-1]
        if bool(repeats.any()):
            # The first repeat in key order; stable, so its rows ascend.
            i = _first_true(repeats)
            a, b = int(rows[i]), int(rows[i + 1])
            raise RuntimeError(f"duplicate coordinate {_row_text(coords, b)} at rows {a} and {b}{UNIQUE_HINT}")
    return keys, rows


# --- candidates: what each input reaches (kmap_strided_cpu.cpp) ----------------------------------
_READ_BY, _FLOOR, _WRITES = "read_by", "floor", "writes"


def _axis_reach(p: torch.Tensor, g: _Geometry, a: int, relation: str, out_range: Optional[List[int]]):
    """Per tap and input p (int64 [N]): the coordinate reached on axis a, whether the tap reaches
    one (inside out_range when given), and whether it is packable. Shapes [taps, N]."""
    s, d, pad = g.s[a], g.d[a], g.pad[a]
    if relation == _FLOOR:
        q = torch.div(p, s, rounding_mode="floor").unsqueeze(0)
        valid = torch.ones_like(q, dtype=torch.bool)
    else:
        taps = torch.arange(g.k[a], device=p.device, dtype=torch.int64).unsqueeze(1)
        if relation == _WRITES:  # p*s - pad + t*d
            q = (p * s - pad) + taps * d
            valid = torch.ones_like(q, dtype=torch.bool)
        else:  # outputs q with q*s - pad + t*d = p
            numerator = p + (pad - taps * d)
            valid = torch.remainder(numerator, s) == 0
            q = torch.div(numerator, s, rounding_mode="floor")
    if out_range is not None:
        valid &= (q >= 0) & (q < out_range[a])
    return q, valid, _spatial_ok(q)


def _candidates(coords: torch.Tensor, g: _Geometry, relation: str, out_range: Optional[List[int]],
                strict: bool) -> Tensors3:
    """(keys, rows, offsets) of every coordinate the inputs reach, in (offset, row) order.

    With ``strict`` an unpackable coordinate is an error naming the smallest such input row;
    otherwise it is dropped (it cannot match an existing coordinate)."""
    c = coords.to(torch.int64)
    n = c.shape[0]
    taps = 1 if relation == _FLOOR else g.volume
    _check_memory(taps * n * CANDIDATE_BYTES, f"the kernel map's candidate list ({taps * n} (input, kernel offset) "
                  f"pairs of {n} inputs and {taps} offsets)", coords.device)
    (qx, vx, ox), (qy, vy, oy), (qz, vz, oz) = (_axis_reach(c[:, 1 + a], g, a, relation, out_range)
                                                for a in range(3))

    def grid(x, y, z, op):  # [tx, N], [ty, N], [tz, N] -> [tx*ty*tz, N], z fastest
        return op(op(x[:, None, None], y[None, :, None]), z[None, None, :]).reshape(taps, n)

    valid = grid(vx, vy, vz, torch.logical_and)
    packable = grid(ox, oy, oz, torch.logical_and) & _batch_ok(c[:, 0])
    if strict:
        bad = valid & ~packable
        if bool(bad.any()):
            row = _first_true(bad.any(0))
            raise RuntimeError(f"input row {row} produces an output coordinate outside the supported range: "
                               f"{RANGE_TEXT}")
    else:
        valid &= packable
    # Clamped fields pack without overflow; unpackable candidates are masked out below.
    x_part = ((qx.clamp(SPATIAL_MIN, SPATIAL_MAX) - SPATIAL_MIN) << 32) + (c[:, 0].clamp(0, BATCH_MAX) << 48)
    y_part = (qy.clamp(SPATIAL_MIN, SPATIAL_MAX) - SPATIAL_MIN) << 16
    z_part = qz.clamp(SPATIAL_MIN, SPATIAL_MAX) - SPATIAL_MIN
    keys = grid(x_part, y_part, z_part, torch.add)
    flat = torch.nonzero(valid.reshape(-1)).squeeze(1)
    return keys.reshape(-1)[flat], flat % n, torch.div(flat, n, rounding_mode="floor")


def _check_out_rows(m: int) -> None:
    _check_rows(m, "the new coordinate set")


# --- builders --------------------------------------------------------------------------------------
def kmap_submanifold(coords: torch.Tensor, kernel_size: Sequence[int], dilation: Sequence[int],
                     padding: Sequence[int], pad_rows_to: int) -> torch.Tensor:
    """Submanifold map ``out_in`` (outputs = ``coords``, stride 1), rows padded with -1 to
    ``pad_rows_to``. Raises for duplicate coordinates."""
    coords = _checked_coords(coords, "coords")
    g = _Geometry(kernel_size, (1, 1, 1), dilation, padding)
    n, K = coords.shape[0], g.volume
    # The table, the search table (as large again) and the sorted keys and rows.
    _check_memory(_padded_rows(n, pad_rows_to) * K * 4 + (n * K + 1) * 4 + n * 24,
                  f"the submanifold kernel map ({n} rows x {K} kernel offsets, int32)", coords.device)
    keys, rows = _sorted_unique_keys(coords)
    out_in = torch.full((_padded_rows(n, pad_rows_to), K), -1, dtype=torch.int32, device=coords.device)
    if n == 0:
        return out_in
    # Offset k moves (x, y, z) by t*d - pad per axis. Moves beyond the whole range never land in
    # it, so clipping them keeps the key arithmetic far from int64 overflow.
    span = 2 * (SPATIAL_MAX - SPATIAL_MIN + 1)
    moves = [[max(-span, min(span, t * g.d[a] - g.pad[a])) for t in range(g.k[a])] for a in range(3)]
    device = coords.device
    shifts = torch.tensor([[mx, my, mz] for mx in moves[0] for my in moves[1] for mz in moves[2]],
                          dtype=torch.int64, device=device)
    deltas = (shifts[:, 0] << 32) + (shifts[:, 1] << 16) + shifts[:, 2]
    fields = torch.stack([((keys >> 32) & 0xFFFF), ((keys >> 16) & 0xFFFF), keys & 0xFFFF], 1) + SPATIAL_MIN
    # A neighbour counts only if no shifted field leaves the range (a carry would alias another
    # key). Usually every point is far enough from the limits that no move can leave it.
    bounds = torch.cat([fields.amin(0), fields.amax(0)]).tolist()
    near_limits = any(bounds[a] + min(moves[a]) < SPATIAL_MIN or bounds[3 + a] + max(moves[a]) > SPATIAL_MAX
                      for a in range(3))
    # A centred kernel's map is symmetric: q reads p through offset k exactly when p reads q
    # through K-1-k. Search the offsets before the centre and mirror them.
    symmetric = all(g.k[a] % 2 == 1 and 2 * g.pad[a] == g.d[a] * (g.k[a] - 1) for a in range(3))
    searched = K // 2 if symmetric else K
    # Keys centred on 0 (same order): adding a clipped move can no longer overflow int64.
    centred = keys - (1 << 62)
    rows32 = rows.to(torch.int32)
    # Rows in key order; the extra last cell absorbs the mirrored writes of misses.
    cells = torch.full((n * K + 1,), -1, dtype=torch.int32, device=device)
    table = cells[:n * K].view(n, K)
    mirrored_column = K - 1 - torch.arange(K, device=device, dtype=torch.int64)
    block = max(1, SEARCH_BLOCK // n)
    for k0 in range(0, searched, block):
        k1 = min(searched, k0 + block)
        query = centred.unsqueeze(1) + deltas[k0:k1]
        at = torch.searchsorted(centred, query).clamp_(max=n - 1)
        found = centred[at] == query
        if near_limits:
            found &= _spatial_ok(fields.unsqueeze(1) + shifts[k0:k1]).all(2)
        table[:, k0:k1] = torch.where(found, rows32[at], -1)
        if symmetric:
            target = torch.where(found, at * K + mirrored_column[k0:k1], n * K)
            cells.index_put_((target.reshape(-1),), rows32.unsqueeze(1).expand(n, k1 - k0).reshape(-1))
    if symmetric:
        table[:, K // 2] = rows32
    out_in.index_copy_(0, rows, table)
    return out_in


def kmap_downsample(coords: torch.Tensor, kernel_size: Sequence[int], stride: Sequence[int],
                    dilation: Sequence[int], padding: Sequence[int], mode: str,
                    out_range: Optional[Sequence[int]], pad_rows_to: int) -> Tensors2:
    """Strided conv map ``(out_coords, out_in)``; output set 'spconv' (clipped to ``[0,
    out_range)`` when given) or 'minkowski', sorted by packed key. Every input must be
    packable and unique (also those whose outputs are clipped, or in range only after the
    division)."""
    _check_coord_rows(coords, "coords")
    coords = _checked_coords(coords, "coords")
    g = _Geometry(kernel_size, stride, dilation, padding)
    minkowski = _checked_minkowski_mode(mode, out_range)
    clip = _checked_range(out_range)
    K = g.volume
    _sorted_unique_keys(coords)
    keys, rows, offsets = _candidates(coords, g, _READ_BY, clip, strict=not minkowski)
    if minkowski:
        floor_keys = _candidates(coords, g, _FLOOR, None, strict=True)[0]
        out_keys = torch.unique(floor_keys, sorted=True)
        at = torch.searchsorted(out_keys, keys)
        if out_keys.numel() > 0:
            joined = out_keys[at.clamp(max=out_keys.numel() - 1)] == keys
        else:
            joined = torch.zeros_like(keys, dtype=torch.bool)
        rows, offsets, out_rows = rows[joined], offsets[joined], at[joined]
    else:
        out_keys, out_rows = torch.unique(keys, sorted=True, return_inverse=True)
    _check_out_rows(out_keys.numel())
    out_coords = _unpack(out_keys)
    out_in = torch.full((_padded_rows(out_keys.numel(), pad_rows_to), K), -1, dtype=torch.int32,
                        device=coords.device)
    cells = out_rows * K + offsets
    out_in.view(-1)[cells] = rows.to(torch.int32)
    # An (output, offset) cell determines its input coordinate: fewer filled cells than claims
    # means two inputs share a coordinate.
    if int((out_in >= 0).sum()) != cells.numel():
        _raise_duplicate_claim(cells, rows)
    return out_coords, out_in


def _raise_duplicate_claim(cells: torch.Tensor, rows: torch.Tensor) -> None:
    """The compiled op's report: the smallest row that is not its cell's first claimant."""
    # Within one offset (so within one cell) claims come in ascending row order; a stable sort
    # keeps that order.
    ordered, perm = torch.sort(cells, stable=True)
    claimants = rows[perm]
    repeat = ordered[1:] == ordered[:-1]
    row = int(claimants[1:][repeat].min())
    raise RuntimeError(f"duplicate coordinate at row {row}{UNIQUE_HINT}")


def kmap_generative(coords: torch.Tensor, kernel_size: Sequence[int], stride: Sequence[int],
                    dilation: Sequence[int], padding: Sequence[int], out_range: Optional[Sequence[int]],
                    pad_rows_to: int) -> Tensors2:
    """Generative transposed conv map ``(fine_coords, out_in)``: ``out_in`` has one row per
    coarse input and holds rows of the sorted fine set."""
    _check_coord_rows(coords, "coords")
    coords = _checked_coords(coords, "coords")
    g = _Geometry(kernel_size, stride, dilation, padding)
    clip = _checked_range(out_range)
    K, n = g.volume, coords.shape[0]
    _sorted_unique_keys(coords)  # duplicates in the coarse set would double their fine sites
    keys, rows, offsets = _candidates(coords, g, _WRITES, clip, strict=True)
    fine_keys, fine_rows = torch.unique(keys, sorted=True, return_inverse=True)
    _check_out_rows(fine_keys.numel())
    out_in = torch.full((_padded_rows(n, pad_rows_to), K), -1, dtype=torch.int32, device=coords.device)
    out_in.view(-1)[rows * K + offsets] = fine_rows.to(torch.int32)
    return _unpack(fine_keys), out_in


# --- views -------------------------------------------------------------------------------------------
def _check_pairs_arguments(out_in: torch.Tensor, num_in: int, num_out: int) -> None:
    """kmap_pairs' checks of its arguments (shape and dtype; no data read)."""
    _check(out_in.dtype == torch.int32 and out_in.dim() == 2,
           f"out_in must be an int32 [rows, K] map, got {_dtype_name(out_in.dtype)} {list(out_in.shape)}")
    _check(num_in >= 0 and num_out >= 0, f"num_in and num_out must be >= 0, got {num_in} and {num_out}")
    _check_rows(num_in, "num_in")
    _check_rows(num_out, "num_out")
    _check(num_out <= out_in.shape[0], f"num_out ({num_out}) exceeds the rows of out_in ({out_in.shape[0]})")


def kmap_pairs(out_in: torch.Tensor, num_in: int, num_out: int
               ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Weight-stationary view ``(in_idx, out_idx, offsets, identity)``: pairs ordered by offset,
    then output row; ``identity[k]`` when offset k maps every row j to row j."""
    _check_pairs_arguments(out_in, num_in, num_out)
    K, device = out_in.shape[1], out_in.device
    head = out_in[:num_out]
    if num_out > 0 and K > 0:
        _check(not bool(head.max() >= num_in), f"out_in holds input rows >= num_in ({num_in})")
    present = (head >= 0).t()  # [K, num_out]: nonzero walks offsets, then rows
    if _memory_checked(K * num_out * PAIR_BYTES):
        total = int(present.sum())
        _check_memory(total * PAIR_BYTES, f"the kernel map's pair lists ({total} (input, output) pairs over {K} "
                      "kernel offsets, int32)", device)
    k, r = torch.nonzero(present).unbind(1)
    in_idx = head[r, k]
    out_idx = r.to(torch.int32)
    offsets = torch.zeros(K + 1, dtype=torch.int64, device=device)
    offsets[1:] = present.sum(1).cumsum(0)
    if num_in == num_out and num_out > 0:
        # Each row appears at most once per offset: offset k is the identity when all num_out
        # of its pairs read their own row.
        own_row = torch.zeros(K, dtype=torch.int64, device=device).scatter_add_(0, k, (in_idx == r).to(torch.int64))
        identity = own_row == num_out
    else:
        identity = torch.zeros(K, dtype=torch.bool, device=device)
    return in_idx, out_idx, offsets, identity


def kmap_transpose(out_in: torch.Tensor, num_out: int, num_in: int, pad_rows_to: int) -> torch.Tensor:
    """``in_out[p, k] = q`` wherever ``out_in[q, k] = p``, rows padded to ``pad_rows_to``."""
    _check(out_in.dim() == 2, f"out_in must be [rows, K], got {list(out_in.shape)}")
    K = out_in.shape[1]
    _check_table(out_in, num_out, K, num_in)
    _check(pad_rows_to >= 1, f"pad_rows_to must be >= 1, got {pad_rows_to}")
    rows = (num_in + pad_rows_to - 1) // pad_rows_to * pad_rows_to
    in_out = torch.full((rows, K), -1, dtype=torch.int32, device=out_in.device)
    head = out_in[:num_out]
    q, k = torch.nonzero(head >= 0).unbind(1)
    in_out.view(-1)[head[q, k].to(torch.int64) * K + k] = q.to(torch.int32)
    # Within one offset an input feeds at most one output; a second claim means a corrupt map.
    _check(int((in_out >= 0).sum()) == q.numel(), "kmap_transpose: an input is read twice through one offset")
    return in_out


def _plan_shape(K: int, num_rows: int, split_mask_num: int, tile_rows: int, sort_window: int):
    """csrc/cpu/kmap_common.h plan_shape: (sorted, splits, window, words, tiles, bounds)."""
    _check(0 <= split_mask_num <= K, f"split_mask_num must be in [0, K = {K}], got {split_mask_num}")
    _check(tile_rows >= 1, f"tile_rows must be >= 1, got {tile_rows}")
    _check(sort_window >= 0, f"sort_window must be >= 0, got {sort_window}")
    is_sorted = split_mask_num > 0
    splits = split_mask_num if is_sorted else 1
    window = sort_window if sort_window > 0 else max(num_rows, 1)
    bounds = [s * K // splits for s in range(splits + 1)]
    longest = max(bounds[s + 1] - bounds[s] for s in range(splits))
    words = (longest + 63) // 64
    tiles = (num_rows + tile_rows - 1) // tile_rows
    return is_sorted, splits, window, words, tiles, bounds


@functools.lru_cache(maxsize=64)
def _bit_values(device) -> torch.Tensor:
    """2^j for j < 64 as int64 (bit 63 is the sign bit); one tensor per device, read only."""
    return torch.tensor([1 << j if j < 63 else -(1 << 63) for j in range(64)], dtype=torch.int64, device=device)


def _pack_bits(bits: torch.Tensor, words: int, bit_values: torch.Tensor) -> torch.Tensor:
    """[..., nbits] bool -> [..., words] int64, bit j of word w = bits[..., 64w + j]."""
    nbits = bits.shape[-1]
    if nbits < words * 64:
        bits = torch.cat([bits, bits.new_zeros(*bits.shape[:-1], words * 64 - nbits)], -1)
    grouped = bits.reshape(*bits.shape[:-1], words, 64).to(torch.int64)
    return (grouped * bit_values).sum(-1)  # distinct bits: the sum is their OR


def _mask_order(bits: torch.Tensor, window: int, bit_values: torch.Tensor) -> torch.Tensor:
    """Rows sorted by neighbour bitmask descending (lexicographic over unsigned 64-bit words),
    stably, within consecutive windows of ``window`` rows; int64 [rows]."""
    rows, nbits = bits.shape
    device = bits.device
    index = torch.arange(rows, device=device, dtype=torch.int64)
    window_id = torch.div(index, window, rounding_mode="floor")
    window_bits = max(0, (rows - 1) // window).bit_length()
    if nbits + window_bits <= 62:
        # One key: window first, then the complemented mask (ascending = mask descending).
        mask = (bits.to(torch.int64) * bit_values[:nbits]).sum(1)
        key = (window_id << nbits) | (((1 << nbits) - 1) - mask)
        return torch.sort(key, stable=True)[1]
    words = (nbits + 63) // 64
    masks = _pack_bits(bits, words, bit_values)
    order = index
    sign = -(1 << 63)
    for w in reversed(range(words)):  # LSD: least significant word first
        # ~u ascending as unsigned == (~u ^ sign) ascending as signed.
        key = torch.bitwise_not(masks[order, w]) ^ sign
        order = order[torch.sort(key, stable=True)[1]]
    return order[torch.sort(window_id[order], stable=True)[1]]


def kmap_plan(table: torch.Tensor, num_rows: int, split_mask_num: int, tile_rows: int,
              sort_window: int = 0) -> Tensors3:
    """Execution plan ``(bounds, order, tile_masks)`` of an output-stationary table (see
    ``torchsparse_pp.ops.kmap_plan``)."""
    _check(table.dim() == 2, f"the map must be [rows, K], got {list(table.shape)}")
    _check_table(table, num_rows, table.shape[1], INT32_MAX)
    return _build_plan(table, num_rows, split_mask_num, tile_rows, sort_window)


def _build_plan(table: torch.Tensor, num_rows: int, split_mask_num: int, tile_rows: int,
                sort_window: int) -> Tensors3:
    """kmap_plan after its table check: reads nothing on the host."""
    K = table.shape[1]
    is_sorted, splits, window, words, tiles, bounds = _plan_shape(K, num_rows, split_mask_num, tile_rows,
                                                                 sort_window)
    device = table.device
    padded = tiles * tile_rows
    order = torch.full((splits if is_sorted else 0, padded), -1, dtype=torch.int32, device=device)
    tile_masks = torch.zeros((splits, tiles, words), dtype=torch.int64, device=device)
    present = table[:num_rows] >= 0
    bit_values = _bit_values(device)
    for s in range(splits):
        bits = present[:, bounds[s]:bounds[s + 1]]
        if is_sorted:
            rows = _mask_order(bits, window, bit_values)
            order[s, :num_rows] = rows.to(torch.int32)
            bits = bits[rows]
        # Tiles OR their rows' masks: any() per bit over rows padded to whole tiles.
        if padded > num_rows:
            bits = torch.cat([bits, bits.new_zeros(padded - num_rows, bits.shape[1])])
        tile_bits = bits.reshape(tiles, tile_rows, bits.shape[1]).any(1)
        tile_masks[s] = _pack_bits(tile_bits, words, bit_values)
    return _bounds_tensor(tuple(bounds), device), order, tile_masks


@functools.lru_cache(maxsize=1024)
def _bounds_tensor(bounds: Tuple[int, ...], device) -> torch.Tensor:
    """A plan's split bounds on ``device``: few distinct ones, kept (read only) rather than copied
    to the device for every plan."""
    return torch.tensor(bounds, dtype=torch.int64, device=device)
