"""Linear-probing hash tables in plain torch ops (any device), laid out as torchsparse 2.1's GPU
table lays them: slot arrays ``keys`` / ``vals``, key 0 marks an empty slot, a key's first slot
is ``(uint64) key % capacity``, then the next slots in turn.

Insertion runs in rounds, as the GPU's threads probe side by side: every pending key looks at
its current slot; keys already there take their value, of the keys that meet an empty slot the
first row's claims it, and the others move on. The table then holds every key once, each
reachable from its first slot with no empty slot between: a layout the GPU kernel can produce
(its own depends on thread timing), found by the same lookups. Where rows repeat a key, the last
row's value stays (on the GPU, whichever thread writes last).
"""
import torch

EMPTY = 0


def home_slots(keys: torch.Tensor, capacity: int) -> torch.Tensor:
    """``(uint64) key % capacity`` as int64: negative keys read as key + 2^64."""
    k = keys.long()
    wrap = (1 << 64) % capacity
    return (torch.remainder(k, capacity) + torch.where(k < 0, wrap, 0)) % capacity


def insert(table_keys: torch.Tensor, table_vals: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor) -> None:
    """Inserts ``keys`` with ``vals`` into the slot arrays, in place."""
    capacity, n = table_keys.shape[0], keys.shape[0]
    free = int((table_keys == EMPTY).sum())
    fresh = int((~torch.isin(torch.unique(keys), table_keys)).sum()) if n else 0
    if fresh > free:
        raise RuntimeError(f"hash table full: {fresh} new keys, {free} of {capacity} slots free "
                           "(torchsparse's GPU kernel would never return)")
    rows = torch.arange(n, device=keys.device)
    slots = home_slots(keys, capacity)
    keys = keys.to(table_keys.dtype)
    while rows.numel():
        k, s = keys[rows], slots[rows]
        claim = table_keys[s] == EMPTY
        if bool(claim.any()):  # the first pending row at each empty slot takes it
            first = torch.full((capacity,), n, dtype=torch.long, device=keys.device)
            first.scatter_reduce_(0, s[claim], rows[claim], "amin")
            taken = (first < n).nonzero().squeeze(1)
            table_keys[taken] = keys[first[taken]]
        here = table_keys[s] == k
        last = torch.full((capacity,), -1, dtype=torch.long, device=keys.device)
        last.scatter_reduce_(0, s[here], rows[here], "amax")
        written = (last >= 0).nonzero().squeeze(1)
        table_vals[written] = vals[last[written]].to(table_vals.dtype)
        moving = rows[~here]
        slots[moving] = (s[~here] + 1) % capacity
        rows = moving


def lookup(table_keys: torch.Tensor, table_vals: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """int32 values of ``keys`` (any shape), 0 where a key is absent."""
    capacity = table_keys.shape[0]
    flat = keys.reshape(-1).to(table_keys.dtype)
    found = torch.zeros(flat.shape[0], dtype=torch.int32, device=keys.device)
    rows = torch.arange(flat.shape[0], device=keys.device)
    slots = home_slots(flat, capacity)
    for _ in range(capacity):  # at most every slot once (a full table has no empty slot to stop at)
        if not rows.numel():
            break
        current = table_keys[slots]
        hit = current == flat[rows]
        found[rows[hit]] = table_vals[slots[hit]].int()
        go_on = ~hit & (current != EMPTY)
        rows, slots = rows[go_on], (slots[go_on] + 1) % capacity
    return found.view(keys.shape)
