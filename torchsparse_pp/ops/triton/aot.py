"""Every kernel instantiation the dataflows (and so the autotuner) can launch, for ahead-of-time
compile checks (tools/triton_check.py). Importing this module imports triton and the kernels.

An instantiation is a kernel, its argument types (the common case: 32-bit sizes and strides,
16-byte aligned pointers, as torch allocations are) and its compile-time constants. Under the
interpreter-only UPCAST switch the compiled kernels keep their own dtype, so it is always off.
"""
import inspect
from dataclasses import dataclass
from typing import Dict, Iterator, Tuple

from . import common, fetch_on_demand, gather_scatter, implicit_gemm
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
    "scatter_add_rows_kernel": ("acc",),
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
# (implicit_gemm.nonfinite_offsets).
FIXED_KERNELS = (
    (common.nonfinite_rows_kernel, {"BLOCK": implicit_gemm.FLAG_BLOCK}, 4, 1),
)


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


def _out_roles(fn, feature: str, acc: str):
    """The distinct output types of a kernel in one mode (fp32 partials of fp32 are the output type)."""
    roles = OUTPUTS[fn.fn.__name__]
    return roles[:1] if feature == acc else roles


def instantiations() -> Iterator[Instantiation]:
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
