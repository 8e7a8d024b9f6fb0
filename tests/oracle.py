"""Dense reference for sparse convolution, independent of the library under test.

Sparse inputs are scattered into a dense float64 grid, convolved with
torch.nn.functional.conv3d / conv_transpose3d, and read back at the requested output
coordinates. Output coordinate sets are derived from dense occupancy grids the same way.

Frame: along each axis the dense grid starts at coordinate ``o = m*s - pad``, where m is the
smallest coarse coordinate of interest. Then dense index j of the strided side is coordinate
``j + m`` and dense index u of the fine side is coordinate ``u + o``, which is exactly the
relation ``p = q*s - pad + delta*d`` of the sparse conv.
"""
from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

Triple = Tuple[int, int, int]


def _t(v) -> Triple:
    return (v, v, v) if isinstance(v, int) else tuple(v)


def dense_weight(weight: torch.Tensor, kernel_size, transposed: bool) -> torch.Tensor:
    """[K, C_in, C_out] -> conv3d [C_out, C_in, kx, ky, kz] or conv_transpose3d [C_in, C_out, ...]."""
    kx, ky, kz = _t(kernel_size)
    w = weight.reshape(kx, ky, kz, weight.shape[1], weight.shape[2])
    return w.permute(3, 4, 0, 1, 2) if transposed else w.permute(4, 3, 0, 1, 2)


def sparse_weight(dense: torch.Tensor, transposed: bool) -> torch.Tensor:
    """Inverse of dense_weight: conv3d / conv_transpose3d weight -> [K, C_in, C_out]."""
    if transposed:
        return dense.permute(2, 3, 4, 0, 1).reshape(-1, dense.shape[0], dense.shape[1])
    return dense.permute(2, 3, 4, 1, 0).reshape(-1, dense.shape[1], dense.shape[0])


def _floordiv(a: int, b: int) -> int:
    return a // b


class Frame:
    """Per-axis dense frame covering fine coordinates in [fine_lo, fine_hi] and coarse ones in
    [coarse_lo, coarse_hi] for a conv of the given geometry."""

    def __init__(self, fine_lo, fine_hi, coarse_lo, coarse_hi, kernel_size, stride, dilation, padding):
        self.k, self.s, self.d, self.p = _t(kernel_size), _t(stride), _t(dilation), _t(padding)
        self.m = [min(_floordiv(fl + p, s), cl) for fl, cl, s, p in zip(fine_lo, coarse_lo, self.s, self.p)]
        self.o = [m * s - p for m, s, p in zip(self.m, self.s, self.p)]
        self.coarse_size = [ch - m + 1 for ch, m in zip(coarse_hi, self.m)]
        # The fine grid must hold every input the coarse grid reads, and every fine coordinate.
        self.fine_size = [max(fh - o + 1, (cs - 1) * s + d * (k - 1) + 1)
                          for fh, o, cs, s, d, k in zip(fine_hi, self.o, self.coarse_size, self.s, self.d, self.k)]

    def fine_index(self, coords: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        c = coords.long()
        return (c[:, 0],) + tuple(c[:, 1 + a] - self.o[a] for a in range(3))

    def coarse_index(self, coords: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        c = coords.long()
        return (c[:, 0],) + tuple(c[:, 1 + a] - self.m[a] for a in range(3))


def _bounds(coords: torch.Tensor):
    c = coords.long()
    return c[:, 1:].amin(0).tolist(), c[:, 1:].amax(0).tolist()


def _scatter(values: torch.Tensor, index, batch: int, size) -> torch.Tensor:
    grid = values.new_zeros(batch, *size, values.shape[1])
    grid = grid.index_put(index, values)
    return grid.permute(0, 4, 1, 2, 3)


def _gather(grid: torch.Tensor, index) -> torch.Tensor:
    g = grid.permute(0, 2, 3, 4, 1)
    sizes = g.shape[1:4]
    # Sites outside the computed grid receive nothing.
    pad = [max(0, int(i.max()) + 1 - n) if i.numel() else 0 for i, n in zip(index[1:], sizes)]
    if any(pad):
        g = F.pad(g, (0, 0, 0, pad[2], 0, pad[1], 0, pad[0]))
    return g[index]


def reference_conv(in_coords: torch.Tensor, feats: torch.Tensor, weight: torch.Tensor,
                   out_coords: torch.Tensor, kernel_size, stride=1, dilation=1, padding=0,
                   transposed: bool = False) -> torch.Tensor:
    """Dense conv3d (or conv_transpose3d when ``transposed``) restricted to ``out_coords``.

    Not transposed: inputs are the fine side, out[q] = sum W[delta] in[q*s - pad + delta*d].
    Transposed: inputs are the coarse side, out[p] = sum over (q, delta) with that relation.
    Differentiable in ``feats`` and ``weight``.
    """
    if in_coords.shape[0] == 0 or out_coords.shape[0] == 0:
        # An empty sum: zeros, still connected to the graph so gradients (zeros) flow.
        anchor = feats.sum() * 0 + weight.sum() * 0
        return anchor + feats.new_zeros(out_coords.shape[0], weight.shape[2])
    w = dense_weight(weight, kernel_size, transposed)
    return _dense_conv(in_coords, feats, w, out_coords, kernel_size, stride, dilation, padding, transposed, 1)


def reference_conv_by_offset(in_coords: torch.Tensor, feats: torch.Tensor, weight: torch.Tensor,
                             out_coords: torch.Tensor, kernel_size, stride=1, dilation=1, padding=0,
                             transposed: bool = False) -> torch.Tensor:
    """Each offset's part of reference_conv, ``[K, N_out, C_out]`` (their sum over K is
    reference_conv): one grouped dense conv whose group k sees the input through offset k's
    weight alone. Differentiable in ``feats`` (and so gives each offset's part of the input
    gradient too, as the gradient of a feats.repeat(1, K) leaf)."""
    K, c_in, c_out = weight.shape
    if in_coords.shape[0] == 0 or out_coords.shape[0] == 0:
        return feats.sum() * 0 + feats.new_zeros(K, out_coords.shape[0], c_out)
    groups = []
    for k in range(K):
        only_k = torch.zeros_like(weight)
        only_k[k] = weight[k]
        groups.append(dense_weight(only_k, kernel_size, transposed))
    w = torch.cat(groups, 0)  # conv3d: [K C_out, C_in, ...]; conv_transpose3d: [K C_in, C_out, ...]
    x = feats if feats.shape[1] == K * c_in else feats.repeat(1, K)
    out = _dense_conv(in_coords, x, w, out_coords, kernel_size, stride, dilation, padding, transposed, K)
    return out.reshape(out.shape[0], K, c_out).permute(1, 0, 2)


def _dense_conv(in_coords, feats, w, out_coords, kernel_size, stride, dilation, padding, transposed, groups):
    fine, coarse = (out_coords, in_coords) if transposed else (in_coords, out_coords)
    flo, fhi = _bounds(fine)
    clo, chi = _bounds(coarse)
    frame = Frame(flo, fhi, clo, chi, kernel_size, stride, dilation, padding)
    batch = int(max(in_coords[:, 0].max(), out_coords[:, 0].max())) + 1
    if not transposed:
        x = _scatter(feats, frame.fine_index(in_coords), batch, frame.fine_size)
        y = F.conv3d(x, w, stride=frame.s, dilation=frame.d, groups=groups)
        return _gather(y, frame.coarse_index(out_coords))
    x = _scatter(feats, frame.coarse_index(in_coords), batch, frame.coarse_size)
    y = F.conv_transpose3d(x, w, stride=frame.s, dilation=frame.d, groups=groups)
    return _gather(y, frame.fine_index(out_coords))


def _sites(grid: torch.Tensor, offset) -> torch.Tensor:
    idx = (grid[:, 0] > 0.5).nonzero()
    return torch.cat([idx[:, :1], idx[:, 1:] + torch.tensor(offset)], dim=1).int()


def sort_coords(coords: torch.Tensor) -> torch.Tensor:
    """Lexicographic (batch, x, y, z) order."""
    c = coords.long()
    key = c[:, 0]
    for a in range(1, 4):
        key = key * (1 << 17) + (c[:, a] + (1 << 16))
    return coords[torch.argsort(key)]


def reference_output_coords(coords: torch.Tensor, kernel_size, stride, dilation, padding, mode: str,
                            spatial_range: Optional[Sequence[int]] = None) -> torch.Tensor:
    """Output set of a strided ('spconv', 'minkowski') or 'generative' conv, sorted.

    With ``spatial_range`` (the input grid size) the set is clipped to the output grid that
    dense conv3d / conv_transpose3d with this padding produce from that input grid.
    """
    k, s, d, p = _t(kernel_size), _t(stride), _t(dilation), _t(padding)
    batch = int(coords[:, 0].max()) + 1
    lo, hi = _bounds(coords)
    ones = torch.ones(1, 1, *k, dtype=torch.float64)
    occupancy = torch.ones(coords.shape[0], 1, dtype=torch.float64)
    if mode == "minkowski":
        c = coords.long().clone()
        c[:, 1:] = torch.div(c[:, 1:], torch.tensor(s), rounding_mode="floor")
        return sort_coords(torch.unique(c, dim=0).int())
    if mode == "spconv":
        clo = [_floordiv(l + pp - dd * (kk - 1), ss) for l, pp, dd, kk, ss in zip(lo, p, d, k, s)]
        chi = [_floordiv(h + pp, ss) for h, pp, ss in zip(hi, p, s)]
        frame = Frame(lo, hi, clo, chi, k, s, d, p)
        x = _scatter(occupancy, frame.fine_index(coords), batch, frame.fine_size)
        out = _sites(F.conv3d(x, ones, stride=s, dilation=d), frame.m)
    elif mode == "generative":
        flo = [c * ss - pp for c, ss, pp in zip(lo, s, p)]
        fhi = [c * ss - pp + dd * (kk - 1) for c, ss, pp, dd, kk in zip(hi, s, p, d, k)]
        frame = Frame(flo, fhi, lo, hi, k, s, d, p)
        x = _scatter(occupancy, frame.coarse_index(coords), batch, frame.coarse_size)
        out = _sites(F.conv_transpose3d(x, ones, stride=s, dilation=d), frame.o)
    else:
        raise ValueError(mode)
    if spatial_range is not None:
        dense_op = F.conv3d if mode == "spconv" else F.conv_transpose3d
        probe = torch.zeros(1, 1, *spatial_range, dtype=torch.float64)
        r = torch.tensor(dense_op(probe, ones, stride=s, padding=p, dilation=d).shape[2:])
        keep = ((out[:, 1:] >= 0) & (out[:, 1:] < r)).all(1)
        out = out[keep]
    return sort_coords(out)
