"""implicit_gemm: output-stationary tiles over the map's table; deterministic by construction.

Forward and wgrad walk the destination-row table, dgrad the source-row table with W^T.
"""
from .... import ops

# Output rows per CPU tile: small tiles waste few MACs on absent neighbours, and consecutive
# tiles with equal masks still run as one GEMM. Sorting works within windows of rows, which
# keeps the gathers spatially local (a global sort scatters them over the whole scan).
TILE_ROWS = 8
SORT_WINDOW = 4096


def _plan(view, rows, config):
    splits = min(config.split_mask_num, view.kmap.geometry.volume)
    return view.kmap.plan(view.side(rows), splits, TILE_ROWS, SORT_WINDOW)


def forward(feats, weight, view, config, deterministic):
    return ops.implicit_gemm_forward(feats, weight, view.table("dst"), view.num_dst, False,
                                     *_plan(view, "dst", config), TILE_ROWS)


def dgrad(grad, weight, view, config, deterministic):
    return ops.implicit_gemm_forward(grad, weight, view.table("src"), view.num_src, True,
                                     *_plan(view, "src", config), TILE_ROWS)


def wgrad(feats, grad, view, config, deterministic):
    return ops.implicit_gemm_wgrad(feats, grad, view.table("dst"), *_plan(view, "dst", config), TILE_ROWS)
