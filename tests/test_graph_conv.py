"""R-GCN (torchsparse_pp.graph) against the dense per-relation formula in float64:

    out = sum_r D_r^-1 A_r x W_r + x W_root + b,   A_r[i, j] = number of edges j -> i of relation r,

D_r = diag(row sums of A_r) for aggr 'mean' (identity for 'sum'; empty rows stay 0), on random
graphs with empty relations, isolated nodes, self-loops and multi-edges; forward, input gradient
and weight gradients through every dataflow (native, and Triton under TRITON_INTERPRET=1), a
gradcheck on a tiny graph, torch_geometric's RGCNConv where installed, and bad input.
"""
import pytest
import torch

from torchsparse_pp.graph import RGCNConv, relational_conv, relational_map
from torchsparse_pp.nn.functional.config import ConvConfig

NATIVE = {"gather_scatter": ConvConfig("gather_scatter"),
          "gather_scatter_grouped": ConvConfig("gather_scatter", epsilon=0.5, mm_thresh=10 ** 9),
          "fetch_on_demand": ConvConfig("fetch_on_demand"),
          "implicit_gemm": ConvConfig("implicit_gemm", sorted=False, split_mask_num=0),
          "implicit_gemm_sorted": ConvConfig("implicit_gemm", sorted=True, split_mask_num=2)}
TRITON = {"triton_gather_scatter": ConvConfig("gather_scatter", backend="triton"),
          "triton_fetch_on_demand": ConvConfig("fetch_on_demand", backend="triton"),
          "triton_implicit_gemm": ConvConfig("implicit_gemm", backend="triton", sorted=True, split_mask_num=1)}


def random_graph(gen, num_nodes=40, num_relations=6, num_edges=300, isolated=5):
    """Edges among the first num_nodes - isolated nodes (the rest are isolated), relation 1 left
    empty, a few self-loops and repeated edges, order shuffled."""
    active = num_nodes - isolated
    src = torch.randint(0, active, (num_edges,), generator=gen)
    dst = torch.randint(0, active, (num_edges,), generator=gen)
    rel = torch.randint(0, num_relations, (num_edges,), generator=gen)
    rel[rel == 1] = 0
    loops = torch.randint(0, active, (8,), generator=gen)
    src, dst = torch.cat([src, loops, src[:20]]), torch.cat([dst, loops, dst[:20]])
    rel = torch.cat([rel, torch.randint(2, num_relations, (8,), generator=gen), rel[:20]])
    order = torch.randperm(src.numel(), generator=gen)
    return torch.stack([src, dst])[:, order], rel[order]


def dense_adjacency(edge_index, edge_type, num_relations, num_src, num_dst, aggr):
    """[R, num_dst, num_src]: edge counts per relation, rows divided by their sums for 'mean'."""
    a = torch.zeros(num_relations, num_dst, num_src, dtype=torch.float64)
    for (j, i), r in zip(edge_index.t().tolist(), edge_type.tolist()):
        a[r, i, j] += 1
    if aggr == "mean":
        a = a / a.sum(2, keepdim=True).clamp(min=1)
    return a


def dense_rgcn(x, weight, adjacency, root=None, bias=None):
    out = torch.einsum("rij,jc,rcd->id", adjacency, x, weight)
    if root is not None:
        out = out + x @ root
    return out if bias is None else out + bias


def _configs():
    from torchsparse_pp.ops.triton import runtime
    cases = dict(NATIVE)
    try:
        import triton  # noqa: F401
        if runtime.interpreter_requested():
            cases.update(TRITON)
    except ImportError:
        pass
    return cases


CONFIGS = _configs()


@pytest.mark.parametrize("aggr", ["mean", "sum"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_forward_and_gradients_match_the_dense_formula(gen, config, aggr):
    num_nodes, relations, c_in, c_out = 40, 6, 5, 7
    edge_index, edge_type = random_graph(gen, num_nodes, relations)
    rmap = relational_map(edge_index, edge_type, relations, num_nodes, aggr=aggr)
    x = torch.randn(num_nodes, c_in, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(relations, c_in, c_out, dtype=torch.float64, generator=gen, requires_grad=True)
    out = relational_conv(x, w, rmap, CONFIGS[config])
    grad = torch.randn(out.shape, dtype=torch.float64, generator=gen)
    dx, dw = torch.autograd.grad(out, (x, w), grad)

    adjacency = dense_adjacency(edge_index, edge_type, relations, num_nodes, num_nodes, aggr)
    x0, w0 = x.detach().requires_grad_(), w.detach().requires_grad_()
    expected = dense_rgcn(x0, w0, adjacency)
    dx0, dw0 = torch.autograd.grad(expected, (x0, w0), grad)
    tol = dict(rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out, expected, **tol)
    torch.testing.assert_close(dx, dx0, **tol)
    torch.testing.assert_close(dw, dw0, **tol)
    assert dw[1].abs().max() == 0 and out[num_nodes - 5:].abs().max() == 0  # empty relation, isolated nodes


@pytest.mark.parametrize("decomposition", [{}, {"num_bases": 3}, {"num_blocks": 2}])
def test_module_matches_the_dense_formula_with_root_bias_and_decompositions(gen, decomposition):
    num_nodes, relations = 30, 5
    edge_index, edge_type = random_graph(gen, num_nodes, relations, 200)
    layer = RGCNConv(6, 4, relations, **decomposition).double()
    torch.nn.init.normal_(layer.bias, generator=gen)
    x = torch.randn(num_nodes, 6, dtype=torch.float64, generator=gen, requires_grad=True)
    out = layer(x, edge_index, edge_type)
    grad = torch.randn(out.shape, dtype=torch.float64, generator=gen)
    params = [p for p in layer.parameters()]
    got = torch.autograd.grad(out, [x] + params, grad)

    if "num_bases" in decomposition:
        w = torch.einsum("rb,bcd->rcd", layer.comp, layer.weight)
    elif "num_blocks" in decomposition:
        w = torch.stack([torch.block_diag(*layer.weight[r]) for r in range(relations)])
    else:
        w = layer.weight
    adjacency = dense_adjacency(edge_index, edge_type, relations, num_nodes, num_nodes, "mean")
    expected = dense_rgcn(x, w, adjacency, layer.root, layer.bias)
    want = torch.autograd.grad(expected, [x] + params, grad)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_featureless_input_looks_up_weight_rows(gen):
    num_nodes, relations = 25, 4
    edge_index, edge_type = random_graph(gen, num_nodes, relations, 120)
    layer = RGCNConv(num_nodes, 3, relations).double()
    out = layer(None, edge_index, edge_type)
    eye = torch.eye(num_nodes, dtype=torch.float64)
    adjacency = dense_adjacency(edge_index, edge_type, relations, num_nodes, num_nodes, "mean")
    torch.testing.assert_close(out, dense_rgcn(eye, layer.weight, adjacency, layer.root, layer.bias))
    grad = torch.randn(out.shape, dtype=torch.float64, generator=gen)
    got = torch.autograd.grad(out, [layer.weight, layer.root], grad)
    want = torch.autograd.grad(dense_rgcn(eye, layer.weight, adjacency, layer.root, layer.bias),
                               [layer.weight, layer.root], grad)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    # A node index input reads the rows it names.
    index = torch.randint(0, num_nodes, (num_nodes,), generator=gen)
    one_hot = eye[index]
    torch.testing.assert_close(layer(index, edge_index, edge_type),
                               dense_rgcn(one_hot, layer.weight, adjacency, layer.root, layer.bias))


def test_bipartite_input_reads_sources_and_writes_destinations(gen):
    num_src, num_dst, relations = 12, 7, 3
    edge_index = torch.stack([torch.randint(0, num_src, (60,), generator=gen),
                              torch.randint(0, num_dst, (60,), generator=gen)])
    edge_type = torch.randint(0, relations, (60,), generator=gen)
    layer = RGCNConv((4, 5), 3, relations).double()
    x_src = torch.randn(num_src, 4, dtype=torch.float64, generator=gen)
    x_dst = torch.randn(num_dst, 5, dtype=torch.float64, generator=gen)
    adjacency = dense_adjacency(edge_index, edge_type, relations, num_src, num_dst, "mean")
    expected = torch.einsum("rij,jc,rcd->id", adjacency, x_src, layer.weight) + x_dst @ layer.root + layer.bias
    torch.testing.assert_close(layer((x_src, x_dst), edge_index, edge_type), expected)


def test_gradcheck_on_a_tiny_graph(gen):
    edge_index, edge_type = random_graph(gen, 8, 3, 20, isolated=1)
    rmap = relational_map(edge_index, edge_type, 3, 8)
    x = torch.randn(8, 2, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(3, 2, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    for config in ("gather_scatter", "fetch_on_demand", "implicit_gemm"):
        assert torch.autograd.gradcheck(lambda a, b: relational_conv(a, b, rmap, config), (x, w))


def test_pairs_are_grouped_by_relation_then_destination_then_source(gen):
    edge_index, edge_type = random_graph(gen, 30, 5, 150)
    rmap = relational_map(edge_index, edge_type, 5, 30)
    src, dst, rel = edge_index[0][rmap.edge_order], edge_index[1][rmap.edge_order], edge_type[rmap.edge_order]
    keys = (rel * 30 + dst) * 30 + src
    assert bool((keys[1:] >= keys[:-1]).all())
    # Ties (repeated edges) keep their input order: the permutation is the stable sort's.
    assert torch.equal(rmap.edge_order, torch.sort(((edge_type * 30 + edge_index[1]) * 30 + edge_index[0]),
                                                   stable=True).indices)
    counts = torch.tensor(rmap.relation_counts)
    segments = torch.unique(edge_type * 30 + edge_index[1])
    assert torch.equal(counts, torch.bincount(segments // 30, minlength=5)) and counts[1] == 0
    # The relation pairs are a valid weight-stationary view: each segment and node once per relation.
    from torchsparse_pp.ops.validate import validate_pairs
    p = rmap.pairs.pairs
    validate_pairs(p.in_idx, p.out_idx, p.offsets, p.identity, rmap.num_segments, 30, sorted_by="dst",
                   unique_src=True)
    scale = rmap.edge_scale(torch.float64)
    sizes = torch.bincount(rel * 30 + dst, minlength=150)[rel * 30 + dst]
    torch.testing.assert_close(scale, 1.0 / sizes.double())


def test_matches_torch_geometric(gen):
    pyg = pytest.importorskip("torch_geometric.nn", reason="torch_geometric (the graph peer) is not installed")
    num_nodes, relations = 35, 6
    edge_index, edge_type = random_graph(gen, num_nodes, relations, 250)
    x = torch.randn(num_nodes, 8, dtype=torch.float64, generator=gen)
    for kwargs in ({}, {"num_bases": 2}, {"num_blocks": 4}, {"aggr": "add"}, {"root_weight": False, "bias": False}):
        for peer_class in (pyg.RGCNConv, pyg.FastRGCNConv):
            peer = peer_class(8, 4, relations, **kwargs).double()
            if peer.bias is not None:
                torch.nn.init.normal_(peer.bias, generator=gen)
            ours = RGCNConv(8, 4, relations, **kwargs).double()
            ours.load_state_dict(peer.state_dict(), strict=True)
            torch.testing.assert_close(ours(x, edge_index, edge_type), peer(x, edge_index, edge_type))
    peer = pyg.RGCNConv(num_nodes, 4, relations).double()
    ours = RGCNConv(num_nodes, 4, relations).double()
    ours.load_state_dict(peer.state_dict(), strict=True)
    torch.testing.assert_close(ours(None, edge_index, edge_type), peer(None, edge_index, edge_type))


def test_the_map_is_reused_for_the_same_edges_and_rebuilt_after_an_edit(gen):
    edge_index, edge_type = random_graph(gen, 20, 3, 60)
    layer = RGCNConv(4, 4, 3).double()
    first = layer.relational_map(edge_index, edge_type, 20, 20)
    assert layer.relational_map(edge_index, edge_type, 20, 20) is first
    edge_type[0] = (edge_type[0] + 1) % 3
    assert layer.relational_map(edge_index, edge_type, 20, 20) is not first


@pytest.mark.parametrize("case, error, match", [
    ("negative source", ValueError, "negative"),
    ("destination too large", ValueError, "destination index"),
    ("relation too large", ValueError, "edge_type has value"),
    ("negative relation", ValueError, "edge_type has a negative"),
    ("int32 edge_index", TypeError, "edge_index must be int64"),
    ("float edge_type", TypeError, "edge_type must be int64"),
    ("lengths differ", ValueError, "edge_type must have shape"),
    ("edge_index not [2, E]", ValueError, r"edge_index must have shape \[2, E\]"),
    ("x rows differ", ValueError, "x has"),
    ("x channels differ", ValueError, "channel mismatch"),
    ("float16 x", TypeError, "float32 or float64"),
])
def test_bad_input_is_rejected_with_a_clear_error(gen, case, error, match):
    edge_index, edge_type = random_graph(gen, 10, 3, 30, isolated=0)
    x = torch.randn(10, 4, generator=gen)
    layer = RGCNConv(4, 2, 3)
    if case == "negative source":
        edge_index[0, 3] = -1
    elif case == "destination too large":
        edge_index[1, 2] = 10
    elif case == "relation too large":
        edge_type[5] = 3
    elif case == "negative relation":
        edge_type[5] = -2
    elif case == "int32 edge_index":
        edge_index = edge_index.int()
    elif case == "float edge_type":
        edge_type = edge_type.float()
    elif case == "lengths differ":
        edge_type = edge_type[:-1]
    elif case == "edge_index not [2, E]":
        edge_index = edge_index[:1]
    elif case == "x rows differ":
        rmap = relational_map(edge_index, edge_type, 3, 10)
        with pytest.raises(error, match=match):
            relational_conv(x[:9], layer.weight, rmap)
        return
    elif case == "x channels differ":
        x = torch.randn(10, 5, generator=gen)
    elif case == "float16 x":
        x = x.half()
    with pytest.raises(error, match=match):
        layer(x, edge_index, edge_type)


def test_options_not_implemented_raise():
    with pytest.raises(NotImplementedError, match="aggr='max'"):
        RGCNConv(4, 4, 2, aggr="max")
    with pytest.raises(NotImplementedError, match="is_sorted"):
        RGCNConv(4, 4, 2, is_sorted=True)
    with pytest.raises(NotImplementedError, match="flow"):
        RGCNConv(4, 4, 2, flow="target_to_source")
    with pytest.raises(ValueError, match="exclude each other"):
        RGCNConv(4, 4, 2, num_bases=2, num_blocks=2)
    with pytest.raises(ValueError, match="unknown dataflow"):
        RGCNConv(4, 4, 2, dataflow="dense")


@pytest.mark.parametrize("config", [c for c in CONFIGS if c in ("gather_scatter", "fetch_on_demand", "implicit_gemm",
                                                                 "triton_fetch_on_demand", "triton_implicit_gemm")])
def test_deterministic_mode_matches_the_dense_formula(gen, config):
    """backends.deterministic picks other kernels (fixed tiles; Triton's owned-rows fetch_on_demand
    over the relation table and its transpose): the same sums."""
    from torchsparse_pp import backends
    edge_index, edge_type = random_graph(gen, 30, 4, 200)
    rmap = relational_map(edge_index, edge_type, 4, 30)
    x = torch.randn(30, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(4, 3, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    flag = backends.deterministic
    backends.deterministic = True
    try:
        out = relational_conv(x, w, rmap, CONFIGS[config])
        dx, dw = torch.autograd.grad(out, (x, w), torch.ones_like(out))
    finally:
        backends.deterministic = flag
    adjacency = dense_adjacency(edge_index, edge_type, 4, 30, 30, "mean")
    expected = dense_rgcn(x, w, adjacency)
    dx0, dw0 = torch.autograd.grad(expected, (x, w), torch.ones_like(expected))
    for a, b in ((out, expected), (dx, dx0), (dw, dw0)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("config", ["gather_scatter", "fetch_on_demand", "implicit_gemm"])
def test_a_graph_without_edges_leaves_the_root_term(gen, config):
    layer = RGCNConv(3, 2, 4, dataflow=config).double()
    torch.nn.init.normal_(layer.bias, generator=gen)
    x = torch.randn(5, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    out = layer(x, torch.zeros(2, 0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))
    torch.testing.assert_close(out, x @ layer.root + layer.bias)
    dw, = torch.autograd.grad(out.sum(), [layer.weight])
    assert dw.abs().max() == 0


def test_edges_made_in_inference_mode_work_uncached(gen):
    edge_index, edge_type = random_graph(gen, 20, 3, 60)
    layer = RGCNConv(4, 4, 3).double()
    x = torch.randn(20, 4, dtype=torch.float64, generator=gen)
    expected = layer(x, edge_index, edge_type).detach()
    with torch.inference_mode():
        ei, et = edge_index.clone(), edge_type.clone()
        torch.testing.assert_close(layer(x, ei, et), expected)
