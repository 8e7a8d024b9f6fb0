"""Tile shapes of the Triton GEMM kernels, as data (no triton import).

A tile names the block of one program: BLOCK_M rows (pairs or destination rows) by BLOCK_N
output channels, stepping BLOCK_K input channels; in the weight gradient BLOCK_M covers input
channels, BLOCK_N output channels and BLOCK_K the pairs summed per step. ``num_warps`` and
``num_stages`` are Triton's launch options.

Each tile lists the compute modes it serves: "half" (float16 / bfloat16 tensor cores), "tf32",
"fp32" (exact float32, FMA dots) and "fp64". A tile is in a mode only if every kernel compiles
in it for every target of ``make triton-check`` (sm_80 ... sm_120, gfx90a, gfx942) within shared
memory and without a single spilled byte; FMA dots hold their operands in registers, so the exact
modes need BLOCK_K = 16.
"""
from dataclasses import dataclass
from typing import Dict, Tuple

import torch

MODES = ("half", "tf32", "fp32", "fp64")


@dataclass(frozen=True)
class Tile:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    modes: Tuple[str, ...]

    @property
    def name(self) -> str:
        return f"m{self.block_m}n{self.block_n}k{self.block_k}w{self.num_warps}s{self.num_stages}"


TILES: Tuple[Tile, ...] = (
    Tile(32, 32, 16, 4, 3, ("half", "tf32", "fp32")),
    Tile(32, 32, 16, 4, 2, ("fp64",)),
    Tile(64, 32, 16, 4, 2, ("tf32", "fp32", "fp64")),
    Tile(64, 32, 32, 4, 2, ("half",)),
    Tile(64, 64, 32, 8, 3, ("half", "tf32")),
    Tile(128, 64, 32, 8, 3, ("half",)),
)
TILES_BY_NAME: Dict[str, Tile] = {t.name: t for t in TILES}


def check_tile_name(name: str) -> None:
    if name not in TILES_BY_NAME:
        raise ValueError(f"unknown Triton tile {name!r}; expected one of {sorted(TILES_BY_NAME)}")


def mode_of(dtype: torch.dtype, precision: str) -> str:
    """The compute mode of a dtype and tl.dot input precision."""
    if dtype in (torch.float16, torch.bfloat16):
        return "half"
    if dtype == torch.float64:
        return "fp64"
    return "tf32" if precision == "tf32" else "fp32"


def tiles_for(mode: str) -> Tuple[Tile, ...]:
    return tuple(t for t in TILES if mode in t.modes)


def _pow2_at_least(n: int, low: int, high: int) -> int:
    v = low
    while v < n and v < high:
        v *= 2
    return v


def _named(name: str, mode: str) -> Tile:
    check_tile_name(name)
    tile = TILES_BY_NAME[name]
    if mode not in tile.modes:
        raise ValueError(f"Triton tile {name} does not serve {mode} convolutions (it would spill or not compile "
                         f"on some GPU); use one of {[t.name for t in tiles_for(mode)]}")
    return tile


def _closest(mode: str, want_m: int, want_n: int, want_k: int) -> Tile:
    def distance(t: Tile):
        return (abs(t.block_n - want_n), abs(t.block_m - want_m), abs(t.block_k - want_k))
    return min(tiles_for(mode), key=distance)


def choose_tile(name, rows: int, c_src: int, c_dst: int, mode: str) -> Tile:
    """The named tile, else one sized to the channels: N covers C_dst (up to 128), K = 16 for
    thin inputs, M large only when there are rows enough to keep many programs busy."""
    if name is not None:
        return _named(name, mode)
    want_n = _pow2_at_least(c_dst, 32, 128)
    want_m = 128 if rows >= 1 << 16 and want_n >= 64 else (64 if rows >= 1 << 12 else 32)
    return _closest(mode, want_m, want_n, 16 if c_src <= 16 else 32)


def choose_wgrad_tile(name, c_in: int, c_out: int, mode: str) -> Tile:
    """Weight-gradient tile: M covers C_in, N covers C_out, K steps over pairs."""
    if name is not None:
        return _named(name, mode)
    return _closest(mode, _pow2_at_least(c_in, 32, 128), _pow2_at_least(c_out, 32, 128), 32)
