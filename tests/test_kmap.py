"""Hash table and kernel maps against a numpy oracle (sorted packed keys + searchsorted)."""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import torchsparse_pp as tsp
from torchsparse_pp import ops
from torchsparse_pp.kmap import OUT_IN_ROW_PADDING, ConvGeometry, KernelMapCache, strided_map, submanifold_map
from torchsparse_pp.nn.functional import conv3d, kernel_offsets
from conftest import random_coords


def numpy_lookup(table_coords: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Row of each query in table_coords, or -1 (exact match on all four columns)."""
    def key(c):
        c = c.astype(np.int64)
        return ((c[:, 0] << 51) | ((c[:, 1] + (1 << 16)) << 34) | ((c[:, 2] + (1 << 16)) << 17)
                | (c[:, 3] + (1 << 16)))
    keys = key(table_coords)
    order = np.argsort(keys)
    sorted_keys = keys[order]
    q = key(query)
    pos = np.clip(np.searchsorted(sorted_keys, q), 0, len(keys) - 1)
    return np.where(sorted_keys[pos] == q, order[pos], -1)


def numpy_out_in(in_coords, out_coords, geometry: ConvGeometry) -> np.ndarray:
    inc, outc = in_coords.numpy(), out_coords.numpy()
    s, pad = np.array(geometry.stride), np.array(geometry.padding)
    offsets = kernel_offsets(geometry.kernel_size, geometry.dilation).numpy()
    columns = []
    for off in offsets:
        query = outc.copy().astype(np.int64)
        query[:, 1:] = query[:, 1:] * s - pad + off
        columns.append(numpy_lookup(inc, query))
    return np.stack(columns, 1)


def test_kernel_offsets_order():
    offsets = kernel_offsets((2, 3, 4), (1, 2, 3)).tolist()
    expected = [[i, 2 * j, 3 * l] for i in range(2) for j in range(3) for l in range(4)]
    assert offsets == expected


def test_hash_exact_no_false_matches(generator):
    coords = random_coords(generator, 5000, batch=3, low=-300, high=300)
    table = ops.hash_build(coords)
    assert table.shape[0] >= 2 * coords.shape[0] and table.shape[1] == 2
    assert torch.equal(ops.hash_query(table, coords), torch.arange(coords.shape[0], dtype=torch.int32))
    # Near misses: every single-component change of +-1, other batches, far-away values.
    probes = [coords.clone() for _ in range(8)]
    for i, p in enumerate(probes):
        p[:, i // 2] += 1 if i % 2 else -1
    probes.append(coords * torch.tensor([1, -1, 1, 1], dtype=torch.int32))
    query = torch.cat(probes)
    query[:, 0].clamp_(min=0)
    expected = numpy_lookup(coords.numpy(), query.numpy())
    assert np.array_equal(ops.hash_query(table, query).numpy(), expected)


def test_hash_extreme_coordinates():
    values = [-32768, -32767, -1, 0, 1, 32766, 32767]
    coords = torch.tensor([[b, x, y, z] for b in (0, 32767) for x in values for y in values[:3]
                           for z in values[-3:]], dtype=torch.int32)
    table = ops.hash_build(coords)
    assert torch.equal(ops.hash_query(table, coords), torch.arange(coords.shape[0], dtype=torch.int32))


@pytest.mark.parametrize("geometry,mode", [
    (ConvGeometry.make(3), "submanifold"),
    (ConvGeometry.make(5, dilation=2), "submanifold"),
    (ConvGeometry.make((3, 1, 1), stride=(2, 1, 1), padding=(1, 0, 0)), "spconv"),
    (ConvGeometry.make(2, stride=2), "minkowski"),
    (ConvGeometry.make(3, stride=3, padding=2, dilation=2), "spconv"),
    # K = 16, 18 and 32: the edges of the two 16-lane halves of the vector pair counter
    (ConvGeometry.make((2, 2, 4)), "submanifold"),
    (ConvGeometry.make((3, 3, 2), stride=(2, 2, 1), padding=(1, 1, 0)), "spconv"),
    (ConvGeometry.make((4, 4, 2)), "submanifold"),
])
def test_out_in_and_pairs_views(geometry, mode, generator):
    coords = random_coords(generator, 3000, batch=2, low=-20, high=20)
    cache = KernelMapCache()
    if mode == "submanifold":
        kmap = submanifold_map(cache, coords, geometry, None)
    else:
        kmap = strided_map(cache, coords, geometry, mode, None)
    expected = numpy_out_in(coords, kmap.out_coords, geometry)
    out_in = kmap.out_in
    assert out_in.shape[0] % OUT_IN_ROW_PADDING == 0 and out_in.shape[1] == geometry.volume
    assert np.array_equal(out_in[:kmap.num_out].numpy(), expected)
    assert bool((out_in[kmap.num_out:] == -1).all())

    pairs = kmap.pairs
    for k in range(geometry.volume):
        start, end = pairs.offsets[k].item(), pairs.offsets[k + 1].item()
        rows = np.nonzero(expected[:, k] >= 0)[0]
        assert np.array_equal(pairs.out_idx[start:end].numpy(), rows)  # sorted by output row
        assert np.array_equal(pairs.in_idx[start:end].numpy(), expected[rows, k])
        identity = len(rows) == kmap.num_out == kmap.num_in and np.array_equal(expected[rows, k], rows)
        assert bool(pairs.identity[k]) == identity
    if mode == "submanifold" and all(k % 2 for k in geometry.kernel_size):
        assert bool(pairs.identity[geometry.volume // 2])  # the centre offset of an odd kernel



@pytest.mark.parametrize("switches", [("TSPP_DISABLE_KMAP_AVX512",),
                                      ("TSPP_DISABLE_KMAP_AVX512", "TSPP_DISABLE_KMAP_AVX2")],
                         ids=["avx2_counter", "scalar_counter"])
def test_pairs_views_with_other_counters(switches):
    """The AVX2 and scalar pair counters (CPUs without AVX-512, or without AVX2) against the same
    numpy oracle: the view tests above in a process with the faster counters switched off."""
    env = dict(os.environ, **{name: "1" for name in switches})
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           f"{__file__}::test_out_in_and_pairs_views"], env=env, capture_output=True, text=True,
                          timeout=600, cwd=os.path.dirname(__file__))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "8 passed" in done.stdout and "failed" not in done.stdout

def test_maps_independent_of_thread_count(generator):
    coords = random_coords(generator, 20000, batch=2, low=-40, high=40)
    geometry = ConvGeometry.make(3, stride=2, padding=1)
    previous = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            kmap = strided_map(KernelMapCache(), coords, geometry, "spconv", None)
            p = kmap.pairs
            results.append((kmap.out_coords, kmap.out_in, p.in_idx, p.out_idx, p.offsets, p.identity,
                            p.host_offsets, p.host_identity))
    finally:
        torch.set_num_threads(previous)
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_cache_reuses_maps_by_definition(generator):
    coords = random_coords(generator, 200, batch=1)
    x = tsp.SparseTensor(torch.randn(coords.shape[0], 2, generator=generator), coords)
    w3 = torch.randn(27, 2, 2, generator=generator)
    y = conv3d(conv3d(x, w3, 3), w3, 3)  # two layers, one map
    assert len(x.cache) == 1 and y.cache is x.cache
    conv3d(y, w3, 3, dilation=2)  # a different geometry is a different map
    conv3d(y, torch.randn(8, 2, 2, generator=generator), 2, stride=2)
    conv3d(y, torch.randn(8, 2, 2, generator=generator), 2, stride=2)
    assert len(x.cache) == 3
    modes = sorted(key.mode for key, _ in x.cache.maps())
    assert modes == ["spconv", "submanifold", "submanifold"]


def test_spatial_range_clips_spconv_outputs(generator):
    coords = random_coords(generator, 300, batch=1, low=0, high=10)
    cache = KernelMapCache()
    geometry = ConvGeometry.make(3, stride=2, padding=0)
    clipped = strided_map(cache, coords, geometry, "spconv", (10, 10, 10))
    free = strided_map(cache, coords, geometry, "spconv", None)
    assert clipped.out_range == (4, 4, 4)
    assert bool((clipped.out_coords[:, 1:] >= 0).all()) and bool((clipped.out_coords[:, 1:] < 4).all())
    assert bool((free.out_coords[:, 1:] < 0).any())  # without a range, q = -1 is reachable


@pytest.mark.parametrize("geometry", [ConvGeometry.make(2, stride=2),
                                      ConvGeometry.make((4, 2, 2), stride=(4, 2, 2), padding=(1, 0, 1))])
@pytest.mark.parametrize("spatial", [None, (27, 19, 13)], ids=["free", "clipped"])
@pytest.mark.parametrize("order", ["sorted", "shuffled"])
def test_kernel_equal_to_stride_maps(geometry, spatial, order, generator):
    """kernel == stride (the one-candidate-per-input path with shifts and masks): the output set
    is every floor((p + pad) / s) inside the range, and out_in matches the numpy oracle, for
    coordinates in canonical order (as the library makes them) and shuffled."""
    coords = random_coords(generator, 4000, batch=2, low=-12, high=14)
    if order == "shuffled":
        coords = coords[torch.randperm(coords.shape[0], generator=generator)]
    # conv3d's output size (dilation 1) clips the outputs when the input's range is known
    clip = None if spatial is None else [(n + 2 * p - k) // s + 1 for n, p, k, s in
                                         zip(spatial, geometry.padding, geometry.kernel_size, geometry.stride)]
    kmap = strided_map(KernelMapCache(), coords, geometry, "spconv", spatial)
    q = coords.numpy().astype(np.int64).copy()
    q[:, 1:] = np.floor_divide(q[:, 1:] + np.array(geometry.padding), np.array(geometry.stride))
    if clip is not None:
        q = q[((q[:, 1:] >= 0) & (q[:, 1:] < np.array(clip))).all(1)]
    assert len(q) > 100 and (clip is None or len(q) < len(coords))
    assert np.array_equal(kmap.out_coords.numpy(), np.unique(q, axis=0))
    assert np.array_equal(kmap.out_in[:kmap.num_out].numpy(), numpy_out_in(coords, kmap.out_coords, geometry))


@pytest.mark.parametrize("geometry", [ConvGeometry.make(2, stride=2), ConvGeometry.make(3, stride=2, padding=1),
                                      ConvGeometry.make((3, 1, 2), stride=(2, 1, 3), dilation=(1, 1, 2))])
def test_generative_map_and_maps_of_new_coordinates(geometry, generator):
    """A generative map relates the fine set it creates to its coarse input by the strided
    relation; submanifold maps of created coordinate sets match the oracle too."""
    from torchsparse_pp.kmap import generative_map

    coords = random_coords(generator, 1500, batch=2, low=-15, high=15)
    cache = KernelMapCache()
    gen = generative_map(cache, coords, geometry, None)
    assert gen.out_coords is coords
    assert np.array_equal(gen.out_in[:gen.num_out].numpy(), numpy_out_in(gen.in_coords, coords, geometry))
    down = strided_map(cache, coords, geometry, "spconv", None)
    subm = ConvGeometry.make(3)
    for new in (gen.in_coords, down.out_coords):
        kmap = submanifold_map(cache, new, subm, None)
        assert np.array_equal(kmap.out_in[:kmap.num_out].numpy(), numpy_out_in(new, new, subm))


@pytest.mark.parametrize("geometry", [
    ConvGeometry.make(3), ConvGeometry.make(2), ConvGeometry.make(3, padding=0),
    ConvGeometry.make((3, 1, 5), dilation=(1, 2, 1), padding=(1, 0, 4)), ConvGeometry.make(4, dilation=2, padding=3),
    # a z run with gaps (dilation 3 in z), off centre
    ConvGeometry.make((2, 3, 3), dilation=(1, 1, 3), padding=(0, 1, 2)),
])
def test_submanifold_merge_matches_hash_and_numpy(geometry, generator):
    """The sort-merge build (any input order) equals the hash-probe build and the numpy oracle."""
    coords = random_coords(generator, 4000, batch=3, low=-25, high=25)
    coords = coords[torch.randperm(coords.shape[0], generator=generator)].contiguous()
    merged = ops.kmap_submanifold(coords, geometry.kernel_size, geometry.dilation, geometry.padding, 128)
    probed = ops.kmap_out_in(ops.hash_build(coords), coords, *geometry.args(), 128)
    assert torch.equal(merged, probed)
    assert np.array_equal(merged[:coords.shape[0]].numpy(), numpy_out_in(coords, coords, geometry))


def test_submanifold_merge_never_aliases_across_packed_fields():
    """(x, 32767) + (0, 1) packs to the same integer as (x + 1, -32768); it is not a neighbour."""
    coords = torch.tensor([[0, 5, 32767, 0], [0, 6, -32768, 0], [0, 5, 32766, 0], [1, 0, 0, 32767],
                           [1, 0, 1, -32768]], dtype=torch.int32)
    geometry = ConvGeometry.make(3)
    merged = ops.kmap_submanifold(coords, *[geometry.kernel_size, geometry.dilation, geometry.padding], 128)
    assert np.array_equal(merged[:5].numpy(), numpy_out_in(coords, coords, geometry))
    assert int((merged[:5] >= 0).sum()) == 5 + 2  # only self-pairs and the y-neighbours 0 <-> 2


def test_submanifold_merge_with_points_at_the_low_edge_of_the_range(generator):
    """Batch-0 points at x = -32768 shift below the smallest packed key; rows after them in the
    same chunk (other batches included) must keep their neighbours."""
    edge = torch.tensor([[0, -32768, 5, 5], [0, -32768, -32768, -32768], [0, 4, -32768, 7]], dtype=torch.int32)
    rest = random_coords(generator, 600, batch=3, low=-6, high=6)
    coords = torch.unique(torch.cat([edge, rest]), dim=0).int()
    coords = coords[torch.randperm(coords.shape[0], generator=generator)].contiguous()
    for geometry in (ConvGeometry.make(3), ConvGeometry.make(2), ConvGeometry.make(3, dilation=2, padding=2)):
        merged = ops.kmap_submanifold(coords, geometry.kernel_size, geometry.dilation, geometry.padding, 128)
        assert np.array_equal(merged[:coords.shape[0]].numpy(), numpy_out_in(coords, coords, geometry))


def test_submanifold_merge_rejects_duplicates():
    coords = torch.tensor([[0, 1, 2, 3], [0, 4, 5, 6], [0, 1, 2, 3]], dtype=torch.int32)
    with pytest.raises(RuntimeError, match=r"duplicate coordinate \(0, 1, 2, 3\) at rows 0 and 2"):
        ops.kmap_submanifold(coords, [3, 3, 3], [1, 1, 1], [1, 1, 1], 128)
