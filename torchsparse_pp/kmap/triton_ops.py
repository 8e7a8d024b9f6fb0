"""Kernel-map builders and views on Triton kernels (ops/triton/kmap.py): the "triton" backend.

Same functions, signatures and results as kmap/torch_ops.py and the compiled ops (equal element
for element: dtype, shape, outputs sorted by packed key, pairs by offset then output row), built
so that a GPU need not wait for the host:

- kmap_submanifold reads nothing on the host: a hash table of the coordinates, one probe per
  (row, offset). It checks no data: the coordinates' range is checked where a SparseTensor is
  made, and a strided or generative map makes unique sets (a repeated coordinate here keeps one
  of its rows in the table, which both rows' neighbours then read).
- kmap_downsample / kmap_generative read one small tensor: the new set's size together with the
  flags of the data checks (input range, duplicates, reached sites out of range). When a flag is
  set, torch_ops builds the same map to raise its error with its message.
- kmap_pairs reads one small tensor: the pair count, which the exact-length pair lists need, and
  the flag of its range check. kmap_transpose and kmap_plan read nothing (they check shapes; the
  data checks of their tables are ops.validate's, when a map validates its views).
"""
from typing import Optional, Sequence, Tuple

import torch

from ..ops.triton import load, runtime
from . import torch_ops
from .torch_ops import (_check, _check_coord_rows, _check_memory, _check_out_rows, _check_rows,
                        _check_table_shape, _checked_coords, _checked_minkowski_mode, _checked_range,
                        _dtype_name, _Geometry, _memory_checked, _padded_rows, INT32_MAX, PAIR_BYTES)

Tensors2 = Tuple[torch.Tensor, torch.Tensor]
Tensors3 = Tuple[torch.Tensor, torch.Tensor, torch.Tensor]

# Bytes per (kernel tap, input) of the candidate lists: the int64 keys, their sorted copy with
# its int64 permutation, int32 run heads and int64 ranks.
CANDIDATE_BYTES = 36
# Hash table slots per coordinate (at least): int64 key and int32 row each.
SLOTS_PER_ROW = 2
HASH_SLOT_BYTES = 12


def _kernels(device: torch.device):
    runtime.require(device)
    return load("kmap")


# Program shapes on GPUs: lanes of the 1-D kernels; lanes and widest offset block of the 2-D ones.
GPU_BLOCK = 1024
GPU_TILE_LANES = 512
GPU_TILE_OFFSETS = 32


def _block() -> int:
    """Lanes of the 1-D kernels' programs: wide under the interpreter (its programs run one by one)."""
    return 4096 if runtime.interpreter_requested() else GPU_BLOCK


def tile(K: int) -> Tuple[int, int]:
    """(rows, offsets) of the 2-D kernels' programs: all offsets of a 3x3x3 kernel in one program."""
    interpreted = runtime.interpreter_requested()
    lanes, widest = (8192, 128) if interpreted else (GPU_TILE_LANES, GPU_TILE_OFFSETS)
    block_k = min(1 << max(0, K - 1).bit_length(), widest)
    return lanes // block_k, block_k


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def _hash_capacity(n: int) -> int:
    """A power of two >= SLOTS_PER_ROW * n (so probes stay short), at least 16."""
    return max(16, 1 << max(0, SLOTS_PER_ROW * n - 1).bit_length())


def _geometry_args(g: _Geometry, clip: Optional[Sequence[int]]):
    """The candidate kernels' geometry arguments (clip sizes 0 when unclipped)."""
    r = list(clip) if clip is not None else [0, 0, 0]
    return [g.k[1], g.k[2], *g.s, *g.d, *g.pad, *r]


# --- builders --------------------------------------------------------------------------------------
def kmap_submanifold(coords: torch.Tensor, kernel_size: Sequence[int], dilation: Sequence[int],
                     padding: Sequence[int], pad_rows_to: int) -> torch.Tensor:
    """Submanifold map ``out_in`` (outputs = ``coords``), rows padded with -1 to ``pad_rows_to``;
    no host read (see the module docstring for what it does not check)."""
    coords = _checked_coords(coords, "coords")
    g = _Geometry(kernel_size, (1, 1, 1), dilation, padding)
    n, K, device = coords.shape[0], g.volume, coords.device
    rows = _padded_rows(n, pad_rows_to)
    capacity = _hash_capacity(n)
    _check_memory(rows * K * 4 + capacity * HASH_SLOT_BYTES,
                  f"the submanifold kernel map ({n} rows x {K} kernel offsets, int32)", device)
    out_in = torch.empty((rows, K), dtype=torch.int32, device=device)
    if n == 0:
        return out_in
    kernels, block = _kernels(device), _block()
    keys = torch.full((capacity,), -1, dtype=torch.int64, device=device)
    vals = torch.empty((capacity,), dtype=torch.int32, device=device)
    kernels.hash_insert_kernel[(_cdiv(n, block),)](coords, keys, vals, n, capacity - 1, BLOCK=block)
    block_r, block_k = tile(K)
    kernels.submanifold_query_kernel[(_cdiv(rows, block_r), _cdiv(K, block_k))](
        coords, keys, vals, out_in, n, rows, capacity - 1, *g.k, *g.d, *g.pad, BLOCK_R=block_r, BLOCK_K=block_k)
    return out_in


def _checked_inputs(kernels, coords: torch.Tensor, block: int) -> torch.Tensor:
    """Flags of the input checks (range; duplicates, by sorting the keys), read later."""
    n, device = coords.shape[0], coords.device
    flags = torch.zeros(kernels.FLAG_WORDS, dtype=torch.int32, device=device)
    keys = torch.empty(n, dtype=torch.int64, device=device)
    kernels.pack_check_kernel[(_cdiv(n, block),)](coords, keys, flags, n, BLOCK=block)
    ordered = torch.sort(keys).values
    if n > 1:
        kernels.adjacent_repeat_kernel[(_cdiv(n - 1, block),)](ordered, flags, n, BLOCK=block)
    return flags


def _new_set(kernels, coords: torch.Tensor, g: _Geometry, relation: int, clip, taps: int, strict: bool,
             flags: torch.Tensor, block: int, raise_error) -> Tensors2:
    """The sorted set of every site the inputs reach: (keys, coords). Reads its size and the
    flags in one copy; when a flag is set calls ``raise_error``."""
    n, device = coords.shape[0], coords.device
    total = taps * n
    candidates = torch.empty(total, dtype=torch.int64, device=device)
    block_r, block_k = tile(taps)
    kernels.candidate_keys_kernel[(_cdiv(n, block_r), _cdiv(taps, block_k))](
        coords, candidates, flags, n, taps, *_geometry_args(g, clip), RELATION=relation, CLIP=clip is not None,
        STRICT=strict, BLOCK_R=block_r, BLOCK_K=block_k)
    ordered = torch.sort(candidates).values
    heads = torch.empty(total, dtype=torch.int32, device=device)
    kernels.sorted_heads_kernel[(_cdiv(total, block),)](ordered, heads, total, BLOCK=block)
    ranks = torch.cumsum(heads, 0)
    # The one host read: the set's size and the check flags.
    summary = torch.cat([ranks[-1:], flags.to(torch.int64)]).tolist()
    if any(summary[1:]):
        raise_error()
        raise RuntimeError("a kernel-map check failed on the device but not on the host (please report)")
    m = summary[0]
    _check_out_rows(m)
    out_keys = torch.empty(m, dtype=torch.int64, device=device)
    out_coords = torch.empty((m, 4), dtype=torch.int32, device=device)
    kernels.scatter_heads_kernel[(_cdiv(total, block),)](ordered, heads, ranks, out_keys, out_coords, total,
                                                         BLOCK=block)
    return out_keys, out_coords


def kmap_downsample(coords: torch.Tensor, kernel_size: Sequence[int], stride: Sequence[int],
                    dilation: Sequence[int], padding: Sequence[int], mode: str,
                    out_range: Optional[Sequence[int]], pad_rows_to: int) -> Tensors2:
    """Strided conv map ``(out_coords, out_in)`` as torch_ops.kmap_downsample; one host read."""
    args = (coords, kernel_size, stride, dilation, padding, mode, out_range, pad_rows_to)
    _check_coord_rows(coords, "coords")
    coords = _checked_coords(coords, "coords")
    g = _Geometry(kernel_size, stride, dilation, padding)
    minkowski = _checked_minkowski_mode(mode, out_range)
    clip = _checked_range(out_range)
    n, K, device = coords.shape[0], g.volume, coords.device
    _check_memory(K * n * CANDIDATE_BYTES, f"the kernel map's candidate list ({K * n} (input, kernel offset) "
                  f"pairs of {n} inputs and {K} offsets)", device)
    if n == 0:
        return (torch.empty((0, 4), dtype=torch.int32, device=device),
                torch.empty((0, K), dtype=torch.int32, device=device))
    kernels = _kernels(device)
    block = _block()
    flags = _checked_inputs(kernels, coords, block)
    relation, taps = (kernels.FLOOR, 1) if minkowski else (kernels.READ_BY, K)
    out_keys, out_coords = _new_set(kernels, coords, g, relation, clip, taps, not minkowski, flags, block,
                                    lambda: torch_ops.kmap_downsample(*args))
    m = out_keys.shape[0]
    out_in = torch.full((_padded_rows(m, pad_rows_to), K), -1, dtype=torch.int32, device=device)
    if m > 0:
        block_r, block_k = tile(K)
        kernels.candidate_lookup_kernel[(_cdiv(n, block_r), _cdiv(K, block_k))](
            coords, out_keys, out_in, n, m, g.k[1], g.k[2], K, *_geometry_args(g, clip)[2:],
            RELATION=kernels.READ_BY, CLIP=clip is not None, ROWS_ARE_INPUTS=False, BLOCK_R=block_r,
            BLOCK_K=block_k)
    return out_coords, out_in


def kmap_generative(coords: torch.Tensor, kernel_size: Sequence[int], stride: Sequence[int],
                    dilation: Sequence[int], padding: Sequence[int], out_range: Optional[Sequence[int]],
                    pad_rows_to: int) -> Tensors2:
    """Generative transposed conv map ``(fine_coords, out_in)`` as torch_ops.kmap_generative;
    one host read."""
    args = (coords, kernel_size, stride, dilation, padding, out_range, pad_rows_to)
    _check_coord_rows(coords, "coords")
    coords = _checked_coords(coords, "coords")
    g = _Geometry(kernel_size, stride, dilation, padding)
    clip = _checked_range(out_range)
    n, K, device = coords.shape[0], g.volume, coords.device
    _check_memory(K * n * CANDIDATE_BYTES, f"the kernel map's candidate list ({K * n} (input, kernel offset) "
                  f"pairs of {n} inputs and {K} offsets)", device)
    out_in = torch.full((_padded_rows(n, pad_rows_to), K), -1, dtype=torch.int32, device=device)
    if n == 0:
        return torch.empty((0, 4), dtype=torch.int32, device=device), out_in
    kernels = _kernels(device)
    block = _block()
    flags = _checked_inputs(kernels, coords, block)
    fine_keys, fine_coords = _new_set(kernels, coords, g, kernels.WRITES, clip, K, True, flags, block,
                                      lambda: torch_ops.kmap_generative(*args))
    m = fine_keys.shape[0]
    if m > 0:
        block_r, block_k = tile(K)
        kernels.candidate_lookup_kernel[(_cdiv(n, block_r), _cdiv(K, block_k))](
            coords, fine_keys, out_in, n, m, g.k[1], g.k[2], K, *_geometry_args(g, clip)[2:],
            RELATION=kernels.WRITES, CLIP=clip is not None, ROWS_ARE_INPUTS=True, BLOCK_R=block_r,
            BLOCK_K=block_k)
    return fine_coords, out_in


# --- views -------------------------------------------------------------------------------------------
def kmap_pairs(out_in: torch.Tensor, num_in: int, num_out: int
               ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Weight-stationary view ``(in_idx, out_idx, offsets, identity)`` as torch_ops.kmap_pairs;
    one host read (the pair count, with the range flag)."""
    return _pairs(out_in, num_in, num_out, bounded=False)


def kmap_pairs_bounded(out_in: torch.Tensor, num_in: int, num_out: int
                       ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """kmap_pairs with no host read, for tables the library built: ``in_idx`` / ``out_idx`` have
    room for every (row, offset) cell, ``K * num_out``, and hold the pairs in their first
    ``offsets[K]`` entries (the rest is never read: the GPU dataflows read the counts from
    ``offsets`` on the device). Entries are not range-checked."""
    return _pairs(out_in, num_in, num_out, bounded=True)


def _pairs(out_in: torch.Tensor, num_in: int, num_out: int, bounded: bool):
    torch_ops._check_pairs_arguments(out_in, num_in, num_out)
    K, device = out_in.shape[1], out_in.device
    if num_out == 0 or K == 0:
        empty = torch.empty(0, dtype=torch.int32, device=device)
        return (empty, empty.clone(), torch.zeros(K + 1, dtype=torch.int64, device=device),
                torch.zeros(K, dtype=torch.bool, device=device))
    table = out_in.contiguous()
    kernels = _kernels(device)
    block_r, block_k = tile(K)
    blocks, grid = _cdiv(num_out, block_r), (_cdiv(num_out, block_r), _cdiv(K, block_k))
    counts = torch.empty(K * blocks, dtype=torch.int64, device=device)
    # own[:K]: pairs that read their own row, per offset; own[K]: the range flag.
    own = torch.zeros(K + 1, dtype=torch.int64, device=device)
    check_identity = num_in == num_out
    kernels.pair_count_kernel[grid](table, counts, own, own[K:], num_out, num_in, blocks, K,
                                    IDENTITY=check_identity, BLOCK_R=block_r, BLOCK_K=block_k)
    ends = torch.cumsum(counts, 0)
    if bounded:
        length = K * num_out
    else:
        length, outside = torch.cat([ends[-1:], own[K:]]).tolist()
        _check(not outside, f"out_in holds input rows >= num_in ({num_in})")
        if _memory_checked(K * num_out * PAIR_BYTES):
            _check_memory(length * PAIR_BYTES, f"the kernel map's pair lists ({length} (input, output) pairs over "
                          f"{K} kernel offsets, int32)", device)
    in_idx = torch.empty(length, dtype=torch.int32, device=device)
    out_idx = torch.empty(length, dtype=torch.int32, device=device)
    offsets = torch.empty(K + 1, dtype=torch.int64, device=device)
    kernels.pair_write_kernel[grid](table, ends, in_idx, out_idx, offsets, num_out, blocks, K, BLOCK_R=block_r,
                                    BLOCK_K=block_k)
    identity = own[:K] == num_out if check_identity else torch.zeros(K, dtype=torch.bool, device=device)
    return in_idx, out_idx, offsets, identity


def kmap_transpose(out_in: torch.Tensor, num_out: int, num_in: int, pad_rows_to: int) -> torch.Tensor:
    """``in_out[p, k] = q`` wherever ``out_in[q, k] = p``, rows padded to ``pad_rows_to``; no
    host read (entries outside ``[0, num_in)`` are not written, nor reported)."""
    _check(out_in.dim() == 2, f"out_in must be [rows, K], got {list(out_in.shape)}")
    K = out_in.shape[1]
    _check_table_shape(out_in, num_out, K, num_in)
    rows = _padded_rows(num_in, pad_rows_to)
    in_out = torch.full((rows, K), -1, dtype=torch.int32, device=out_in.device)
    if num_out > 0 and K > 0:
        block_r, block_k = tile(K)
        _kernels(out_in.device).transpose_kernel[(_cdiv(num_out, block_r), _cdiv(K, block_k))](
            out_in, in_out, num_out, num_in, K, BLOCK_R=block_r, BLOCK_K=block_k)
    return in_out


def kmap_plan(table: torch.Tensor, num_rows: int, split_mask_num: int, tile_rows: int,
              sort_window: int = 0) -> Tensors3:
    """Execution plan ``(bounds, order, tile_masks)`` as torch_ops.kmap_plan (the same torch
    ops, which read nothing on the host once the table's data check is left out)."""
    _check(table.dim() == 2, f"the map must be [rows, K], got {list(table.shape)}")
    _check_table_shape(table, num_rows, table.shape[1], INT32_MAX)
    return torch_ops._build_plan(table, num_rows, split_mask_num, tile_rows, sort_window)
