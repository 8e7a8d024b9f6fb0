"""Entity classification with a 2-layer R-GCN (Schlichtkrull et al.'s setup): featureless nodes,
basis decomposition, ReLU between the layers, cross-entropy on the labelled training entities.

    python -m torchsparse_pp.graph.entity_classification --graph AIFB [--epochs 50] [--files DIR]

trains on a generated graph with the statistics of ``--graph`` (or the graph files in DIR, see
datasets.load_graph_files) and prints the train and test accuracy.
"""
import argparse
import sys
import time
from typing import Dict, Optional

import torch
from torch import nn

from .datasets import STATISTICS, EntityGraph, generate, load_graph_files
from .functional import DataflowLike
from .relational_map import relational_map
from .rgcn import RGCNConv


class EntityClassifier(nn.Module):
    """RGCNConv(num_nodes -> hidden) - ReLU - RGCNConv(hidden -> classes) over featureless nodes."""

    def __init__(self, num_nodes: int, num_relations: int, num_classes: int, hidden: int = 16,
                 num_bases: Optional[int] = 30, dataflow: DataflowLike = None):
        super().__init__()
        bases = None if num_bases is None else min(num_bases, num_relations)
        self.conv1 = RGCNConv(num_nodes, hidden, num_relations, num_bases=bases, dataflow=dataflow)
        self.conv2 = RGCNConv(hidden, num_classes, num_relations, num_bases=bases, dataflow=dataflow)

    def forward(self, rmap) -> torch.Tensor:
        return self.conv2(torch.relu(self.conv1(None, rmap)), rmap)


def accuracy(logits: torch.Tensor, index: torch.Tensor, labels: torch.Tensor) -> float:
    return float((logits[index].argmax(1) == labels).double().mean()) if index.numel() else float("nan")


def train_entity_classifier(graph: EntityGraph, epochs: int = 50, hidden: int = 16, num_bases: Optional[int] = 30,
                            lr: float = 0.01, weight_decay: float = 5e-4, seed: int = 0,
                            dataflow: DataflowLike = None) -> Dict[str, float]:
    """Trains an EntityClassifier full-batch with Adam; returns the final train / test accuracy
    and the seconds per epoch."""
    torch.manual_seed(seed)
    rmap = relational_map(graph.edge_index, graph.edge_type, graph.num_relations, graph.num_nodes)
    model = EntityClassifier(graph.num_nodes, graph.num_relations, graph.num_classes, hidden, num_bases, dataflow)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    started = time.perf_counter()
    for _ in range(epochs):
        model.train()
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(rmap)[graph.train_idx], graph.train_y)
        loss.backward()
        optimizer.step()
    seconds = (time.perf_counter() - started) / max(epochs, 1)
    model.eval()
    with torch.no_grad():
        logits = model(rmap)
    return {"train_accuracy": accuracy(logits, graph.train_idx, graph.train_y),
            "test_accuracy": accuracy(logits, graph.test_idx, graph.test_y),
            "loss": float(loss.detach()), "seconds_per_epoch": seconds}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", default="AIFB", choices=sorted(STATISTICS))
    parser.add_argument("--files", default=None, help="a directory of triples.tsv / train.tsv / test.tsv instead")
    parser.add_argument("--scale", type=float, default=1.0, help="generate the graph at this fraction of its size")
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    graph = load_graph_files(args.files) if args.files else generate(args.graph, seed=args.seed, scale=args.scale)
    result = train_entity_classifier(graph, args.epochs, args.hidden, seed=args.seed)
    print(f"{graph.num_nodes} nodes, {graph.num_relations} relations, {graph.num_edges} edges: "
          f"train accuracy {result['train_accuracy']:.3f}, test accuracy {result['test_accuracy']:.3f} "
          f"({result['seconds_per_epoch'] * 1e3:.0f} ms per epoch)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
