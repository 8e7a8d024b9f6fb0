"""docs/graph.md's Python examples run as written (in order, sharing one namespace)."""
import os
import re

import torch

DOC = os.path.join(os.path.dirname(__file__), os.pardir, "docs", "graph.md")


def test_graph_doc_python_blocks_run():
    with open(DOC) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)
    assert len(blocks) == 3, "docs/graph.md lost (or gained) Python examples"
    namespace = {}
    for block in blocks:
        exec(compile(block, "docs/graph.md", "exec"), namespace)
    assert namespace["out"].shape == (100, 32) and namespace["h"].shape == (100, 32)
    assert namespace["conv"].weight.grad is not None and torch.isfinite(namespace["y_default"]).all()
    assert namespace["result"]["train_accuracy"] == 1.0
