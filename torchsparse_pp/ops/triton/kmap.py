"""Kernel-map building in Triton: a coordinate hash table, candidate keys, and the views.

Keys are packed as csrc/common/coords.h packs them (15 bits of batch, 16 offset bits per
spatial axis): every key is >= 0, so -1 marks an empty hash slot and an invalid candidate.

- submanifold: ``hash_insert_kernel`` puts every coordinate in an open-addressing table
  (linear probing, ``atomic_cas`` on the int64 key); ``submanifold_query_kernel`` probes, for each
  (row, offset), the neighbour's key and writes the table cell.
- strided / generative: ``candidate_keys_kernel`` writes the key of every (offset, input) site the
  inputs reach (-1 where none); the caller sorts them, ``sorted_heads_kernel`` marks the first of
  each run, a cumsum ranks them and ``scatter_heads_kernel`` writes the new set;
  ``candidate_lookup_kernel`` recomputes the candidates and finds their rows in the sorted new
  set by binary search.
- views: ``pair_count_kernel`` / ``pair_write_kernel`` (pairs by offset, then output row, from
  per-block counts and an in-block scan) and ``transpose_kernel``.

Nothing here reads device data on the host; row counts are not specialised on (a new voxel count
reuses the compiled kernel).
"""
import triton
import triton.language as tl

from . import runtime

runtime.mark_defined()

# Relations of an input p and a reached coordinate q on one axis (kmap/torch_ops.py _axis_reach).
READ_BY = 0  # outputs q with q*s - pad + t*d = p (strided conv)
FLOOR = 1    # q = floor(p / s) (the minkowski output set)
WRITES = 2   # q = p*s - pad + t*d (generative transposed conv)

# Flag words the builders fold into their one host read.
FLAG_INPUT_RANGE = 0
FLAG_DUPLICATE = 1
FLAG_OUTPUT_RANGE = 2
FLAG_WORDS = 3


@triton.jit
def _pack(b, x, y, z):
    """Packed key of in-range int64 fields (coords.h pack_coord)."""
    return (b << 48) | ((x + 32768) << 32) | ((y + 32768) << 16) | (z + 32768)


@triton.jit
def _spatial_ok(v):
    return (v >= -32768) & (v <= 32767)


@triton.jit
def _batch_ok(b):
    return (b >= 0) & (b <= 32767)


@triton.jit
def _clamped_key(b, x, y, z):
    """The packed key of fields clamped into range (well-defined for any input)."""
    return _pack(tl.minimum(tl.maximum(b, 0), 32767), tl.minimum(tl.maximum(x, -32768), 32767),
                 tl.minimum(tl.maximum(y, -32768), 32767), tl.minimum(tl.maximum(z, -32768), 32767))


@triton.jit
def _first_slot(key, slot_mask):
    """Start slot of a key: packed neighbours differ in low bits, so they are mixed first."""
    h = key ^ (key >> 29)
    h = h * 0x2545F4914F6CDD1D
    h = h ^ (h >> 32)
    return h & slot_mask


@triton.jit
def _load_coords(coords_ptr, rows, ok):
    base = coords_ptr + rows.to(tl.int64) * 4
    b = tl.load(base, mask=ok, other=0).to(tl.int64)
    x = tl.load(base + 1, mask=ok, other=0).to(tl.int64)
    y = tl.load(base + 2, mask=ok, other=0).to(tl.int64)
    z = tl.load(base + 3, mask=ok, other=0).to(tl.int64)
    return b, x, y, z


@triton.jit
def _floor_div(a, b):
    """floor(a / b) for b > 0, whichever way integer division rounds."""
    q = a // b
    return tl.where(q * b > a, q - 1, q)


@triton.jit
def _any(hit):
    """Whether some lane of a bool block is set."""
    return tl.max(hit.to(tl.int32)) > 0


@triton.jit
def _flag(flags_ptr, word, hit):
    """flags[word] = 1 when any lane of ``hit`` is set."""
    if _any(hit):
        tl.atomic_max(flags_ptr + word, 1, sem="relaxed")


# --- hash table ------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["n", "slot_mask"])
def hash_insert_kernel(coords_ptr, keys_ptr, vals_ptr, n, slot_mask, BLOCK: tl.constexpr):
    """Inserts row r's packed key with value r. A second row with the same key finds it taken and
    stops (the table keeps one of them)."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    active = rows < n
    b, x, y, z = _load_coords(coords_ptr, rows, active)
    key = _clamped_key(b, x, y, z)
    slot = _first_slot(key, slot_mask)
    while _any(active):
        # Inactive lanes compare with -2, which no slot holds: they write nothing.
        prev = tl.atomic_cas(keys_ptr + slot, tl.where(active, -1, -2).to(tl.int64), key, sem="relaxed")
        won = active & (prev == -1)
        tl.store(vals_ptr + slot, rows, mask=won)
        active = active & (prev != -1) & (prev != key)
        slot = (slot + 1) & slot_mask


@triton.jit
def _probe(keys_ptr, vals_ptr, key, active, slot_mask):
    """The value stored under ``key`` per lane, -1 where absent or the lane is inactive."""
    slot = _first_slot(key, slot_mask)
    found = tl.full(key.shape, -1, tl.int32)
    while _any(active):
        stored = tl.load(keys_ptr + slot, mask=active, other=-1)
        hit = active & (stored == key)
        found = tl.where(hit, tl.load(vals_ptr + slot, mask=hit, other=-1), found)
        active = active & (stored != key) & (stored != -1)
        slot = (slot + 1) & slot_mask
    return found


@triton.jit
def _tile(BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """The program's rows [BLOCK_R, 1] and offsets [1, BLOCK_K] (offsets past K masked by callers)."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]
    k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)[None, :]
    return rows, k


@triton.jit(do_not_specialize=["n", "rows_padded", "slot_mask"])
def submanifold_query_kernel(coords_ptr, keys_ptr, vals_ptr, out_in_ptr, n, rows_padded, slot_mask, KX, KY, KZ,
                             dx, dy, dz, px, py, pz, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """out_in[r, k] = the row at coords[r] + t(k) * d - pad, -1 if none (rows past n too)."""
    K = KX * KY * KZ
    rows, k = _tile(BLOCK_R, BLOCK_K)
    ok = rows < n
    b, x, y, z = _load_coords(coords_ptr, rows, ok)
    nx = x + (k // (KY * KZ)) * dx - px
    ny = y + ((k // KZ) % KY) * dy - py
    nz = z + (k % KZ) * dz - pz
    # A neighbour off the packable range would alias another key: it has none.
    ok = ok & (k < K) & _spatial_ok(nx) & _spatial_ok(ny) & _spatial_ok(nz) & _batch_ok(b)
    found = _probe(keys_ptr, vals_ptr, _clamped_key(b, nx, ny, nz), ok, slot_mask)
    tl.store(out_in_ptr + rows.to(tl.int64) * K + k, found, mask=(rows < rows_padded) & (k < K))


# --- strided and generative sets ----------------------------------------------------------------------
@triton.jit(do_not_specialize=["n"])
def pack_check_kernel(coords_ptr, keys_ptr, flags_ptr, n, BLOCK: tl.constexpr):
    """keys[r] = packed coords[r] (clamped); flags[FLAG_INPUT_RANGE] = 1 if a row is unpackable."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = rows < n
    b, x, y, z = _load_coords(coords_ptr, rows, ok)
    tl.store(keys_ptr + rows, _clamped_key(b, x, y, z), mask=ok)
    packable = _batch_ok(b) & _spatial_ok(x) & _spatial_ok(y) & _spatial_ok(z)
    _flag(flags_ptr, 0, ok & ~packable)


@triton.jit(do_not_specialize=["n"])
def adjacent_repeat_kernel(sorted_ptr, flags_ptr, n, BLOCK: tl.constexpr):
    """flags[FLAG_DUPLICATE] = 1 if two neighbours of a sorted key list are equal."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK) + 1
    ok = i < n
    same = tl.load(sorted_ptr + i, mask=ok, other=0) == tl.load(sorted_ptr + i - 1, mask=ok, other=1)
    _flag(flags_ptr, 1, ok & same)


@triton.jit
def _axis(p, t, s, d, pad, size, RELATION: tl.constexpr, CLIP: tl.constexpr):
    """(q, valid) on one axis for tap t of input coordinate p (int64)."""
    if RELATION == 0:
        numerator = p + pad - t * d
        q = _floor_div(numerator, s)
        valid = q * s == numerator
    elif RELATION == 1:
        q = _floor_div(p, s)
        valid = q == q
    else:
        q = p * s - pad + t * d
        valid = q == q
    if CLIP:
        valid = valid & (q >= 0) & (q < size)
    return q, valid


@triton.jit
def _candidates(coords_ptr, rows, ok, k, KY, KZ, sx, sy, sz, dx, dy, dz, px, py, pz, rx, ry, rz,
                RELATION: tl.constexpr, CLIP: tl.constexpr):
    """(key, valid, packable) of the site input ``rows`` reach through offset k."""
    b, x, y, z = _load_coords(coords_ptr, rows, ok)
    qx, vx = _axis(x, k // (KY * KZ), sx, dx, px, rx, RELATION, CLIP)
    qy, vy = _axis(y, (k // KZ) % KY, sy, dy, py, ry, RELATION, CLIP)
    qz, vz = _axis(z, k % KZ, sz, dz, pz, rz, RELATION, CLIP)
    valid = ok & vx & vy & vz
    packable = _batch_ok(b) & _spatial_ok(qx) & _spatial_ok(qy) & _spatial_ok(qz)
    return _clamped_key(b, qx, qy, qz), valid, packable


@triton.jit(do_not_specialize=["n"])
def candidate_keys_kernel(coords_ptr, cand_ptr, flags_ptr, n, taps, KY, KZ, sx, sy, sz, dx, dy, dz, px, py, pz,
                          rx, ry, rz, RELATION: tl.constexpr, CLIP: tl.constexpr, STRICT: tl.constexpr,
                          BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """cand[k * n + r] = the key input r reaches through offset k (of ``taps``), -1 where it
    reaches none or an unpackable site; with STRICT an unpackable site sets
    flags[FLAG_OUTPUT_RANGE]."""
    rows, k = _tile(BLOCK_R, BLOCK_K)
    ok = (rows < n) & (k < taps)
    key, valid, packable = _candidates(coords_ptr, rows, ok, k, KY, KZ, sx, sy, sz, dx, dy, dz, px, py, pz,
                                       rx, ry, rz, RELATION, CLIP)
    if STRICT:
        _flag(flags_ptr, 2, valid & ~packable)
    tl.store(cand_ptr + k.to(tl.int64) * n + rows, tl.where(valid & packable, key, -1), mask=ok)


@triton.jit(do_not_specialize=["total"])
def sorted_heads_kernel(sorted_ptr, heads_ptr, total, BLOCK: tl.constexpr):
    """heads[i] = 1 where sorted[i] is a valid key (>= 0) unlike the one before it."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < total
    v = tl.load(sorted_ptr + i, mask=ok, other=-1)
    before = tl.load(sorted_ptr + i - 1, mask=ok & (i > 0), other=-1)
    tl.store(heads_ptr + i, ((v >= 0) & (v != before)).to(tl.int32), mask=ok)


@triton.jit(do_not_specialize=["total"])
def scatter_heads_kernel(sorted_ptr, heads_ptr, ranks_ptr, out_keys_ptr, out_coords_ptr, total,
                         BLOCK: tl.constexpr):
    """The new set: out_keys[rank] and its unpacked out_coords[rank] at every run head."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < total
    head = tl.load(heads_ptr + i, mask=ok, other=0) != 0
    key = tl.load(sorted_ptr + i, mask=head, other=0)
    rank = tl.load(ranks_ptr + i, mask=head, other=1) - 1
    tl.store(out_keys_ptr + rank, key, mask=head)
    base = out_coords_ptr + rank * 4
    tl.store(base, (key >> 48).to(tl.int32), mask=head)
    tl.store(base + 1, (((key >> 32) & 0xFFFF) - 32768).to(tl.int32), mask=head)
    tl.store(base + 2, (((key >> 16) & 0xFFFF) - 32768).to(tl.int32), mask=head)
    tl.store(base + 3, ((key & 0xFFFF) - 32768).to(tl.int32), mask=head)


@triton.jit
def _lower_bound(keys_ptr, m, key, active):
    """Per lane, the first index i of the ascending keys[0:m] with keys[i] >= key."""
    lo = tl.zeros(key.shape, tl.int64)
    hi = tl.where(active, m, 0).to(tl.int64)
    while _any(lo < hi):
        open_ = lo < hi
        mid = (lo + hi) // 2
        below = tl.load(keys_ptr + mid, mask=open_, other=0) < key
        lo = tl.where(open_ & below, mid + 1, lo)
        hi = tl.where(open_ & ~below, mid, hi)
    return lo


@triton.jit(do_not_specialize=["n", "m"])
def candidate_lookup_kernel(coords_ptr, out_keys_ptr, out_in_ptr, n, m, KY, KZ, K, sx, sy, sz, dx, dy, dz,
                            px, py, pz, rx, ry, rz, RELATION: tl.constexpr, CLIP: tl.constexpr,
                            ROWS_ARE_INPUTS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """For each (offset k, input r) whose site is in the sorted set out_keys (row j there):
    out_in[j, k] = r, or with ROWS_ARE_INPUTS (the generative map) out_in[r, k] = j."""
    rows, k = _tile(BLOCK_R, BLOCK_K)
    ok = (rows < n) & (k < K)
    key, valid, packable = _candidates(coords_ptr, rows, ok, k, KY, KZ, sx, sy, sz, dx, dy, dz, px, py, pz,
                                       rx, ry, rz, RELATION, CLIP)
    valid = valid & packable
    j = _lower_bound(out_keys_ptr, m, key, valid)
    hit = valid & (j < m)
    hit = hit & (tl.load(out_keys_ptr + j, mask=hit, other=-1) == key)
    if ROWS_ARE_INPUTS:
        tl.store(out_in_ptr + rows.to(tl.int64) * K + k, j.to(tl.int32), mask=hit)
    else:
        tl.store(out_in_ptr + j * K + k, (rows + k * 0).to(tl.int32), mask=hit)


# --- views ------------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["num_out", "num_in", "blocks"])
def pair_count_kernel(table_ptr, counts_ptr, own_ptr, range_flag_ptr, num_out, num_in, blocks, K,
                      IDENTITY: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """Per offset k and block of BLOCK_R output rows: counts[k * blocks + block] = its pairs;
    with IDENTITY own[k] += its pairs that read their own row; range_flag = 1 if an entry is
    >= num_in."""
    rows, k = _tile(BLOCK_R, BLOCK_K)
    ok = (rows < num_out) & (k < K)
    v = tl.load(table_ptr + rows.to(tl.int64) * K + k, mask=ok, other=-1)
    present = v >= 0
    offset = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    tl.store(counts_ptr + offset.to(tl.int64) * blocks + tl.program_id(0), tl.sum(present.to(tl.int64), 0),
             mask=offset < K)
    if IDENTITY:
        tl.atomic_add(own_ptr + offset, tl.sum((present & (v == rows)).to(tl.int64), 0), mask=offset < K,
                      sem="relaxed")
    _flag(range_flag_ptr, 0, v >= num_in)


@triton.jit(do_not_specialize=["num_out", "blocks"])
def pair_write_kernel(table_ptr, ends_ptr, in_idx_ptr, out_idx_ptr, offsets_ptr, num_out, blocks, K,
                      BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """Writes the pairs of each (offset, row block) at its place in the offset-major order (ends:
    the inclusive prefix sum of the block counts); row block 0 writes offsets[k] (and offsets[K])."""
    rows, k = _tile(BLOCK_R, BLOCK_K)
    ok = (rows < num_out) & (k < K)
    v = tl.load(table_ptr + rows.to(tl.int64) * K + k, mask=ok, other=-1)
    present = (v >= 0).to(tl.int64)
    offset = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    in_range = offset < K
    end = tl.load(ends_ptr + offset.to(tl.int64) * blocks + tl.program_id(0), mask=in_range, other=0)
    start = end - tl.sum(present, 0)
    where = start[None, :] + tl.cumsum(present, 0) - 1
    tl.store(in_idx_ptr + where, v, mask=present != 0)
    tl.store(out_idx_ptr + where, (rows + k * 0).to(tl.int32), mask=present != 0)
    if tl.program_id(0) == 0:
        tl.store(offsets_ptr + offset, start, mask=in_range)
        tl.store(offsets_ptr + K + offset * 0, tl.load(ends_ptr + (K * blocks - 1) + offset * 0),
                 mask=offset == K - 1)


@triton.jit(do_not_specialize=["num_out", "num_in"])
def transpose_kernel(table_ptr, in_out_ptr, num_out, num_in, K, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """in_out[p, k] = q wherever table[q, k] = p (entries outside [0, num_in) are skipped)."""
    rows, k = _tile(BLOCK_R, BLOCK_K)
    ok = (rows < num_out) & (k < K)
    v = tl.load(table_ptr + rows.to(tl.int64) * K + k, mask=ok, other=-1)
    tl.store(in_out_ptr + v.to(tl.int64) * K + k, (rows + k * 0).to(tl.int32), mask=ok & (v >= 0) & (v < num_in))
