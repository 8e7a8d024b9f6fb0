"""The training CLI on the multi-frame formats, end to end on synthetic sets: MinkUNet on 3-sweep
nuScenes-lidarseg, CenterPoint (with velocities) on nuScenes detection and on Waymo (1 and 3
frames), each from its shipped config made tiny by overrides; the config checks of data.sweeps,
data.version and the point features; CenterPoint's velocity targets, decoding and augmentations."""
import csv
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import fresh_seed
from synthetic_roots import synthetic_root
from torchsparse_pp.cli import main as cli_main
from torchsparse_pp.data.transforms import RandomFlip, RandomScale, rotate_z
from torchsparse_pp.models.centerpoint import CenterPointConfig
from torchsparse_pp.models.centerpoint.decode import decode_boxes
from torchsparse_pp.models.centerpoint.head import regression_branches
from torchsparse_pp.models.centerpoint.targets import build_targets
from torchsparse_pp.train import ConfigError, load_config

TINY_CENTERPOINT = ("model.centerpoint={point_cloud_range: [-12.8, -12.8, %s, 12.8, 12.8, %s], "
                    "voxel_size: [0.2, 0.2, 0.2], bev_layer_nums: [1, 1], bev_filters: [16, 32], "
                    "bev_upsample_filters: [16, 16], head_channels: 16}")
CONFIGS = Path(__file__).resolve().parent.parent / "configs"
CPU = ["train.device=cpu", "train.amp=false", "data.num_workers=0", "data.batch_size=1", "train.max_steps=2",
       "train.epochs=1", "train.threads=1", "train.progress=false", "data.max_scans=2"]


@pytest.fixture(scope="module")
def nuscenes_root(tmp_path_factory):
    return synthetic_root(tmp_path_factory, "nuscenes", scans=2, sweeps=3)


@pytest.fixture(scope="module")
def waymo_root(tmp_path_factory):
    return synthetic_root(tmp_path_factory, "waymo", scans=3)


def train(config, root, run_dir, *overrides):
    code = cli_main(["train", "--config", str(CONFIGS / f"{config}.yaml"), f"data.root={root}", f"train.run_dir={run_dir}",
                     f"train.seed={fresh_seed() % 1000}", *CPU, *overrides])
    assert code == 0
    rows = list(csv.DictReader(open(run_dir / "train.csv")))
    assert [int(r["step"]) for r in rows][-1] == 2 and all(math.isfinite(float(r["loss"])) for r in rows)
    return rows


def test_minkunet_on_three_sweeps(nuscenes_root, tmp_path):
    train("nuscenes_minkunet_3sweeps", nuscenes_root, tmp_path / "run", "data.version=v1.0-synth", "model.cr=0.25",
          "data.voxel_size=0.4", "data.crop=10.0")
    state = torch.load(tmp_path / "run" / "last.pt", weights_only=True)["model"]
    stem = next(v for k, v in state.items() if k.endswith("kernel"))
    assert stem.shape[1] == 6  # x, y, z, intensity, ring, time lag


def test_centerpoint_on_nuscenes_with_velocity(nuscenes_root, tmp_path):
    train("centerpoint_nuscenes", nuscenes_root, tmp_path / "run", "data.version=v1.0-synth", "data.sweeps=3",
          TINY_CENTERPOINT % (-5.0, 3.0))
    state = torch.load(tmp_path / "run" / "last.pt", weights_only=True)["model"]
    assert state["head.branches.vel.3.weight"].shape[0] == 2


@pytest.mark.parametrize("config, features", [("centerpoint_waymo", 5), ("centerpoint_waymo_3frames", 6)])
def test_centerpoint_on_waymo(waymo_root, tmp_path, config, features):
    train(config, waymo_root, tmp_path / "run", TINY_CENTERPOINT % (-2.0, 4.0))
    state = torch.load(tmp_path / "run" / "last.pt", weights_only=True)["model"]
    stem = next(v for k, v in state.items() if k.endswith("kernel"))
    assert stem.shape[1] == features and not any(".vel." in k for k in state)


def test_config_checks_of_frames_and_versions():
    base = ["data.root=x"]
    with pytest.raises(ConfigError, match="data.sweeps=3: the semantickitti format has single frames"):
        load_config(None, base + ["data.sweeps=3"])
    with pytest.raises(ConfigError, match="data.version='v1' has no meaning for data.format='detection'"):
        load_config(None, base + ["data.format=detection", "model.name=centerpoint", "data.version=v1"])
    with pytest.raises(ConfigError, match="nuscenes_detection needs data.version"):
        load_config(None, base + ["data.format=nuscenes_detection", "model.name=centerpoint"])
    with pytest.raises(ConfigError, match="data.sweeps=3 on nuscenes needs data.version"):
        load_config(None, base + ["data.format=nuscenes", "data.sweeps=3"])
    with pytest.raises(ConfigError, match="point_features=5 differs from the 6 features per point"):
        load_config(CONFIGS / "centerpoint_waymo_3frames.yaml", ["model.centerpoint={point_features: 5}"])
    with pytest.raises(ConfigError, match="centerpoint trains on detection, nuscenes_detection, waymo"):
        load_config(None, base + ["data.format=waymo"])
    assert load_config(CONFIGS / "nuscenes_minkunet_3sweeps.yaml").point_features == 6
    assert load_config(CONFIGS / "centerpoint_nuscenes.yaml").point_features == 5


def test_velocity_targets_decode_back():
    gen = torch.Generator().manual_seed(fresh_seed())
    config = CenterPointConfig.nuscenes(point_cloud_range=(-12.8, -12.8, -5.0, 12.8, 12.8, 3.0),
                                        voxel_size=(0.2, 0.2, 0.2), num_classes=3)
    # boxes on distinct cells, far enough apart for the 3 x 3 peak search
    cells = torch.randperm(64, generator=gen)[:4]
    xy = torch.stack([cells % 8, cells // 8], 1).float() * 3.2 - 11.2
    boxes = torch.cat([xy, torch.rand(4, 1, generator=gen), 1 + 3 * torch.rand(4, 3, generator=gen),
                       (torch.rand(4, 1, generator=gen) - 0.5) * 6, (torch.rand(4, 2, generator=gen) - 0.5) * 20], 1)
    labels = torch.randint(3, (4,), generator=gen)
    x_cells, y_cells = config.bev_size
    targets = build_targets([boxes], [labels], config, (y_cells, x_cells), torch.device("cpu"))
    assert targets.regression.shape == (1, 4, 10)
    torch.testing.assert_close(targets.regression[0, :, 8:], boxes[:, 7:9])
    heat = targets.heatmap.clamp(1e-4, 1 - 1e-4)
    outputs = {"heatmap": torch.log(heat / (1 - heat))}
    reg = torch.zeros(1, 10, y_cells * x_cells)
    reg[0, :, targets.index[0]] = targets.regression[0].T
    start = 0
    for name, channels in regression_branches(True):
        outputs[name] = reg[:, start:start + channels].reshape(1, channels, y_cells, x_cells)
        start += channels
    pred = decode_boxes(outputs, config)[0]
    order, truth = torch.argsort(pred["boxes"][:, 0] * 100 + pred["boxes"][:, 1]), torch.argsort(xy[:, 0] * 100 + xy[:, 1])
    assert pred["boxes"].shape == (4, 9)
    torch.testing.assert_close(pred["boxes"][order][:, 7:9], boxes[truth][:, 7:9], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"boxes must be a \[M, 9\] tensor \(x, y, z, dx, dy, dz, yaw, vx, vy\)"):
        build_targets([boxes[:, :7]], [labels], config, (y_cells, x_cells), torch.device("cpu"))
    with pytest.raises(ValueError, match="code_weights needs 10 entries"):
        CenterPointConfig.synthetic(velocity=True)


def test_augmentations_move_velocities_with_the_boxes():
    rng = np.random.default_rng(fresh_seed())
    boxes = np.concatenate([rng.uniform(-20, 20, (6, 3)), rng.uniform(1, 4, (6, 3)), rng.uniform(-3, 3, (6, 1)),
                            rng.uniform(-10, 10, (6, 2))], 1).astype(np.float32)
    frame = {"points": rng.uniform(-20, 20, (50, 4)).astype(np.float32), "boxes": boxes,
             "box_labels": np.zeros(6, np.int64)}
    angle = float(rng.uniform(-3, 3))
    turned = rotate_z(frame, angle)["boxes"]
    c, s = math.cos(angle), math.sin(angle)
    expected = np.stack([c * boxes[:, 7] - s * boxes[:, 8], s * boxes[:, 7] + c * boxes[:, 8]], 1)
    np.testing.assert_allclose(turned[:, 7:9], expected, rtol=1e-5, atol=1e-5)
    # a moving box's velocity keeps its angle to the heading under every flip
    flipped = RandomFlip(p=1.0)(frame)["boxes"]
    assert np.allclose(flipped[:, 7:9], -boxes[:, 7:9])  # both axes mirrored: x -> -x, y -> -y
    before = np.arctan2(boxes[:, 8], boxes[:, 7]) - boxes[:, 6]
    after = np.arctan2(flipped[:, 8], flipped[:, 7]) - flipped[:, 6]
    assert np.allclose(np.remainder(before - after + np.pi, 2 * np.pi) - np.pi, 0, atol=1e-5)
    scaled = RandomScale(1.5, 1.5)(frame)["boxes"]
    np.testing.assert_allclose(scaled[:, 7:9], 1.5 * boxes[:, 7:9], rtol=1e-6)


@pytest.mark.parametrize("config", ["centerpoint_nuscenes", "centerpoint_waymo_3frames", "nuscenes_minkunet_3sweeps"])
def test_synthetic_data_for_a_config(tmp_path, config):
    """What `torchsparse-pp tune --synthetic` trains on: a set the config's reader reads."""
    from torchsparse_pp.train.data import build_dataset, write_synthetic_data
    probe = load_config(CONFIGS / f"{config}.yaml", ["data.root=placeholder"])
    overrides = write_synthetic_data(probe, tmp_path / "data", scans=1)
    dataset = build_dataset(load_config(CONFIGS / f"{config}.yaml", overrides), train=False)
    assert len(dataset) == 1 and dataset.reader.point_features == probe.point_features
