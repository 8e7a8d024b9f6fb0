"""Sparse 3-D convolution: argument checks, kernel-map selection and dataflow dispatch.

Output q reads input p = q*s - pad + delta*d through weight row delta (see kernel_offsets);
the variants differ only in the output set Q (see docs/semantics.md).
"""
from typing import Optional

import torch

from ... import backends
from ...kmap import (ConvGeometry, KernelMap, generative_map, strided_map, submanifold_map,
                     transposed_source_map)
from ...kmap.geometry import IntOr3
from ...tensor import SparseTensor
from .config import ConfigLike, PassConfigs, layer_kind, resolve_for_call
from .cpu_half import computes_in_float32, widened
from .dataflows import OrientedMap, sparse_conv
from .epilogue import Epilogue, forward_with_epilogue, pointwise_forward

# Per (device type, backend); the Triton kernels take the same dtypes on every device. float16 on
# the CPU computes in float32 (cpu_half.py).
SUPPORTED_DTYPES = {("cpu", "native"): (torch.float32, torch.float64, torch.float16, torch.bfloat16),
                    ("cuda", "native"): (torch.float32, torch.float64, torch.float16, torch.bfloat16),
                    ("cpu", "triton"): (torch.float32, torch.float64, torch.float16, torch.bfloat16),
                    ("cuda", "triton"): (torch.float32, torch.float64, torch.float16, torch.bfloat16)}


def _check_operands(input: SparseTensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                    geometry: ConvGeometry):
    if not isinstance(input, SparseTensor):
        raise TypeError(f"input must be a SparseTensor, got {type(input).__name__}")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 3:
        raise ValueError("weight must be a [K, C_in, C_out] tensor, got "
                         f"{list(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__}")
    if weight.shape[0] != geometry.volume:
        raise ValueError(f"weight has {weight.shape[0]} kernel offsets but kernel_size "
                         f"{geometry.kernel_size} has {geometry.volume}")
    if weight.shape[1] != input.num_channels:
        raise ValueError(f"channel mismatch: the input has {input.num_channels} channels but the "
                         f"weight expects {weight.shape[1]}")
    if weight.device != input.device:
        raise ValueError(f"weight is on {weight.device} but the input is on {input.device}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != weight.shape[2]):
        raise ValueError(f"bias must have shape [{weight.shape[2]}], got {list(bias.shape)}")


def _cast_operands(feats: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], configs: PassConfigs):
    device_type = feats.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        feats, weight = feats.to(dtype), weight.to(dtype)
        bias = None if bias is None else bias.to(dtype)
    for backend in sorted({configs.forward.backend, configs.dgrad.backend, configs.wgrad.backend}):
        supported = SUPPORTED_DTYPES.get((backends.decision_device_type(feats.device), backend), ())
        if feats.dtype not in supported:
            raise TypeError(f"sparse conv on {device_type} with the {backend} backend supports "
                            f"{[str(d) for d in supported]}, got {feats.dtype}")
    if weight.dtype != feats.dtype:
        raise TypeError(f"weight dtype {weight.dtype} does not match input dtype {feats.dtype}")
    if bias is not None and bias.dtype != feats.dtype:  # else out + bias would promote the output
        raise TypeError(f"bias dtype {bias.dtype} does not match input dtype {feats.dtype}")
    return feats, weight, bias


def _run(configs: PassConfigs, text: str, feats, weight, bias, kmap: KernelMap, transposed: bool,
         epilogue: Optional[Epilogue]) -> torch.Tensor:
    if computes_in_float32(feats, configs):
        return _run(configs, text, *widened(feats, weight, bias), kmap, transposed, epilogue).to(feats.dtype)
    view = OrientedMap(kmap, transposed)
    if epilogue is not None:
        return forward_with_epilogue(configs, text, feats, weight, bias, view, epilogue)
    out = sparse_conv(feats, weight, view, configs, text, backends.deterministic, backends.allow_tf32)
    return out if bias is None else out + bias


def _finer_stride(input: SparseTensor, geometry: ConvGeometry):
    if any(t % s for t, s in zip(input.s, geometry.stride)):
        raise ValueError(f"a transposed conv with stride {geometry.stride} on a tensor at stride "
                         f"{input.s} would make the tensor stride fractional")
    return tuple(t // s for t, s in zip(input.s, geometry.stride))


def _prepared(input: SparseTensor, weight: torch.Tensor, bias: Optional[torch.Tensor], geometry: ConvGeometry,
              config: Optional[ConfigLike], submanifold: bool):
    """Checked operands, cast as autocast and the configs' backends need, and the configs (a
    ``submanifold`` layer's: outputs on its input coordinates)."""
    _check_operands(input, weight, bias, geometry)
    layer = layer_kind(submanifold, weight.shape[1], weight.shape[2])
    configs, text = resolve_for_call(config, input.device, layer)
    return (configs, text, *_cast_operands(input.F, weight, bias, configs))


def conv3d(input: SparseTensor, weight: torch.Tensor, kernel_size: IntOr3,
           bias: Optional[torch.Tensor] = None, stride: IntOr3 = 1, dilation: IntOr3 = 1,
           padding: Optional[IntOr3] = None, transposed: bool = False, generative: bool = False,
           downsample_mode: str = "spconv", config: Optional[ConfigLike] = None,
           epilogue: Optional[Epilogue] = None) -> SparseTensor:
    """Sparse convolution of ``input`` with ``weight [K, C_in, C_out]``.

    - stride 1: submanifold, outputs on the input coordinates;
    - stride > 1: strided, output set by ``downsample_mode`` ('spconv' or 'minkowski');
    - ``transposed``: the exact transpose of the strided conv with the same geometry that made
      ``input``'s coordinates; outputs on the finer coordinates it came from;
    - ``transposed`` and ``generative``: outputs on every site conv_transpose3d writes.

    ``padding=None`` centres odd kernels (d*(k-1)/2) and uses 0 for even ones. ``config`` picks
    the dataflow of each pass (a ConvConfig, or forward/dgrad/wgrad configs); None uses the
    global default (see nn.functional.config). ``epilogue`` adds a residual and applies ReLU
    after the bias (what eval-time fusion, ``torchsparse_pp.nn.fuse``, runs; see
    nn.functional.epilogue).
    """
    geometry = ConvGeometry.make(kernel_size, stride, dilation, padding)
    return conv3d_with_geometry(input, weight, geometry, bias, transposed, generative, downsample_mode, config, epilogue)


def conv3d_with_geometry(input: SparseTensor, weight: torch.Tensor, geometry: ConvGeometry,
                         bias: Optional[torch.Tensor] = None, transposed: bool = False, generative: bool = False,
                         downsample_mode: str = "spconv", config: Optional[ConfigLike] = None,
                         epilogue: Optional[Epilogue] = None) -> SparseTensor:
    """conv3d with a ConvGeometry made beforehand (what the modules call: their geometry is
    checked once, when they are built)."""
    if generative and not transposed:
        raise ValueError("generative=True needs transposed=True (it is a generative transposed conv)")
    submanifold = geometry.is_unit_stride and not generative
    configs, text, feats, weight, bias = _prepared(input, weight, bias, geometry, config, submanifold)
    cache, coords = input.cache, input.C
    stride_out, range_out = input.s, input.spatial_range

    if epilogue is not None:
        epilogue.check(weight.shape[2], input.device)
    if geometry.is_pointwise:
        # Every output reads only its own row: no map needed.
        out = pointwise_forward(configs, feats, weight, bias, epilogue)
    elif not transposed:
        if geometry.is_unit_stride:
            kmap = submanifold_map(cache, coords, geometry, input.spatial_range)
        else:
            kmap = strided_map(cache, coords, geometry, downsample_mode, input.spatial_range)
            stride_out = tuple(t * s for t, s in zip(input.s, geometry.stride))
        out = _run(configs, text, feats, weight, bias, kmap, False, epilogue)
        coords, range_out = kmap.out_coords, kmap.out_range
    else:
        stride_out = _finer_stride(input, geometry)
        if generative:
            kmap = generative_map(cache, coords, geometry, input.spatial_range)
        elif geometry.is_unit_stride:
            kmap = submanifold_map(cache, coords, geometry, input.spatial_range)
        else:
            kmap = transposed_source_map(cache, coords, geometry)
            if kmap is None:
                raise ValueError(
                    f"transposed conv (kernel_size={geometry.kernel_size}, stride={geometry.stride}, "
                    f"dilation={geometry.dilation}, padding={geometry.padding}) on a tensor at stride "
                    f"{input.s} has no matching strided conv: no conv with this geometry produced these "
                    "coordinates in this network pass. Run the matching strided conv first, or use "
                    "generative=True to create new coordinates.")
        out = _run(configs, text, feats, weight, bias, kmap, True, epilogue)
        coords, range_out = kmap.in_coords, kmap.in_range
    return SparseTensor._derive(out, coords, stride_out, range_out, cache)


def conv3d_over_map(input: SparseTensor, weight: torch.Tensor, kmap: KernelMap, bias: Optional[torch.Tensor] = None,
                    transposed: bool = False, config: Optional[ConfigLike] = None) -> SparseTensor:
    """The conv over a kernel map built beforehand (``kmap.in_coords`` are ``input``'s
    coordinates; with ``transposed``, ``kmap.out_coords`` are, and the outputs are the map's
    inputs). For output sets conv3d does not pick by itself, such as spconv's regular
    stride-1 conv (every site some input reaches, where conv3d's stride 1 is submanifold)."""
    source = kmap.out_coords if transposed else kmap.in_coords
    if not isinstance(input, SparseTensor) or input.C is not source:
        raise ValueError("conv3d_over_map: the input's coordinates must be the map's "
                         f"{'output' if transposed else 'input'} coordinates (the same tensor)")
    geometry = kmap.geometry
    configs, text, feats, weight, bias = _prepared(input, weight, bias, geometry, config,
                                                   kmap.mode == "submanifold")
    out = _run(configs, text, feats, weight, bias, kmap, transposed, None)
    if transposed:
        return SparseTensor._derive(out, kmap.in_coords, _finer_stride(input, geometry), kmap.in_range, input.cache)
    stride = tuple(t * s for t, s in zip(input.s, geometry.stride))
    return SparseTensor._derive(out, kmap.out_coords, stride, kmap.out_range, input.cache)
