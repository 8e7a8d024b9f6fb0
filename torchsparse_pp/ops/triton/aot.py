"""Every kernel instantiation the dataflows (and so the autotuner) can launch, for ahead-of-time
compile checks (tools/triton_check.py). Importing this module imports triton and the kernels.

An instantiation is a kernel, its argument types (the common case: 32-bit sizes and strides,
16-byte aligned pointers, as torch allocations are) and its compile-time constants. Under the
interpreter-only UPCAST switch the compiled kernels keep their own dtype, so it is always off.
"""
import inspect
from dataclasses import dataclass
from typing import Dict, Iterator, Tuple

from . import common, fetch_on_demand, gather_scatter, implicit_gemm, kmap
from .tiles import tiles_for

# (label, feature type, accumulator type, dot precision, tile mode) of every compute mode.
MODES: Tuple[Tuple[str, str, str, str, str], ...] = (
    ("fp16", "fp16", "fp32", "ieee", "half"),
    ("bf16", "bf16", "fp32", "ieee", "half"),
    ("fp32", "fp32", "fp32", "ieee", "fp32"),
    ("tf32", "fp32", "fp32", "tf32", "tf32"),
    ("fp64", "fp64", "fp64", "ieee", "fp64"),
)

# Pointer arguments by role: "feats" (the mode's feature type), "acc" (its accumulator), an
# index type, or "same" (the feature type again); every other argument is a 32-bit integer.
POINTERS = {
    "feats_ptr": "feats", "w_ptr": "feats", "grad_ptr": "feats", "src_ptr": "*i32", "dst_ptr": "*i32",
    "table_ptr": "*i32", "order_ptr": "*i32", "idx_ptr": "*i32", "pair_offsets_ptr": "*i64",
    "masks_ptr": "*i64", "bounds_ptr": "*i64", "split_of_offset_ptr": "*i64",
    "nonfinite_ptr": "*i32", "flags_ptr": "*i32",
    "values_ptr": "feats",
}
# Output pointer types per kernel: a float accumulator, the feature type itself, or either
# (implicit GEMM writes one split straight to the output, several to float partials).
OUTPUTS = {
    "fod_forward_kernel": ("acc",), "fod_forward_owned_kernel": ("feats",), "fod_wgrad_kernel": ("acc",),
    "ig_forward_kernel": ("feats", "acc"), "ig_wgrad_kernel": ("acc",), "gather_rows_kernel": ("feats",),
    "scatter_add_rows_kernel": ("acc",), "ig_nonfinite_kernel": ("feats", "acc"),
}
PLAN = {"PLAN_ROWS": implicit_gemm.PLAN_TILE_ROWS}
# fod_forward_kernel's OFFSETS_P2: 32 covers the 3x3x3 kernels (27 offsets) and every smaller one.
GEMM_KERNELS = ((fetch_on_demand.fod_forward_kernel, {"OFFSETS_P2": 32}), (fetch_on_demand.fod_forward_owned_kernel, {}),
                (fetch_on_demand.fod_wgrad_kernel, {}),
                (implicit_gemm.ig_forward_kernel, {"SORTED": False, **PLAN}),
                (implicit_gemm.ig_forward_kernel, {"SORTED": True, **PLAN}),
                (implicit_gemm.ig_wgrad_kernel, {"SORTED": False, **PLAN}),
                (implicit_gemm.ig_wgrad_kernel, {"SORTED": True, **PLAN}))
ROW_KERNELS = (gather_scatter.gather_rows_kernel, gather_scatter.scatter_add_rows_kernel)
# Kernels with one fixed launch shape: the implicit GEMM's flags of non-finite weight offsets
# (implicit_gemm.nonfinite_offsets) and the launch that adds those offsets.
_NONFINITE_FIX = {**PLAN, "BLOCK_M": implicit_gemm.NONFINITE_BLOCK_M, "BLOCK_N": implicit_gemm.NONFINITE_BLOCK_N,
                  "SUBTILES": implicit_gemm.NONFINITE_SUBTILES}
FIXED_KERNELS = (
    (common.nonfinite_rows_kernel, {"BLOCK": implicit_gemm.FLAG_BLOCK}, 4, 1),
    (implicit_gemm.ig_nonfinite_kernel, {"SORTED": False, **_NONFINITE_FIX}, 4, 1),
    (implicit_gemm.ig_nonfinite_kernel, {"SORTED": True, **_NONFINITE_FIX}, 4, 1),
)



# The kernel-map kernels: pointer types by name (every other argument a 32-bit integer) and
# the compile-time variants the builders launch (kmap/triton_ops.py), at the GPU program shapes
# for one offset and for the widest offset block.
KMAP_POINTERS = {
    "coords_ptr": "*i32", "keys_ptr": "*i64", "vals_ptr": "*i32", "out_in_ptr": "*i32", "flags_ptr": "*i32",
    "cand_ptr": "*i64", "sorted_ptr": "*i64", "heads_ptr": "*i32", "ranks_ptr": "*i64", "out_keys_ptr": "*i64",
    "out_coords_ptr": "*i32", "table_ptr": "*i32", "counts_ptr": "*i64", "own_ptr": "*i64",
    "range_flag_ptr": "*i64", "ends_ptr": "*i64", "in_idx_ptr": "*i32", "out_idx_ptr": "*i32",
    "offsets_ptr": "*i64", "in_out_ptr": "*i32",
}
KMAP_1D = (kmap.hash_insert_kernel, kmap.pack_check_kernel, kmap.adjacent_repeat_kernel, kmap.sorted_heads_kernel,
           kmap.scatter_heads_kernel)
_NEW_SETS = ((kmap.READ_BY, False, True), (kmap.READ_BY, True, True), (kmap.FLOOR, False, False),
             (kmap.WRITES, False, True), (kmap.WRITES, True, True))
_LOOKUPS = ((kmap.READ_BY, False, False), (kmap.READ_BY, True, False), (kmap.WRITES, False, True),
            (kmap.WRITES, True, True))
KMAP_2D = ((kmap.submanifold_query_kernel, [{}]),
           (kmap.candidate_keys_kernel, [dict(RELATION=r, CLIP=c, STRICT=s) for r, c, s in _NEW_SETS]),
           (kmap.candidate_lookup_kernel, [dict(RELATION=r, CLIP=c, ROWS_ARE_INPUTS=i) for r, c, i in _LOOKUPS]),
           (kmap.pair_count_kernel, [dict(IDENTITY=True), dict(IDENTITY=False)]),
           (kmap.pair_write_kernel, [{}]), (kmap.transpose_kernel, [{}]))


@dataclass(frozen=True)
class Instantiation:
    name: str          # kernel[variant]/mode/tile
    fn: object         # the @triton.jit function
    signature: Dict[str, str]
    constexprs: Dict[str, object]
    attrs: Dict[Tuple[int, ...], list]
    num_warps: int
    num_stages: int
    precision: str


def _signature(fn, feature: str, acc: str, out_role: str):
    params = list(inspect.signature(fn.fn).parameters.values())
    signature, attrs = {}, {}
    for i, p in enumerate(params):
        if p.annotation is not inspect.Parameter.empty and "constexpr" in str(p.annotation):
            signature[p.name] = "constexpr"
            continue
        if p.name in POINTERS or p.name in ("out_ptr", "dw_ptr"):
            role = out_role if p.name in ("out_ptr", "dw_ptr") else POINTERS[p.name]
            signature[p.name] = {"feats": f"*{feature}", "acc": f"*{acc}"}.get(role, role)
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[p.name] = "i32"
    return signature, attrs


def _kmap_signature(fn):
    signature, attrs = {}, {}
    for i, p in enumerate(inspect.signature(fn.fn).parameters.values()):
        if p.annotation is not inspect.Parameter.empty and "constexpr" in str(p.annotation):
            signature[p.name] = "constexpr"
        elif p.name in KMAP_POINTERS:
            signature[p.name] = KMAP_POINTERS[p.name]
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[p.name] = "i32"
    return signature, attrs


def kmap_instantiations() -> Iterator[Instantiation]:
    """The kernel-map kernels (no float modes)."""
    from ...kmap.triton_ops import GPU_BLOCK, GPU_TILE_LANES, GPU_TILE_OFFSETS
    for fn in KMAP_1D:
        signature, attrs = _kmap_signature(fn)
        yield Instantiation(f"{fn.fn.__name__}/kmap", fn, signature, {"BLOCK": GPU_BLOCK}, attrs, 4, 2, "ieee")
    for fn, variants in KMAP_2D:
        signature, attrs = _kmap_signature(fn)
        for fixed in variants:
            variant = "".join(f"[{k.lower()}={int(v)}]" for k, v in fixed.items())
            for block_k in (1, GPU_TILE_OFFSETS):
                constexprs = dict(fixed, BLOCK_R=GPU_TILE_LANES // block_k, BLOCK_K=block_k)
                yield Instantiation(f"{fn.fn.__name__}{variant}/kmap/k{block_k}", fn, signature, constexprs, attrs,
                                    4, 2, "ieee")


def _out_roles(fn, feature: str, acc: str):
    """The distinct output types of a kernel in one mode (fp32 partials of fp32 are the output type)."""
    roles = OUTPUTS[fn.fn.__name__]
    return roles[:1] if feature == acc else roles


def instantiations() -> Iterator[Instantiation]:
    yield from kmap_instantiations()
    for label, feature, acc, precision, tile_mode in MODES:
        tiles = tiles_for(tile_mode)
        for fn, fixed in GEMM_KERNELS:
            for out_role in _out_roles(fn, feature, acc):
                signature, attrs = _signature(fn, feature, acc, out_role)
                variant = "".join(f"[{k.lower()}]" for k, v in fixed.items() if v is True)
                variant += "[partials]" if len(OUTPUTS[fn.fn.__name__]) > 1 and out_role == "acc" else ""
                for t in tiles:
                    constexprs = dict(fixed, BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k,
                                      PRECISION=precision, UPCAST=False)
                    yield Instantiation(f"{fn.fn.__name__}{variant}/{label}/{t.name}", fn, signature, constexprs,
                                        attrs, t.num_warps, t.num_stages, precision)
        if label == "tf32":
            continue  # the row kernels do no arithmetic beyond an add: fp32 covers them
        for fn, fixed, warps, stages in FIXED_KERNELS:
            for out_role in (_out_roles(fn, feature, acc) if fn.fn.__name__ in OUTPUTS else ("feats",)):
                signature, attrs = _signature(fn, feature, acc, out_role)
                variant = "".join(f"[{k.lower()}]" for k, v in fixed.items() if v is True)
                variant += "[partials]" if fn.fn.__name__ in OUTPUTS and out_role == "acc" else ""
                yield Instantiation(f"{fn.fn.__name__}{variant}/{label}", fn, signature, dict(fixed), attrs, warps,
                                    stages, "ieee")
        for fn in ROW_KERNELS:
            signature, attrs = _signature(fn, feature, acc, OUTPUTS[fn.fn.__name__][0])
            constexprs = dict(BLOCK_R=gather_scatter.BLOCK_ROWS, BLOCK_C=gather_scatter.BLOCK_CHANNELS)
            yield Instantiation(f"{fn.fn.__name__}/{label}", fn, signature, constexprs, attrs, 4, 2, "ieee")
