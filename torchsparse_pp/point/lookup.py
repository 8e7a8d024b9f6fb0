"""Rows of integer coordinates in a coordinate set, in plain torch ops (any device).

Coordinates are packed into one int64 key per row (batch and three signed 16-bit axes), the set's
keys are sorted once, and queries are found by binary search."""
import torch

SPATIAL_BITS = 16
OFFSET = 1 << (SPATIAL_BITS - 1)


def pack(coords: torch.Tensor) -> torch.Tensor:
    """int64 keys of ``(batch, x, y, z)`` rows: distinct rows give distinct keys while x/y/z lie
    in [-2^15, 2^15) (the library's coordinate range) and the batch in [0, 2^15)."""
    c = coords.long()
    key = c[:, 0]
    for axis in range(1, 4):
        key = (key << SPATIAL_BITS) | (c[:, axis] + OFFSET)
    return key


def find_rows(table: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """For each row of ``queries`` ``[M, 4]``, its row in ``table`` ``[N, 4]`` (unique rows), or -1
    (also for queries outside the packable range, which no table row can match)."""
    missing = torch.full((queries.shape[0],), -1, dtype=torch.long, device=queries.device)
    if table.shape[0] == 0 or queries.shape[0] == 0:
        return missing
    sorted_keys, order = torch.sort(pack(table))
    q = queries.long()
    packable = ((q[:, 1:] >= -OFFSET) & (q[:, 1:] < OFFSET)).all(1) & (q[:, 0] >= 0) & (q[:, 0] < OFFSET)
    wanted = pack(torch.where(packable.unsqueeze(1), q, torch.zeros_like(q)))
    pos = torch.searchsorted(sorted_keys, wanted).clamp(max=len(sorted_keys) - 1)
    found = (sorted_keys[pos] == wanted) & packable
    return torch.where(found, order[pos], missing)
