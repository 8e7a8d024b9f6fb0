"""benchmarks/workloads.py: the seven workloads are built with each dataset's beams, frames,
voxel grid and point features (multi-frame inputs aligned by the true poses), and --quick runs
end to end on tiny inputs, checks ours against spconv and writes its JSON and plot."""
import json
import os
import sys

import numpy as np
import pytest

from conftest import fresh_seed

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
pytest.importorskip("spconv")
sys.path.insert(0, BENCH)
import workloads  # noqa: E402


def test_frames_are_aligned_by_the_true_poses():
    """The last sweep's static points and the earlier sweeps' coincide; the time lag counts back."""
    from torchsparse_pp.data.synthetic import POLE
    from torchsparse_pp.data.synthetic_sequence import generate_sequence
    seed = fresh_seed() % 1000
    points = workloads.frames_in_last_frame("nuscenes32", 3, 0.05, seed)
    seq = generate_sequence("nuscenes32", seed, [-0.1, -0.05, 0.0])
    assert points.shape == (sum(len(p) for p in seq.points), 6)
    lags = points[:, 5]
    assert np.array_equal(np.unique(lags), [0.0, 0.05, 0.1]) and (lags[:len(seq.points[2])] == 0).all()
    now = points[:len(seq.points[2])][seq.labels[2] == POLE][:, :3]
    before = points[np.isclose(lags, 0.1)][seq.labels[0] == POLE][:, :3]
    distance = np.sqrt(((now[:, None] - before[None]) ** 2).sum(-1)).min(1)
    assert np.median(distance) < 0.1


def test_every_workload_has_its_dataset_shape():
    expected = {"SK-M0.5x": (4, 0.5), "SK-M1x": (4, 1.0), "NS-M1f": (5, 1.0), "NS-M3f": (6, 1.0),
                "NS-C10f": (5, "nuscenes"), "WM-C1f": (5, "waymo"), "WM-C3f": (6, "waymo")}
    assert list(workloads.WORKLOADS) == list(expected)
    for name, (features, size) in expected.items():
        w, info = workloads.build(name, quick=True)
        assert info["point_features"] == features and info["size"] == size and info["voxels"] > 100, name
        if info["model"] == "VoxelResBackBone8x":
            grid = {"nuscenes": [0.075, 0.075, 0.2], "waymo": [0.1, 0.1, 0.15]}[size]
            assert np.allclose(info["voxel_m"], grid) and w.shape in ([1440, 1440, 41], [1504, 1504, 41])
    assert workloads.WORKLOADS["NS-C10f"][3] == 10 and workloads.WORKLOADS["WM-C3f"][3] == 3


def test_quick_run_writes_json_and_plot(tmp_path):
    out = tmp_path / "out"
    assert workloads.main(["--quick", "--threads", "1", "--workloads", "SK-M0.5x,NS-M3f,WM-C3f",
                           "--out", str(out)]) == 0
    report = json.loads((out / "workloads.json").read_text())
    assert [r["workload"] for r in report["workloads"]] == ["SK-M0.5x", "NS-M3f", "WM-C3f"]
    for row in report["workloads"]:
        assert row["output_rel_err_vs_spconv_1t"] < workloads.TOLERANCE
        for mode in ("inference", "training"):
            assert row["speedup"][mode]["spconv@1t"] == 1.0
            assert row["timings_s"][mode]["ours-default@1t"] > 0
    assert "ours-tuned@1t" in report["workloads"][0]["timings_s"]["inference"]  # MinkUNet 0.5x has a tuned file
    assert "no tuned file" in report["workloads"][1]["tuned"]["inference"]
    assert report["racy"] == [] and report["quick"]
    assert (out / "workloads.png").stat().st_size > 10_000
