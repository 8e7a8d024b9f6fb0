"""Per-axis convolution geometry: kernel size, stride, dilation and padding."""
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple, Union

IntOr3 = Union[int, Sequence[int]]
Triple = Tuple[int, int, int]


# The kernel-map ops' limits (csrc/common/kernel_geometry.h, csrc/cpu/kmap_common.h): kernel
# sizes up to 32 per axis; stride, dilation and padding up to 2^20, far beyond the coordinate
# range (x/y/z span 2^16) and small enough that q*s - pad + t*d is exact in int64.
MAX_KERNEL_AXIS = 32
MAX_GEOMETRY_VALUE = 1 << 20


def triple(value: IntOr3, name: str, minimum: int, maximum: Optional[int] = None) -> Triple:
    """Normalises an int or a 3-sequence of ints (x, y, z) and checks the bounds."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int or 3 ints, got {value!r}")
    if isinstance(value, int):
        out = (value, value, value)
    else:
        try:
            out = tuple(int(v) for v in value)
        except TypeError:
            raise TypeError(f"{name} must be an int or 3 ints (x, y, z), got {value!r}") from None
        if len(out) != 3 or any(isinstance(v, bool) or int(v) != v for v in value):
            raise ValueError(f"{name} must be an int or 3 ints (x, y, z), got {value!r}")
    if any(v < minimum for v in out):
        raise ValueError(f"{name} must be >= {minimum} on every axis, got {value!r}")
    if maximum is not None and any(v > maximum for v in out):
        limit = "2^20 = 1048576" if maximum == MAX_GEOMETRY_VALUE else str(maximum)
        raise ValueError(f"{name} must be <= {limit} on every axis, got {value!r}")
    return out  # type: ignore[return-value]


def default_padding(kernel_size: Triple, dilation: Triple) -> Triple:
    """Centred padding d*(k-1)/2 for odd kernels; 0 for even ones, which cannot be centred."""
    return tuple(d * (k - 1) // 2 if k % 2 == 1 else 0 for k, d in zip(kernel_size, dilation))  # type: ignore


@dataclass(frozen=True)
class ConvGeometry:
    kernel_size: Triple
    stride: Triple
    dilation: Triple
    padding: Triple

    @staticmethod
    def make(kernel_size: IntOr3, stride: IntOr3 = 1, dilation: IntOr3 = 1,
             padding: Optional[IntOr3] = None) -> "ConvGeometry":
        ks = triple(kernel_size, "kernel_size", 1, MAX_KERNEL_AXIS)
        dil = triple(dilation, "dilation", 1, MAX_GEOMETRY_VALUE)
        st = triple(stride, "stride", 1, MAX_GEOMETRY_VALUE)
        if padding is None:
            pad = default_padding(ks, dil)
            if max(pad) > MAX_GEOMETRY_VALUE:
                raise ValueError(f"padding must be <= 2^20 = 1048576 on every axis; the centred default "
                                 f"dilation * (kernel_size - 1) / 2 is {pad}: pass padding explicitly")
        else:
            pad = triple(padding, "padding", 0, MAX_GEOMETRY_VALUE)
        return ConvGeometry(ks, st, dil, pad)

    @property
    def volume(self) -> int:
        kx, ky, kz = self.kernel_size
        return kx * ky * kz

    @property
    def is_pointwise(self) -> bool:
        """A 1x1x1 stride-1 unpadded conv: every output reads only its own input row."""
        return self.kernel_size == (1, 1, 1) and self.stride == (1, 1, 1) and self.padding == (0, 0, 0)

    @property
    def is_unit_stride(self) -> bool:
        return self.stride == (1, 1, 1)

    def dense_output_size(self, size: Triple) -> Triple:
        """conv3d output size on a dense grid of ``size``: (n + 2p - d(k-1) - 1)//s + 1."""
        return tuple((n + 2 * p - d * (k - 1) - 1) // s + 1 for n, k, s, d, p in
                     zip(size, self.kernel_size, self.stride, self.dilation, self.padding))  # type: ignore

    def transposed_output_size(self, size: Triple) -> Triple:
        """conv_transpose3d output size (no output_padding): (n-1)s - 2p + d(k-1) + 1."""
        return tuple((n - 1) * s - 2 * p + d * (k - 1) + 1 for n, k, s, d, p in
                     zip(size, self.kernel_size, self.stride, self.dilation, self.padding))  # type: ignore

    def args(self):
        """Positional (kernel_size, stride, dilation, padding) lists for the kernel-map ops."""
        return list(self.kernel_size), list(self.stride), list(self.dilation), list(self.padding)
