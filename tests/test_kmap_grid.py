"""kernel == stride downsampling maps built on the occupancy bitmap (csrc/cpu/kmap_grid_cpu.cpp):
dense coordinate sets take that path, sparse ones the radix sort; both against the numpy
oracle, on one and two threads (two threads split the bitmap passes past 65536 inputs)."""
import numpy as np
import pytest
import torch

from torchsparse_pp import ops
from torchsparse_pp.kmap import ConvGeometry, KernelMapCache, strided_map
from conftest import random_coords
from test_kmap import numpy_out_in


def expected_outputs(coords: torch.Tensor, geometry: ConvGeometry, clip) -> np.ndarray:
    """floor((p + pad) / s) of every input, inside the clip range, unique, in canonical order."""
    q = coords.numpy().astype(np.int64).copy()
    q[:, 1:] = np.floor_divide(q[:, 1:] + np.array(geometry.padding), np.array(geometry.stride))
    if clip is not None:
        q = q[((q[:, 1:] >= 0) & (q[:, 1:] < np.array(clip))).all(1)]
    return np.unique(q, axis=0)


def dense_coords(generator, num, batches, side, low):
    """About `num` distinct rows in a few batches (not starting at 0) of a side^3 box, shuffled:
    dense enough for the bitmap (a few cells per input)."""
    coords = random_coords(generator, num, batch=len(batches), low=low, high=low + side)
    coords[:, 0] = torch.tensor(batches, dtype=torch.int32)[coords[:, 0].long()]
    return coords[torch.randperm(coords.shape[0], generator=generator)].contiguous()


def in_threads(threads, fn):
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return fn()
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("geometry", [ConvGeometry.make(2, stride=2),
                                      ConvGeometry.make((4, 2, 2), stride=(4, 2, 2), padding=(3, 0, 1))])
@pytest.mark.parametrize("mode", ["spconv", "minkowski"])
@pytest.mark.parametrize("size", ["serial", "parallel"])
def test_dense_sets_match_the_oracle_on_any_thread_count(geometry, mode, size, generator):
    if mode == "minkowski" and any(geometry.padding):
        pytest.skip("minkowski outputs are floor(p / s): padding only moves what they read")
    num, side = (3000, 23) if size == "serial" else (120000, 41)
    coords = dense_coords(generator, num, [2, 5, 6], side, low=-9)
    assert (coords.shape[0] >= 65536) == (size == "parallel")  # where two threads split the passes
    # Odd spatial sizes: the box is clipped on the high side, and no axis is a power of two.
    spatial = None if mode == "minkowski" else (side - 12, side - 9, side - 7)
    clip = None if spatial is None else [(n + 2 * p - k) // s + 1 for n, p, k, s in
                                         zip(spatial, geometry.padding, geometry.kernel_size, geometry.stride)]
    maps = [in_threads(t, lambda: strided_map(KernelMapCache(), coords, geometry, mode, spatial)) for t in (1, 2)]
    expected = expected_outputs(coords, geometry, clip)
    assert len(expected) > coords.shape[0] // 20
    for kmap in maps:
        assert np.array_equal(kmap.out_coords.numpy(), expected)
        assert np.array_equal(kmap.out_in[:kmap.num_out].numpy(), numpy_out_in(coords, kmap.out_coords, geometry))
        assert bool((kmap.out_in[kmap.num_out:] == -1).all())
    assert torch.equal(maps[0].out_in, maps[1].out_in)


def test_sparse_and_dense_parts_agree(generator):
    """A dense block alone (bitmap) and with one far-away point added (its box becomes too large
    for the bitmap: the sort path) give the same outputs and map rows for the block."""
    geometry = ConvGeometry.make(2, stride=2)
    block = dense_coords(generator, 4000, [0], 20, low=0)
    far = torch.tensor([[0, 30001, 30001, 30001]], dtype=torch.int32)  # tap (1, 1, 1): the last
    alone = strided_map(KernelMapCache(), block, geometry, "spconv", None)
    both = strided_map(KernelMapCache(), torch.cat([block, far]), geometry, "spconv", None)
    assert both.num_out == alone.num_out + 1
    assert torch.equal(both.out_coords[:-1], alone.out_coords)
    assert torch.equal(both.out_in[:alone.num_out], alone.out_in[:alone.num_out])
    assert both.out_in[alone.num_out].tolist() == [-1] * 7 + [len(block)]


@pytest.mark.parametrize("num, threads", [(3000, 1), (150000, 2)], ids=["serial", "parallel"])
def test_duplicates_raise_on_the_bitmap_path(num, threads, generator):
    coords = dense_coords(generator, num, [0, 1], 45, low=-4)
    assert (coords.shape[0] >= 65536) == (threads == 2)
    rows = torch.randperm(coords.shape[0], generator=generator)[:2].sort().values.tolist()
    coords[rows[1]] = coords[rows[0]]
    c = coords[rows[0]].tolist()
    pattern = rf"duplicate coordinate \({c[0]}, {c[1]}, {c[2]}, {c[3]}\) at rows {rows[0]} and {rows[1]}"
    for mode in ("spconv", "minkowski"):
        with pytest.raises(RuntimeError, match=pattern):
            in_threads(threads, lambda: ops.kmap_downsample(coords, [2, 2, 2], [2, 2, 2], [1, 1, 1], [0, 0, 0],
                                                            mode, None, 128))


@pytest.mark.parametrize("num, threads", [(3000, 1), (150000, 2)], ids=["serial", "parallel"])
def test_duplicates_outside_the_clip_range_raise(num, threads, generator):
    """A repeated input whose output is clipped claims no map cell: it must still be rejected."""
    coords = dense_coords(generator, num, [0, 1], 45, low=0)
    clipped = torch.nonzero(coords[:, 1] >= 40).flatten()  # outputs x >= 20, outside out_range 10
    rows = clipped[torch.randperm(len(clipped), generator=generator)[:2]].sort().values.tolist()
    coords[rows[1]] = coords[rows[0]]
    c = coords[rows[0]].tolist()
    with pytest.raises(RuntimeError, match=rf"duplicate coordinate \({c[0]}, {c[1]}, {c[2]}, {c[3]}\) at rows "
                                           rf"{rows[0]} and {rows[1]}"):
        in_threads(threads, lambda: ops.kmap_downsample(coords, [2, 2, 2], [2, 2, 2], [1, 1, 1], [0, 0, 0],
                                                        "spconv", [10, 30, 30], 128))
