"""Heterogeneous graphs for entity classification: generated ones with the sizes of the RDF
benchmarks AIFB, MUTAG, BGS and AM, and a reader of the usual on-disk form.

Generated graphs have the benchmark's node, relation and edge counts exactly (relations and
edges include the inverse of every relation and edge, as torch_geometric's Entities datasets
count them), relation sizes drawn from a Zipf law, and power-law source and destination
degrees (a few hub objects take most edges, as literals do in RDF graphs). Labelled entities
of class c link to hub node c through relation 0, so the class is a function of the structure:
a 2-layer R-GCN reads it from the inverse relation's message.

On disk (``write_graph_files`` / ``load_graph_files``): ``triples.tsv`` (head, relation, tail
per line: the forward edges only; the reader adds the inverses), ``train.tsv`` and ``test.tsv``
(node, label per line), tab-separated, each with a header line. Names may be any strings
(URIs, ids); the reader numbers nodes, relations and labels in order of first appearance.
"""
import csv
import os
from dataclasses import dataclass
from typing import Dict, List, Tuple

import torch

# name: (nodes, relations incl. inverses, edges incl. inverses, classes, labelled entities)
STATISTICS: Dict[str, Tuple[int, int, int, int, int]] = {
    "AIFB": (8_285, 90, 58_086, 4, 176),
    "MUTAG": (23_644, 46, 148_454, 2, 340),
    "BGS": (333_845, 206, 1_832_398, 2, 146),
    "AM": (1_666_764, 266, 11_976_642, 11, 1_000),
}
TRAIN_FRACTION = 0.8


@dataclass
class EntityGraph:
    """Typed edges ``edge_index [2, E]`` (sources, destinations), ``edge_type [E]``, and
    labelled nodes split into train / test (``*_idx`` node ids, ``*_y`` classes)."""
    num_nodes: int
    num_relations: int
    edge_index: torch.Tensor
    edge_type: torch.Tensor
    train_idx: torch.Tensor
    train_y: torch.Tensor
    test_idx: torch.Tensor
    test_y: torch.Tensor

    @property
    def num_classes(self) -> int:
        return int(torch.cat([self.train_y, self.test_y]).max()) + 1

    @property
    def num_edges(self) -> int:
        return self.edge_index.shape[1]


def with_inverses(heads: torch.Tensor, rels: torch.Tensor, tails: torch.Tensor,
                  num_base: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(edge_index, edge_type) of the triples and their inverses: relation r + num_base takes
    each edge of r the other way."""
    edge_index = torch.stack([torch.cat([heads, tails]), torch.cat([tails, heads])])
    return edge_index, torch.cat([rels, rels + num_base])


def _split(nodes: torch.Tensor, labels: torch.Tensor, generator: torch.Generator):
    order = torch.randperm(nodes.numel(), generator=generator)
    cut = int(round(TRAIN_FRACTION * nodes.numel()))
    return nodes[order[:cut]], labels[order[:cut]], nodes[order[cut:]], labels[order[cut:]]


def generate(name: str, seed: int = 0, scale: float = 1.0) -> EntityGraph:
    """A graph with ``name``'s statistics (STATISTICS), or ``scale`` times its nodes and edges
    (a small graph of the same shape for tests: relations and classes stay)."""
    if name not in STATISTICS:
        raise ValueError(f"unknown graph {name!r}; known: {', '.join(STATISTICS)}")
    if not 0 < scale <= 1:
        raise ValueError(f"scale must be in (0, 1], got {scale}")
    nodes, relations, edges, classes, labelled = STATISTICS[name]
    base_relations = relations // 2
    if scale < 1:
        nodes = max(int(nodes * scale), 8 * classes)
        labelled = max(4 * classes, min(labelled, nodes // 20))
        edges = max(int(edges * scale), 2 * (labelled + base_relations))
    base_edges = edges // 2
    g = torch.Generator().manual_seed(seed)
    # Labelled entities and the class hubs they link to through relation 0.
    hubs = torch.arange(classes)
    entities = classes + torch.randperm(nodes - classes, generator=g)[:labelled]
    labels = torch.arange(labelled) % classes
    labels = labels[torch.randperm(labelled, generator=g)]
    # The other edges: Zipf relation sizes (every relation non-empty), power-law endpoints.
    rest = base_edges - labelled
    weight = 1.0 / torch.arange(1, base_relations + 1, dtype=torch.float64) ** 1.3
    sizes = torch.ones(base_relations, dtype=torch.int64)
    sizes += torch.bincount(torch.multinomial(weight, rest - base_relations, True, generator=g),
                            minlength=base_relations)
    rels = torch.repeat_interleave(torch.arange(base_relations), sizes)
    popularity = 1.0 / torch.arange(1, nodes + 1, dtype=torch.float64) ** 0.9
    rank_src, rank_dst = torch.randperm(nodes, generator=g), torch.randperm(nodes, generator=g)
    heads = rank_src[torch.multinomial(popularity, rest, True, generator=g)]
    tails = rank_dst[torch.multinomial(popularity, rest, True, generator=g)]
    # Keep the hubs' relation-0 edges the label's only carrier.
    in_hub = (rels == 0) & (tails < classes)
    tails[in_hub] = classes + tails[in_hub]
    heads = torch.cat([entities, heads])
    tails = torch.cat([hubs[labels], tails])
    rels = torch.cat([torch.zeros(labelled, dtype=torch.int64), rels])
    edge_index, edge_type = with_inverses(heads, rels, tails, base_relations)
    return EntityGraph(nodes, relations, edge_index, edge_type, *_split(entities, labels, g))


def _write_tsv(path: str, header: List[str], rows) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)


def write_graph_files(graph: EntityGraph, directory: str) -> None:
    """The graph's forward edges (relations below num_relations / 2) and labels as the files
    load_graph_files reads, with names ``n<id>``, ``r<id>``, ``c<class>``."""
    os.makedirs(directory, exist_ok=True)
    base = graph.num_relations // 2
    keep = graph.edge_type < base
    src, dst, rel = graph.edge_index[0][keep].tolist(), graph.edge_index[1][keep].tolist(), graph.edge_type[keep].tolist()
    _write_tsv(os.path.join(directory, "triples.tsv"), ["head", "relation", "tail"],
               ((f"n{h}", f"r{r}", f"n{t}") for h, r, t in zip(src, rel, dst)))
    for split, idx, y in (("train", graph.train_idx, graph.train_y), ("test", graph.test_idx, graph.test_y)):
        _write_tsv(os.path.join(directory, f"{split}.tsv"), ["node", "label"],
                   ((f"n{n}", f"c{c}") for n, c in zip(idx.tolist(), y.tolist())))


def _read_tsv(path: str, columns: int) -> List[List[str]]:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"missing graph file {path}")
    with open(path, newline="") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != columns:
            raise ValueError(f"{path}:{line}: expected {columns} tab-separated fields, got {len(row)}")
    return rows[1:]


def load_graph_files(directory: str) -> EntityGraph:
    """The EntityGraph of ``triples.tsv``, ``train.tsv`` and ``test.tsv`` in ``directory``
    (see the module docstring), with inverse relations added (R = 2 x the relations named)."""
    triples = _read_tsv(os.path.join(directory, "triples.tsv"), 3)
    node_ids: Dict[str, int] = {}
    rel_ids: Dict[str, int] = {}
    label_ids: Dict[str, int] = {}
    heads = [node_ids.setdefault(h, len(node_ids)) for h, _, _ in triples]
    rels = [rel_ids.setdefault(r, len(rel_ids)) for _, r, _ in triples]
    tails = [node_ids.setdefault(t, len(node_ids)) for _, _, t in triples]
    splits = []
    for split in ("train", "test"):
        rows = _read_tsv(os.path.join(directory, f"{split}.tsv"), 2)
        unknown = [n for n, _ in rows if n not in node_ids]
        if unknown:
            raise ValueError(f"{split}.tsv names node {unknown[0]!r}, which no triple mentions")
        splits.append(torch.tensor([node_ids[n] for n, _ in rows], dtype=torch.int64))
        splits.append(torch.tensor([label_ids.setdefault(c, len(label_ids)) for _, c in rows], dtype=torch.int64))
    edge_index, edge_type = with_inverses(torch.tensor(heads, dtype=torch.int64), torch.tensor(rels, dtype=torch.int64),
                                          torch.tensor(tails, dtype=torch.int64), len(rel_ids))
    return EntityGraph(len(node_ids), 2 * len(rel_ids), edge_index, edge_type, *splits)
