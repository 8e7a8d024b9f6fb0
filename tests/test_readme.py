"""The README's Python examples run as written (in order, sharing one namespace)."""
import os
import re

import torch

from torchsparse_pp import backends
from torchsparse_pp.nn.functional import get_default_config, set_default_config

README = os.path.join(os.path.dirname(__file__), os.pardir, "README.md")


def test_readme_python_blocks_run():
    with open(README) as f:
        blocks = re.findall(r"```python[^\n]*\n(.*?)```", f.read(), flags=re.S)
    assert len(blocks) >= 2, "the README lost its Python examples"
    namespace = {}
    flag = backends.deterministic
    try:
        for block in blocks:
            exec(compile(block, "README.md", "exec"), namespace)
    finally:
        set_default_config(None)
        backends.deterministic = flag
    assert namespace["y"].F.shape[1] == 32 and torch.isfinite(namespace["y"].F).all()
    assert get_default_config().forward.dataflow == "fetch_on_demand"  # the README's block resets the default
