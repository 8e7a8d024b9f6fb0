"""implicit_gemm: output-stationary tiles over the map's table.

Forward and wgrad walk the destination-row table, dgrad the source-row table with W^T. The native
CPU kernels are deterministic by construction; the Triton weight gradient sums row chunks with
atomics unless deterministic mode asks for one chunk per offset.
"""
from .... import backends, ops
from ....ops import triton as triton_kernels

# CPU: 8-row tiles waste few MACs on absent neighbours, and consecutive tiles with equal masks
# still run as one GEMM. Sorting works within windows of rows, which keeps the gathers spatially
# local (a global sort scatters them over the whole scan).
CPU_TILE_ROWS = 8
CPU_SORT_WINDOW = 4096
# GPU (native CUDA and Triton on any device): plan tiles of 64 rows (CTAs of 128 rows OR two of
# them); one global sort per split, so rows with equal masks share CTAs.
CUDA_TILE_ROWS = 64
CUDA_SORT_WINDOW = 0


def _plan_shape(device, backend):
    if backend == "native" and device.type == "cpu":
        return CPU_TILE_ROWS, CPU_SORT_WINDOW
    return CUDA_TILE_ROWS, CUDA_SORT_WINDOW


def _run_plan(view, rows, config, device):
    tile_rows, sort_window = _plan_shape(device, config.backend)
    splits = min(config.split_mask_num, view.kmap.geometry.volume)
    return (*view.kmap.plan(view.side(rows), splits, tile_rows, sort_window), tile_rows)


def forward(feats, weight, view, config, deterministic):
    plan = _run_plan(view, "dst", config, feats.device)
    if config.backend == "triton":
        return triton_kernels.load("implicit_gemm").forward(feats, weight, view.table("dst"), view.num_dst, False,
                                                            *plan, config.tile, backends.allow_tf32)
    return ops.implicit_gemm_forward(feats, weight, view.table("dst"), view.num_dst, False, *plan,
                                     backends.allow_tf32)


def dgrad(grad, weight, view, config, deterministic):
    plan = _run_plan(view, "src", config, grad.device)
    if config.backend == "triton":
        return triton_kernels.load("implicit_gemm").forward(grad, weight, view.table("src"), view.num_src, True,
                                                            *plan, config.tile, backends.allow_tf32)
    return ops.implicit_gemm_forward(grad, weight, view.table("src"), view.num_src, True, *plan, backends.allow_tf32)


def wgrad(feats, grad, view, config, deterministic):
    plan = _run_plan(view, "dst", config, feats.device)
    if config.backend == "triton":
        return triton_kernels.load("implicit_gemm").wgrad(feats, grad, view.table("dst"), *plan, config.tile,
                                                          backends.allow_tf32, deterministic)
    return ops.implicit_gemm_wgrad(feats, grad, view.table("dst"), *plan, backends.allow_tf32)
