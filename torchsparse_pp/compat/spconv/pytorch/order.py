"""spconv's output row order on the CPU.

spconv 2.3.8's CPU index generation loops over kernel offsets (outer) and input rows (inner) and
numbers an output site when the loop first reaches it. Our maps list the same (offset, input)
pairs, so that order is the argsort of each output's smallest ``offset * num_in + input``."""
import torch


def strided_order(out_in: torch.Tensor, num_out: int, num_in: int) -> torch.Tensor:
    """Permutation of a strided map's outputs (rows of ``out_in``) into spconv's order."""
    table = out_in[:num_out].long()
    offset = torch.arange(table.shape[1], device=table.device)
    key = torch.where(table >= 0, offset * num_in + table, torch.iinfo(torch.int64).max)
    return torch.argsort(key.amin(1))


def generative_order(out_in: torch.Tensor, num_coarse: int, num_fine: int) -> torch.Tensor:
    """Permutation of a generative map's fine sites (values of ``out_in``, whose rows are the
    coarse inputs) into the order spconv's transposed conv numbers them."""
    table = out_in[:num_coarse].long()
    offset = torch.arange(table.shape[1], device=table.device)
    rows = torch.arange(num_coarse, device=table.device)
    key = offset[None, :] * num_coarse + rows[:, None]
    valid = table >= 0
    best = torch.full((num_fine,), torch.iinfo(torch.int64).max, dtype=torch.int64, device=table.device)
    best = best.scatter_reduce(0, table[valid], key[valid], reduce="amin")
    return torch.argsort(best)
