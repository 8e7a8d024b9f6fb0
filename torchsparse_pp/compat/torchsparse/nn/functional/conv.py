"""torchsparse 2.1's conv3d semantics over torchsparse_pp's conv3d.

What 2.1 does (its default 'hashmap_on_the_fly' kernel maps), and so what this adapter does:
- output q reads input p = q*s - pad + delta with delta in [0, k) per axis (no dilation);
- the weight row of delta = (i, j, l) is x-fastest, ``(l*ky + j)*kx + i``, when the kernel
  volume is odd, and z-fastest, ``(i*ky + j)*kz + l`` (ours), when it is even;
- stride 1: pad = (k-1)/2 when the kernel volume is odd, else 0, whatever ``padding`` says;
- stride > 1: pad = ``padding`` as given; outputs are clipped to [0, (size + 2*pad - k)//s]
  per axis, size from ``spatial_range`` or, without one, max(input coordinate) + 1;
- a 1x1x1 stride-1 kernel is ``[C_in, C_out]`` (a plain matmul);
- a transposed conv reuses the map of the strided conv cached under 2.1's key
  (tensor stride, kernel size, stride, dilation), i.e. that conv's padding, and lands on its inputs;
- where the features or the kernel are float16, both are cast to float16 and the output is
  float16 (the bias is added into it, as 2.1's ``feats += bias``); the 1x1x1 stride-1 conv is
  2.1's plain ``feats.matmul(weight)``, which takes one dtype.
"""
from typing import NamedTuple, Optional, Tuple

import torch

from .....kmap import ConvGeometry, strided_map, submanifold_map
from .....nn.functional import conv3d as library_conv3d
from .....tensor import SparseTensor as LibraryTensor
from ...tensor import SparseTensor
from ...utils.utils import make_ntuple
from .conv_config import library_configs


def offset_order(kernel_size: Tuple[int, int, int], device=None) -> torch.Tensor:
    """Rows of a 2.1 kernel in our (z-fastest) offset order: ``ours = kernel[offset_order(k)]``."""
    kx, ky, kz = kernel_size
    rows = torch.arange(kx * ky * kz, device=device)
    if (kx * ky * kz) % 2 == 0:
        return rows  # even volumes are z-fastest in 2.1 too
    return rows.reshape(kz, ky, kx).permute(2, 1, 0).reshape(-1)


def library_kernel(weight: torch.Tensor, kernel_size) -> torch.Tensor:
    return weight.index_select(0, offset_order(tuple(kernel_size), weight.device))


def submanifold_padding(kernel_size) -> Tuple[int, int, int]:
    """2.1's stride-1 maps are centred for odd kernel volumes and start at the output otherwise."""
    odd = (kernel_size[0] * kernel_size[1] * kernel_size[2]) % 2 == 1
    return tuple((k - 1) // 2 if odd else 0 for k in kernel_size)  # type: ignore


def _check_input(input: SparseTensor) -> None:
    coords, feats = input.coords, input.feats
    if not isinstance(coords, torch.Tensor) or coords.dim() != 2 or coords.shape[1] != 4:
        raise ValueError("a convolution needs coords [N, 4] = (batch, x, y, z); per-sample [N, 3] coords get "
                         f"their batch column from sparse_collate. Got {tuple(getattr(coords, 'shape', ()))}")
    if coords.dtype != torch.int32:
        raise TypeError(f"coords must be int32 (torch.int), got {coords.dtype}")
    if coords.shape[0] and int(coords[:, 1:].min()) < 0:
        raise ValueError("torchsparse 2.1 needs coordinates >= 0 (its kernel maps clip at 0); shift them, or use "
                         "torchsparse_pp.SparseTensor, which takes any signed range")


def _operands(feats: torch.Tensor, weight: torch.Tensor):
    """2.1's conv functions compute in float16 when either operand is float16."""
    if torch.float16 in (feats.dtype, weight.dtype):
        return feats.half(), weight.half()
    return feats, weight


def _check_matmul_dtypes(feats: torch.Tensor, weight: torch.Tensor) -> None:
    if feats.dtype != weight.dtype and not torch.is_autocast_enabled(feats.device.type):
        raise TypeError(f"a 1x1x1 stride-1 conv is torchsparse 2.1's feats.matmul(kernel), which needs one dtype: got "
                        f"{feats.dtype} features and a {weight.dtype} kernel (on GPUs 2.1's users rely on CUDA "
                        "autocast to cast them, which does nothing on the CPU: convert the model, e.g. model.half(), "
                        "or use torch.autocast('cpu', dtype=...))")


def _with_bias(feats: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """2.1's in-place ``feats += bias``: the sum in the features' dtype."""
    return feats if bias is None else (feats + bias).to(feats.dtype)


def _output_range(spatial_range, kernel_size, stride, padding) -> Optional[Tuple[int, ...]]:
    if spatial_range is None:
        return None
    sizes = [(n + 2 * p - (k - 1) - 1) // s + 1
             for n, k, s, p in zip(spatial_range[1:], kernel_size, stride, padding)]
    return tuple(spatial_range[:1]) + tuple(sizes)


def _clip_range(input: SparseTensor) -> Tuple[int, int, int]:
    """The range 2.1 clips strided outputs by: spatial_range, else max coordinate + 1."""
    if input.spatial_range is not None:
        return tuple(input.spatial_range[1:])  # type: ignore
    return tuple(int(v) + 1 for v in input.coords[:, 1:].amax(0).tolist())  # type: ignore


class EmptyMap(NamedTuple):
    """What a strided conv leaves when 2.1's clipping leaves it no outputs (or it had no inputs):
    its transpose writes only the bias onto ``in_coords``."""
    in_coords: torch.Tensor
    out_coords: torch.Tensor


def _empty_strided(input: SparseTensor, kernel, key, stride, out_range) -> SparseTensor:
    out_coords = input.coords.new_zeros(0, 4)
    input._caches.kmaps.setdefault(key, EmptyMap(input.coords, out_coords))
    feats = kernel.new_zeros(0, kernel.shape[2]) + kernel.sum() * 0  # still on the autograd graph
    return _derived(feats, out_coords, tuple(a * b for a, b in zip(input.stride, stride)), out_range, input._caches)


def _derived(feats, coords, stride, spatial_range, caches) -> SparseTensor:
    output = SparseTensor(feats, coords, stride, spatial_range)
    output._caches = caches
    caches.cmaps.setdefault(output.stride, (output.coords, output.spatial_range))
    return output


def conv3d(input: SparseTensor, weight: torch.Tensor, kernel_size, bias: Optional[torch.Tensor] = None,
           stride=1, padding=0, dilation=1, config=None, transposed: bool = False, generative: bool = False,
           training: bool = False) -> SparseTensor:
    """2.1's functional conv3d (see the module docstring). ``training`` only tuned 2.1's CUDA
    backward maps; results do not depend on it."""
    kernel_size, stride = make_ntuple(kernel_size, 3), make_ntuple(stride, 3)
    dilation, padding = make_ntuple(dilation, 3), make_ntuple(padding, 3)
    if dilation != (1, 1, 1):
        raise NotImplementedError(f"dilation {dilation}: torchsparse 2.1 builds its kernel maps without dilation "
                                  "(it would be ignored); use torchsparse_pp.nn.Conv3d(dilation=...)")
    if generative:
        raise NotImplementedError("generative convs need torchsparse 2.1's 'hashmap' kmap mode, which the adapter "
                                  "does not implement; use torchsparse_pp.nn.Conv3d(transposed=True, generative=True)")
    _check_input(input)
    configs = library_configs(config)
    caches = input._caches
    if kernel_size == (1, 1, 1) and stride == (1, 1, 1):
        if weight.dim() != 2:
            raise ValueError(f"a 1x1x1 stride-1 kernel is [C_in, C_out] in torchsparse 2.1, got {tuple(weight.shape)}")
        _check_matmul_dtypes(input.feats, weight)
        feats = _with_bias(input.feats.matmul(weight), bias)
        return _derived(feats, input.coords, input.stride, input.spatial_range, caches)
    if weight.dim() != 3:
        raise ValueError(f"weight must be [K, C_in, C_out] for kernel_size {kernel_size}, got {tuple(weight.shape)}")
    feats, weight = _operands(input.feats, weight)
    kernel = library_kernel(weight, kernel_size)
    if transposed:
        return _transposed(input, feats, kernel, kernel_size, stride, dilation, bias, configs)

    key = (input.stride, kernel_size, stride, dilation)
    if stride == (1, 1, 1):
        centred = submanifold_padding(kernel_size)
        if any(p not in (0, c) for p, c in zip(padding, centred)):
            raise ValueError(f"padding {padding} at stride 1: torchsparse 2.1 uses {centred} there and would ignore it")
        if input.coords.shape[0] == 0:
            empty = feats.new_zeros(0, kernel.shape[2]) + kernel.sum() * 0
            return _derived(empty, input.coords, input.stride, input.spatial_range, caches)
        geometry = ConvGeometry.make(kernel_size, 1, 1, centred)
        lib_in = LibraryTensor._derive(feats, input.coords, input.stride, None, caches.library)
        lib_out = library_conv3d(lib_in, kernel, kernel_size, None, 1, 1, centred, config=configs)
        kmap = submanifold_map(caches.library, input.coords, geometry, None)
        out_stride = input.stride
    else:
        geometry = ConvGeometry.make(kernel_size, stride, 1, padding)
        out_range = _output_range(input.spatial_range, kernel_size, stride, padding)
        clip = _clip_range(input) if input.coords.shape[0] else None
        if clip is None or min(geometry.dense_output_size(clip)) < 1:
            return _empty_strided(input, kernel, key, stride, out_range)  # 2.1's clip range holds no site
        lib_in = LibraryTensor._derive(feats, input.coords, input.stride, clip, caches.library)
        lib_out = library_conv3d(lib_in, kernel, kernel_size, None, stride, 1, padding, config=configs)
        kmap = strided_map(caches.library, input.coords, geometry, "spconv", lib_in.spatial_range)
        out_stride = tuple(a * b for a, b in zip(input.stride, stride))
    caches.kmaps.setdefault(key, kmap)
    out_range = _output_range(input.spatial_range, kernel_size, stride, padding)
    return _derived(_with_bias(lib_out.F, bias), lib_out.C, out_stride, out_range, caches)


def _empty_transposed(input: SparseTensor, kmap: EmptyMap, kernel, bias, fine_stride) -> SparseTensor:
    feats = _with_bias(kernel.new_zeros(kmap.in_coords.shape[0], kernel.shape[2]) + kernel.sum() * 0, bias)
    recorded = input._caches.cmaps.get(fine_stride)
    fine_range = recorded[1] if recorded is not None and recorded[0] is kmap.in_coords else None
    return _derived(feats, kmap.in_coords, fine_stride, fine_range, input._caches)


def _transposed(input: SparseTensor, feats, kernel, kernel_size, stride, dilation, bias, configs) -> SparseTensor:
    caches = input._caches
    if any(t % s for t, s in zip(input.stride, stride)):
        raise ValueError(f"transposed conv with stride {stride} on a tensor at stride {input.stride}")
    fine_stride = tuple(t // s for t, s in zip(input.stride, stride))
    kmap = caches.kmaps.get((fine_stride, kernel_size, stride, dilation))
    if kmap is None:
        raise ValueError(f"transposed conv (kernel_size={kernel_size}, stride={stride}): no conv with that kernel "
                         f"size and stride ran on the tensors at stride {fine_stride} of this pass (torchsparse 2.1 "
                         "reuses that conv's map)")
    if isinstance(kmap, EmptyMap):
        if input.coords.shape[0] != 0:
            raise ValueError("transposed conv: the conv whose map it reuses had no outputs, but the input has rows")
        return _empty_transposed(input, kmap, kernel, bias, fine_stride)
    coarse = kmap.out_coords
    if input.coords is not coarse and not (input.coords.shape == coarse.shape and torch.equal(input.coords, coarse)):
        raise ValueError("transposed conv: the input's coordinates are not the outputs of the conv whose map it "
                         f"reuses ({input.coords.shape[0]} rows vs {coarse.shape[0]})")
    g = kmap.geometry
    lib_in = LibraryTensor._derive(feats, coarse, input.stride, kmap.out_range, caches.library)
    lib_out = library_conv3d(lib_in, kernel, kernel_size, None, g.stride, g.dilation, g.padding, transposed=True,
                             config=configs)
    recorded = caches.cmaps.get(fine_stride)
    fine_range = recorded[1] if recorded is not None and recorded[0] is lib_out.C else None
    return _derived(_with_bias(lib_out.F, bias), lib_out.C, fine_stride, fine_range, caches)
