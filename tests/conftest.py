"""Shared fixtures and input generators for the test suite."""
import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # so tests can `import oracle`

# Without a GPU the Triton kernels run under the Triton interpreter on CPU tensors. Triton reads
# the variable when a kernel is defined, so it is set here, before any test imports them.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def random_coords(generator: torch.Generator, num: int, batch: int = 1, low: int = -4, high: int = 8) -> torch.Tensor:
    """Unique int32 (batch, x, y, z) rows drawn uniformly from a small box (negatives included)."""
    b = torch.randint(0, batch, (num, 1), generator=generator)
    xyz = torch.randint(low, high, (num, 3), generator=generator)
    return torch.unique(torch.cat([b, xyz], 1), dim=0).int()


def shuffled_coords(generator: torch.Generator, per_batch=(150, 110), low: int = -5, high: int = 7) -> torch.Tensor:
    """Exactly per_batch[b] distinct points in sample b (x/y/z in [low, high)), rows shuffled so
    that samples interleave: layers must use the batch column, not contiguity."""
    side = high - low
    rows = []
    for b, n in enumerate(per_batch):
        flat = torch.randperm(side ** 3, generator=generator)[:n]
        xyz = torch.stack([flat // side ** 2, (flat // side) % side, flat % side], 1) + low
        rows.append(torch.cat([torch.full((n, 1), b, dtype=torch.long), xyz], 1))
    coords = torch.cat(rows)
    return coords[torch.randperm(len(coords), generator=generator)].int()


def triple(v):
    """An int or 3-sequence as a 3-tuple."""
    return (v, v, v) if isinstance(v, int) else tuple(v)


def lidar_coords(seed: int, batch: int = 1, voxel: float = 0.2, box: int = 14, beams: int = 32) -> torch.Tensor:
    """A small LiDAR-like crop: voxelised generated scans, a box-sized window around the
    densest region near the sensor, one scan per batch entry."""
    from torchsparse_pp.data import generate_scan
    from torchsparse_pp.utils import sparse_quantize

    rows = []
    for b in range(batch):
        points = generate_scan(beams, seed=seed + b)["points"][:, :3]
        voxels = sparse_quantize(points, voxel)
        # Window around a point a few metres away, where the scan has surfaces.
        near = voxels[(np.abs(voxels[:, :2]) * voxel < 8).all(1)]
        centre = near[len(near) // 2]
        keep = (np.abs(voxels - centre) < box // 2).all(1)
        crop = torch.from_numpy(voxels[keep] - centre)
        rows.append(torch.cat([torch.full((len(crop), 1), b, dtype=torch.int32), crop], 1))
    return torch.cat(rows)


def fresh_seed() -> int:
    """A fresh seed per call; set TSPP_TEST_SEED to replay one. Printed, so a failure shows it."""
    value = int(os.environ.get("TSPP_TEST_SEED", int.from_bytes(os.urandom(4), "little")))
    print(f"TSPP_TEST_SEED={value}")
    return value


@pytest.fixture
def seed() -> int:
    return fresh_seed()


@pytest.fixture
def generator(seed) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def gen(generator) -> torch.Generator:
    """Short alias of ``generator``."""
    return generator


def _needs_native_cuda(item) -> bool:
    """Marked native_cuda, or a case of a native-backend parameter ('native', '<config>[native]')."""
    if "native_cuda" in item.keywords:
        return True
    params = getattr(getattr(item, "callspec", None), "params", {})
    return any(isinstance(v, str) and (v == "native" or v.endswith("[native]")) for v in params.values())


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` are skipped without a GPU; those that need the native CUDA kernels
    also without a CUDA build of torchsparse_pp (the Triton and torch-ops paths need only a GPU)."""
    gpu = torch.cuda.is_available()
    native = gpu and torch.ops.torchsparse_pp.cuda_built()
    no_gpu = pytest.mark.skip(reason="needs a GPU")
    no_native = pytest.mark.skip(reason="needs the native CUDA kernels (a CUDA build of torchsparse_pp)")
    for item in items:
        if "cuda" not in item.keywords:
            continue
        if not gpu:
            item.add_marker(no_gpu)
        elif not native and _needs_native_cuda(item):
            item.add_marker(no_native)
