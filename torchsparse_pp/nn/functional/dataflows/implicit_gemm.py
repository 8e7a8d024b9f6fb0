"""implicit_gemm: output-stationary tiles over the map's table.

Forward and wgrad walk the destination-row table, dgrad the source-row table with W^T. The native
CPU kernels are deterministic by construction; the Triton weight gradient sums row chunks with
atomics unless deterministic mode asks for one chunk per offset.

The native CPU weight gradient sums per offset over the map's pairs: ops.implicit_gemm_wgrad
computes exactly that from the table (bit for bit the fetch_on_demand weight gradient), so the
pass is fetch_on_demand's, on the pairs cached on the map, rather than rebuilding the pairs and
checking the plan on every call (~26 ms of a MinkUNet 0.5x backward on 2 Zen 5 threads).
"""
from .... import ops
from ....ops.triton import library as triton_ops
from . import fetch_on_demand
from .passes import view_passes

# CPU: 8-row tiles waste few MACs on absent neighbours, and consecutive tiles with equal masks
# still run as one GEMM. Sorting works within windows of rows, which keeps the gathers spatially
# local (a global sort scatters them over the whole scan).
CPU_TILE_ROWS = 8
CPU_SORT_WINDOW = 4096
# GPU (native CUDA and Triton on any device): plan tiles of 64 rows (CTAs of 128 rows OR two of
# them); one global sort per split, so rows with equal masks share CTAs.
CUDA_TILE_ROWS = 64
CUDA_SORT_WINDOW = 0


def _native_cpu(device, backend):
    return backend == "native" and device.type == "cpu"


def _plan_shape(device, backend):
    if _native_cpu(device, backend):
        return CPU_TILE_ROWS, CPU_SORT_WINDOW
    return CUDA_TILE_ROWS, CUDA_SORT_WINDOW


def operands(view, pass_name, config, deterministic):
    """The table of the rows the pass walks and its plan: ``[table, bounds, order, tile_masks]``,
    on the native CPU followed by the plan's row groups ``[term_begin, term_offsets, term_sources]``;
    for the native CPU weight gradient the map's pairs ``[src, dst, offsets, identity]``."""
    if pass_name == "wgrad" and _native_cpu(view.kmap.out_in.device, config.backend):
        return fetch_on_demand.operands(view, pass_name, config, deterministic)
    rows = "src" if pass_name == "dgrad" else "dst"
    tile_rows, sort_window = _plan_shape(view.kmap.out_in.device, config.backend)
    splits = min(config.split_mask_num, view.kmap.geometry.volume)
    plan = view.kmap.plan(view.side(rows), splits, tile_rows, sort_window)
    if _native_cpu(view.kmap.out_in.device, config.backend):
        # The register kernels' operands, built once per map: no forward reads the whole table.
        return [view.table(rows), *plan, *view.kmap.row_groups(view.side(rows), splits, tile_rows, sort_window)]
    return [view.table(rows), *plan]


def run(pass_name, a, b, tensors, num_src, num_dst, config, deterministic, allow_tf32):
    if pass_name == "wgrad" and _native_cpu(a.device, config.backend):
        return fetch_on_demand.run(pass_name, a, b, tensors, num_src, num_dst, config, deterministic, allow_tf32)
    table, bounds, order, tile_masks = tensors[:4]
    tile_rows = _plan_shape(a.device, config.backend)[0]
    if pass_name == "wgrad":
        if config.backend == "triton":
            return triton_ops.implicit_gemm_wgrad(a, b, table, bounds, order, tile_masks, tile_rows, config.tile,
                                                  allow_tf32, deterministic)
        return ops.implicit_gemm_wgrad(a, b, table, bounds, order, tile_masks, tile_rows, allow_tf32)
    transpose = pass_name == "dgrad"
    rows = num_src if transpose else num_dst
    if config.backend == "triton":
        return triton_ops.implicit_gemm_forward(a, b, table, rows, transpose, bounds, order, tile_masks, tile_rows,
                                                config.tile, allow_tf32)
    if _native_cpu(a.device, config.backend):
        return ops.implicit_gemm_forward_grouped(a, b, table, rows, transpose, bounds, order, tile_masks, tile_rows,
                                                 *tensors[4:])
    return ops.implicit_gemm_forward(a, b, table, rows, transpose, bounds, order, tile_masks, tile_rows, allow_tf32)


forward, dgrad, wgrad = view_passes(operands, run)
