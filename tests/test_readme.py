"""The README's Python examples run as written (in order, sharing one namespace), and its headline
numbers are those of the published results it names."""
import json
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


def headline_rows(title_start: str):
    """The rows of the README table whose header row starts with title_start, as cell lists."""
    with open(README) as f:
        lines = f.read().split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {title_start}"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def results_of(cell: str) -> dict:
    match = re.fullmatch(r"`(benchmarks/results/[\w/]+\.json)`", cell)
    assert match, f"the result column names no results file: {cell!r}"
    with open(os.path.join(os.path.dirname(README), match.group(1))) as f:
        return json.load(f)


def test_readme_e2e_numbers_are_the_published_ones():
    rows = headline_rows("machine, date | inference vs spconv")
    assert len(rows) >= 3
    for machine, inference, training, bf16, maps, result in rows:
        run = results_of(result)
        minkunet = next(m for m in run["models"] if m["model"] == "MinkUNet 0.5x")["summary"]
        assert machine.endswith(run["machine"]["date"][:10]), machine
        assert inference == (f"{minkunet['default_vs_spconv1t_inference']:.2f}x / "
                             f"{minkunet['default_vs_spconv_inference_racy']:.2f}x"), machine
        assert training == f"{minkunet['train_vs_spconv1t']:.2f}x / {minkunet['train_vs_spconv_racy']:.2f}x", machine
        assert bf16 == f"{minkunet['bf16_over_fp32_inference']:.2f}x", machine
        assert maps == f"{run['kernel_maps']['total_vs_spconv']:.2f}x", machine


def test_readme_workload_numbers_are_the_published_ones():
    rows = headline_rows("machine, date | inference | training step")
    assert len(rows) >= 1
    for machine, inference, training, spconv_racy, result in rows:
        mean = results_of(result)["geomean_speedup"]
        assert inference == f"{mean['inference']['ours-default@2t']:.2f}x", machine
        assert training == f"{mean['training']['ours-default@2t']:.2f}x", machine
        assert spconv_racy == f"{mean['inference']['spconv@2t']:.2f}x / {mean['training']['spconv@2t']:.2f}x", machine
