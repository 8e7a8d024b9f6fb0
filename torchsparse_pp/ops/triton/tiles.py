"""Tile shapes of the Triton GEMM kernels, as data (no triton import).

A tile names the block of one program: BLOCK_M rows (pairs or destination rows) by BLOCK_N
output channels, stepping BLOCK_K input channels; in the weight gradient BLOCK_M covers input
channels, BLOCK_N output channels and BLOCK_K the pairs summed per step. ``num_warps`` and
``num_stages`` are Triton's launch options. Every tile here compiles for every target of
``make triton-check`` (sm_80 ... sm_120, gfx90a, gfx942) within shared memory and without
spills; float64 is limited to the small tiles (twice the bytes per element).
"""
from dataclasses import dataclass
from typing import Dict, Tuple

import torch


@dataclass(frozen=True)
class Tile:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int

    @property
    def name(self) -> str:
        return f"m{self.block_m}n{self.block_n}k{self.block_k}w{self.num_warps}s{self.num_stages}"


TILES: Tuple[Tile, ...] = (
    Tile(32, 32, 16, 4, 2),
    Tile(64, 32, 32, 4, 2),
    Tile(64, 64, 32, 4, 3),
    Tile(128, 64, 32, 8, 3),
    Tile(128, 128, 32, 8, 3),
)
TILES_BY_NAME: Dict[str, Tile] = {t.name: t for t in TILES}
# float64 doubles the operand bytes and the accumulator registers: small tiles only.
FLOAT64_TILES = tuple(t.name for t in TILES[:3])


def check_tile_name(name: str) -> None:
    if name not in TILES_BY_NAME:
        raise ValueError(f"unknown Triton tile {name!r}; expected one of {sorted(TILES_BY_NAME)}")


def tiles_for(dtype: torch.dtype) -> Tuple[Tile, ...]:
    names = FLOAT64_TILES if dtype == torch.float64 else tuple(TILES_BY_NAME)
    return tuple(TILES_BY_NAME[n] for n in names)


def _pow2_at_least(n: int, low: int, high: int) -> int:
    v = low
    while v < n and v < high:
        v *= 2
    return v


def choose_tile(name, rows: int, c_src: int, c_dst: int, dtype: torch.dtype) -> Tile:
    """The named tile, else one sized to the channels: N covers C_dst (up to 128), K = 16 for
    thin inputs, M large only when there are rows enough to keep many programs busy."""
    allowed = tiles_for(dtype)
    if name is not None:
        check_tile_name(name)
        tile = TILES_BY_NAME[name]
        if tile not in allowed:
            raise ValueError(f"Triton tile {name} is not available for {dtype}; use one of "
                             f"{[t.name for t in allowed]}")
        return tile
    want_n = _pow2_at_least(c_dst, 32, 128)
    want_m = 128 if rows >= 1 << 16 and want_n >= 64 else (64 if rows >= 1 << 12 else 32)
    want_k = 16 if c_src <= 16 else 32

    return _closest(allowed, want_m, want_n, want_k)


def choose_wgrad_tile(name, c_in: int, c_out: int, dtype: torch.dtype) -> Tile:
    """Weight-gradient tile: M covers C_in, N covers C_out, K steps over pairs."""
    if name is not None:
        return choose_tile(name, 0, c_in, c_out, dtype)
    return _closest(tiles_for(dtype), _pow2_at_least(c_in, 32, 128), _pow2_at_least(c_out, 32, 128), 32)


def _closest(allowed, want_m: int, want_n: int, want_k: int) -> Tile:
    def distance(t: Tile):
        return (abs(t.block_n - want_n), abs(t.block_m - want_m), abs(t.block_k - want_k))
    return min(allowed, key=distance)
