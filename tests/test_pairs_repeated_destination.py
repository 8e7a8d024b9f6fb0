"""The CPU pair checks reject a destination row repeated within one offset, with
ops/validate.py's message: a parallel scatter over such pairs would race on that row."""
import re

import pytest
import torch

from torchsparse_pp import ops
from torchsparse_pp.ops.validate import validate_pairs
from op_twins import small_submanifold


@pytest.fixture
def subm(gen):
    return small_submanifold(gen)


def test_cpu_check_pairs_rejects_a_repeated_destination(subm, gen):
    kmap, feats, weight = subm
    p = kmap.pairs_sorted_by("out")
    counts = p.offsets.diff()
    k = next(k for k in range(27) if not bool(p.identity[k]) and int(counts[k]) > 2)
    start = int(p.offsets[k])
    grad = torch.randn(kmap.num_out, 5, generator=gen)
    for first, second in ((start, start + 1), (start + 2, start)):  # ascending and unsorted repeats
        dst = p.out_idx.clone()
        dst[second] = dst[first]
        with pytest.raises(RuntimeError) as reference:
            validate_pairs(p.in_idx, dst, p.offsets, p.identity, kmap.num_in, kmap.num_out)
        message = re.escape(str(reference.value))
        assert f"offset {k} pairs some destination row more than once" in str(reference.value)
        calls = (lambda: ops.gather_scatter_forward(feats, weight, p.in_idx, dst, p.offsets, p.identity, kmap.num_out),
                 lambda: ops.gather_scatter_wgrad(feats, grad, p.in_idx, dst, p.offsets, p.identity),
                 lambda: ops.fetch_on_demand_forward(feats, weight, p.in_idx, dst, p.offsets, p.identity,
                                                     kmap.num_out, False),
                 lambda: ops.fetch_on_demand_wgrad(feats, grad, p.in_idx, dst, p.offsets, p.identity))
        for call in calls:
            with pytest.raises(RuntimeError, match=message):
                call()
    ops.gather_scatter_forward(feats, weight, p.in_idx, p.out_idx, p.offsets, p.identity, kmap.num_out)
