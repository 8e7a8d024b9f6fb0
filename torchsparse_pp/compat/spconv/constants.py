"""``spconv.constants``: the switches that client code and spconv's tests read, with spconv
2.3.8's values.

- ``ALL_WEIGHT_IS_KRSC = True``, ``FILTER_HWIO = False``: every conv weight is
  ``[C_out, *kernel, C_in]`` (spconv's tests pick their reference layout from these);
- ``SPCONV_USE_DIRECT_TABLE``: which hash table spconv's GPU implicit-GEMM index generation
  uses (OpenPCDet sets it to False). It changes no result in spconv and none here;
- ``SAVED_WEIGHT_LAYOUT`` (environment ``SPCONV_SAVED_WEIGHT_LAYOUT``): spconv re-lays weights
  in state dicts when it is set; that is not reproduced, so a non-empty value raises on import.
"""
import os

NDIM_DONT_CARE = 3
ALL_WEIGHT_IS_KRSC = True
FILTER_HWIO = False
SPCONV_USE_DIRECT_TABLE = True

SAVED_WEIGHT_LAYOUT = os.getenv("SPCONV_SAVED_WEIGHT_LAYOUT", "")
if SAVED_WEIGHT_LAYOUT:
    raise NotImplementedError(
        f"SPCONV_SAVED_WEIGHT_LAYOUT={SAVED_WEIGHT_LAYOUT!r}: spconv's re-laid state-dict weights are not supported "
        "by torchsparse_pp's spconv adapter (weights are saved and loaded as [C_out, *kernel, C_in]); unset it")
