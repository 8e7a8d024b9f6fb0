"""torchsparse.backend.GPUHashTable / GPUHashTable32 (torchsparse_pp.compat.torchsparse.backend)
against 2.1's definition, written here with Python integers: the key of a row is its 64-bit
FNV-1a hash (low 32 bits for the int32 table), stored once in the caller's slot tensors at a
slot reachable from ``(uint64) key % capacity`` by linear probing, with value row + 1 (the last
of repeated rows); lookups return those values, 0 where absent, padded to 128 rows; kernel
lookups visit 2.1's offsets in its order (column 0 fastest for odd volumes, column 2 for even)."""
import itertools

import pytest
import torch

from torchsparse_pp.compat.torchsparse import backend

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
TABLES = {"GPUHashTable": (backend.GPUHashTable, torch.int64), "GPUHashTable32": (backend.GPUHashTable32, torch.int32)}


def fnv_key(row, bits: int) -> int:
    h = 14695981039346656037
    for v in row:
        h = ((h ^ (v & 0xFFFFFFFF)) * 1099511628211) % (1 << 64)
    h %= 1 << bits
    return h - (1 << bits) if h >= 1 << (bits - 1) else h  # the signed key the table stores


def rows_with_repeats(gen, n, device):
    coords = torch.randint(-40, 40, (n, 4), generator=gen)
    coords[n // 2:] = coords[torch.randint(0, n // 2, (n - n // 2,), generator=gen)]  # repeated rows
    return coords.int().to(device)


def check_layout(keys: torch.Tensor, vals: torch.Tensor, want: dict) -> None:
    """Every wanted key once with its value, reachable from its first slot without an empty slot."""
    capacity, k, v = len(keys), keys.tolist(), vals.tolist()
    stored = {key: (slot, v[slot]) for slot, key in enumerate(k) if key != 0}
    assert len(stored) == sum(1 for key in k if key != 0) and stored.keys() == want.keys()
    for key, (slot, value) in stored.items():
        assert value == want[key]
        home = (key % (1 << 64)) % capacity
        assert all(k[(home + j) % capacity] != 0 for j in range((slot - home) % capacity + 1))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("table", TABLES)
def test_insert_coords_stores_last_row_per_fnv_key(table, device, gen):
    cls, key_dtype = TABLES[table]
    coords = rows_with_repeats(gen, 300, device)
    keys = torch.zeros(600, dtype=key_dtype, device=device)
    vals = torch.zeros(600, dtype=torch.int32, device=device)
    cls(keys, vals).insert_coords(coords)
    bits = 64 if key_dtype == torch.int64 else 32
    want = {fnv_key(row, bits): i + 1 for i, row in enumerate(coords.tolist())}  # later rows overwrite
    check_layout(keys.cpu(), vals.cpu(), want)


def kernel_offsets_2_1(kernel_size, kernel_volume):
    """2.1's lookup offsets: digit t of each column minus (k - 1) // 2; column 0 fastest for an odd
    volume, column 2 fastest for an even one."""
    ranges = [[t - (k - 1) // 2 for t in range(k)] for k in kernel_size]
    if kernel_volume % 2:
        return [(a, b, c) for c, b, a in itertools.product(ranges[2], ranges[1], ranges[0])]
    return list(itertools.product(*ranges))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel_size,stride", [((1, 1, 1), (1, 1, 1)), ((2, 2, 2), (1, 1, 1)),
                                                ((3, 3, 3), (1, 1, 1)), ((3, 1, 2), (2, 1, 3))])
def test_lookup_coords_reads_2_1_offsets(kernel_size, stride, device, gen):
    target = torch.unique(torch.randint(0, 9, (200, 4), generator=gen), dim=0).int().to(device)
    table = backend.GPUHashTable(torch.zeros(2 * len(target), dtype=torch.int64, device=device),
                                 torch.zeros(2 * len(target), dtype=torch.int32, device=device))
    table.insert_coords(target)
    queries = torch.randint(0, 5, (150, 4), generator=gen).int().to(device)
    volume = kernel_size[0] * kernel_size[1] * kernel_size[2]
    got = table.lookup_coords(queries, torch.tensor(kernel_size, dtype=torch.int32, device=device),
                              torch.tensor(stride, dtype=torch.int32, device=device), volume)
    assert got.shape == (256, volume) and got.dtype == torch.int32 and not got[150:].any()
    rows = {tuple(r): i + 1 for i, r in enumerate(target.tolist())}
    offsets = kernel_offsets_2_1(kernel_size, volume)
    for q, found in zip(queries.tolist(), got[:150].tolist()):
        want = [rows.get(tuple(q[a] * stride[a] + o[a] for a in range(3)) + (q[3],), 0) for o in offsets]
        assert found == want


def test_insert_and_lookup_vals(gen):
    keys = torch.unique(torch.randint(-(1 << 62), 1 << 62, (120,), generator=gen))
    keys = keys[keys != 0]
    table = backend.GPUHashTable(256)
    table.insert_vals(keys)
    queries = torch.cat([keys[torch.randperm(len(keys), generator=gen)[:50]], keys[:20] + 1])
    got = table.lookup_vals(queries)
    where = {k: i + 1 for i, k in enumerate(keys.tolist())}
    assert got.shape == (128,) and got[:70].tolist() == [where.get(q, 0) for q in queries.tolist()]


def test_a_full_table_raises_instead_of_spinning(gen):
    table = backend.GPUHashTable(torch.zeros(4, dtype=torch.int64), torch.zeros(4, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="full"):
        table.insert_coords(torch.unique(torch.randint(0, 50, (9, 4), generator=gen), dim=0)[:5].int())
    table.insert_coords(torch.tensor([[1, 2, 3, 0]] * 6, dtype=torch.int32))  # one key, six rows
    assert table.lookup_coords(torch.tensor([[1, 2, 3, 0], [2, 2, 3, 0]], dtype=torch.int32),
                               torch.ones(3, dtype=torch.int32), torch.ones(3, dtype=torch.int32), 1)[:2, 0].tolist() == [6, 0]


def test_bad_arguments_raise():
    table = backend.GPUHashTable(8)
    ones = torch.ones(3, dtype=torch.int32)
    with pytest.raises(TypeError, match="int32"):
        table.insert_coords(torch.zeros(2, 4))
    with pytest.raises(ValueError, match=r"\[N, 4\]"):
        table.insert_coords(torch.zeros(2, 3, dtype=torch.int32))
    with pytest.raises(TypeError, match="int64"):
        backend.GPUHashTable(torch.zeros(8, dtype=torch.int32), torch.zeros(8, dtype=torch.int32))
    with pytest.raises(ValueError, match="cover"):
        backend.GPUHashTable(torch.zeros(8, dtype=torch.int64), torch.zeros(4, dtype=torch.int32))
    with pytest.raises(ValueError, match="capacity"):
        backend.GPUHashTable(0)
    with pytest.raises(TypeError, match="kernel_sizes"):
        table.lookup_coords(torch.zeros(2, 4, dtype=torch.int32), ones.long(), ones, 1)
    with pytest.raises(ValueError, match=">= 1"):
        table.lookup_coords(torch.zeros(2, 4, dtype=torch.int32), ones * 0, ones, 1)
    with pytest.raises(TypeError, match="int32 tensor"):
        backend.GPUHashTable32(8).insert_vals(torch.zeros(3, dtype=torch.int64))
