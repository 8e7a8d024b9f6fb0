"""benchmarks/rgcn_cpu.py --quick runs end to end on a small AIFB-like graph: every contender
agrees with ours, and the JSON carries timings, peak-memory figures and ratios, and a plot."""
import json
import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
pytest.importorskip("torch_geometric", reason="torch_geometric (the graph peer) is not installed")
sys.path.insert(0, BENCH)
import rgcn_cpu  # noqa: E402


def test_quick_run_writes_json_and_plot(tmp_path):
    out = tmp_path / "out"
    assert rgcn_cpu.main(["--quick", "--threads", "1", "--graphs", "AIFB", "--out", str(out)]) == 0
    report = json.loads((out / "rgcn_cpu.json").read_text())
    (graph,) = report["graphs"]
    assert graph["graph"] == "AIFB" and graph["segments"] <= graph["edges"]
    entry = graph["channels"]["16"]
    assert set(entry["max_rel_error_vs_ours"]) == {"pyg", "pyg_fast", "loop", "ours[gather_scatter]",
                                                   "ours[implicit_gemm]"}
    assert all(e < 1e-4 for e in entry["max_rel_error_vs_ours"].values())
    for mode in ("forward", "train"):
        assert set(entry["timings"][mode]) >= set(rgcn_cpu.CONTENDERS)
        assert set(entry["memory"][mode]) == set(rgcn_cpu.CONTENDERS)
        assert all(m["peak_rss_mib"] >= m["rss_before_mib"] > 0 for m in entry["memory"][mode].values())
        assert set(entry["ratios"][mode]) == {"vs_loop", "vs_faster_pyg", "memory_vs_pyg"}
    assert (out / "rgcn_cpu.png").stat().st_size > 1000


def test_publish_with_quick_is_refused():
    with pytest.raises(SystemExit):
        rgcn_cpu.main(["--quick", "--publish"])


def test_pyg_layers_that_would_not_fit_are_skipped_with_a_reason():
    from torchsparse_pp.graph.datasets import STATISTICS

    class Sized:
        num_edges = STATISTICS["BGS"][2]
    skip = rgcn_cpu.skipped_contenders("BGS", Sized, 64)
    assert set(skip) == {"pyg", "pyg_fast"} and all(skip.values())
    assert rgcn_cpu.skipped_contenders("AIFB", type("S", (), {"num_edges": 58086}), 16) == {}
