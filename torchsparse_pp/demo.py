"""The demo: a generated LiDAR scan through a few sparse conv layers, forward and backward,
with a timing table. (The models issue turns this into a training demo.)"""
import statistics
import time
from typing import List

import torch
from tqdm import tqdm

from . import nn as spnn
from .data import generate_scan
from .tensor import SparseTensor
from .utils import sparse_quantize


def make_scan_tensor(beams: int, voxel: float, seed: int) -> SparseTensor:
    scan = generate_scan(beams, seed=seed)
    coords, index = sparse_quantize(scan["points"][:, :3], voxel, return_index=True)
    coords = torch.cat([torch.zeros(len(coords), 1, dtype=torch.int32), torch.from_numpy(coords)], 1)
    return SparseTensor(torch.from_numpy(scan["points"][index]), coords)


def demo_layers(channels: int) -> List[torch.nn.Module]:
    c = channels
    return [
        spnn.Conv3d(4, c, 3),                              # submanifold stem
        spnn.Conv3d(c, c, 3),
        spnn.Conv3d(c, 2 * c, 2, stride=2),                # k2 s2 downsample
        spnn.Conv3d(2 * c, 2 * c, 3),
        spnn.Conv3d(2 * c, c, 2, stride=2, transposed=True),  # back to the input coordinates
    ]


def _forward(layers, x, times, points=None):
    for layer in layers:
        start = time.perf_counter()
        y = layer(x)
        times.append(time.perf_counter() - start)
        if points is not None:
            points.append((x.num_points, y.num_points))
        x = y
    return x


def _print_table(header, rows):
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    for line in [header] + rows:
        print("  " + "  ".join(cell.rjust(w) for cell, w in zip(line, widths)))


def run_demo(beams: int = 64, voxel: float = 0.05, channels: int = 32, repeats: int = 5, seed: int = 0) -> dict:
    print(f"torchsparse_pp demo: {beams}-beam generated scan, voxel {voxel} m, {torch.get_num_threads()} threads")
    x = make_scan_tensor(beams, voxel, seed)
    print(f"  {x.num_points} voxels")
    torch.manual_seed(seed)
    layers = demo_layers(channels)

    first: List[float] = []
    points: List[tuple] = []
    y = _forward(layers, x, first, points)  # the first pass builds and caches the kernel maps
    y.F.square().mean().backward()
    maps = [kmap.build_seconds for _, kmap in x.cache.maps()]

    per_layer: List[List[float]] = [[] for _ in layers]
    backward = []
    for _ in tqdm(range(repeats), desc="timing", unit="pass"):
        times: List[float] = []
        y = _forward(layers, x, times)
        for i, t in enumerate(times):
            per_layer[i].append(t)
        start = time.perf_counter()
        y.F.square().mean().backward()
        backward.append(time.perf_counter() - start)

    rows = []
    for layer, cold, warm, (n_in, n_out) in zip(layers, first, per_layer, points):
        kind = "transposed" if layer.transposed else ("submanifold" if layer.stride == (1, 1, 1) else "strided")
        rows.append([f"{layer.in_channels}->{layer.out_channels}", "x".join(map(str, layer.kernel_size)),
                     kind, f"{n_in}->{n_out}", f"{cold * 1e3:.1f}", f"{statistics.median(warm) * 1e3:.1f}"])
    _print_table(["channels", "kernel", "conv", "points", "first pass ms", "cached ms"], rows)
    forward_ms = sum(statistics.median(t) for t in per_layer) * 1e3
    backward_ms = statistics.median(backward) * 1e3
    print(f"  first pass includes building {len(maps)} kernel maps: {sum(maps) * 1e3:.1f} ms")
    print(f"  forward {forward_ms:.1f} ms, backward {backward_ms:.1f} ms (median of {repeats}, maps cached)")
    return {"voxels": x.num_points, "forward_ms": forward_ms, "backward_ms": backward_ms, "maps": len(maps)}
