"""The per-segment sums of scaled neighbour rows: ``A @ x`` with A a relational map's CSR
aggregation (see relational_map.py), and its input gradient ``A^T @ grad``."""
import torch


class _SparseRowSums(torch.autograd.Function):
    """``a @ x`` for a CSR ``a``; the backward multiplies by ``a_t`` (a's transpose, kept in CSR
    beside it, so no transpose is made per call). ``a`` carries no gradient."""

    @staticmethod
    def forward(ctx, x, a, a_t):
        ctx.a_t = a_t
        return a @ x

    @staticmethod
    def backward(ctx, grad):
        return ctx.a_t @ grad.contiguous(), None, None


def sparse_row_sums(x: torch.Tensor, a: torch.Tensor, a_t: torch.Tensor) -> torch.Tensor:
    """``a @ x`` ([a rows, C]) with x's gradient ``a_t @ grad``."""
    x = x.contiguous()
    if torch.is_grad_enabled() and x.requires_grad:
        return _SparseRowSums.apply(x, a, a_t)
    return a @ x
