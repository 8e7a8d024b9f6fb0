"""Hardened table readers: nuScenes tables and Waymo info files that are malformed (not JSON or not
a pickle, missing keys, wrong shapes, broken prev chains, unknown tokens, non-rotations, foreign
objects in a pickle) raise a clear Python error that names the file and the problem; nothing
is read silently wrong."""
import json
import pickle
from collections import Counter

import numpy as np
import pytest

from synthetic_roots import synthetic_root
from torchsparse_pp.data import NuScenesLidarSeg
from torchsparse_pp.data.nuscenes_detection import NuScenesDetection
from torchsparse_pp.data.waymo import DEFAULT_TAG, WaymoDataset


@pytest.fixture(scope="module")
def nuscenes_root(tmp_path_factory):
    return synthetic_root(tmp_path_factory, "nuscenes", scans=2, sweeps=2)


@pytest.fixture(scope="module")
def waymo_root(tmp_path_factory):
    return synthetic_root(tmp_path_factory, "waymo", scans=2)


def copy_tree(src, dst):
    import shutil
    shutil.copytree(src, dst)
    return dst


def edit_table(root, name, change):
    path = root / "v1.0-synth" / f"{name}.json"
    rows = json.loads(path.read_text())
    change(rows)
    path.write_text(json.dumps(rows))
    return path


def key_frames(rows):
    return [r for r in rows if r["is_key_frame"]]


def read_sweeps(root):
    """Every frame of both readers that read sweeps."""
    for split in ("train", "val"):
        ds = NuScenesLidarSeg(root, split, 0.5, sweeps=2, version="v1.0-synth")
        for k in range(len(ds)):
            ds.read_frame(k)
        det = NuScenesDetection(root, "v1.0-synth", split, sweeps=2, min_points=0)
        for k in range(len(det)):
            det.read_frame(k)


def latest_key(rows):
    return max(key_frames(rows), key=lambda r: r["timestamp"])


NUSCENES_CASES = {
    "not_json": ("sample_data", None, r"sample_data\.json' is not valid JSON"),
    "missing_field": ("sample_data", lambda rows: latest_key(rows).pop("ego_pose_token"),
                      r"a record of .*sample_data\.json lacks the field 'ego_pose_token'"),
    "unknown_prev": ("sample_data", lambda rows: latest_key(rows).update(prev="nope"),
                     r"the prev of .*sample_data\.json record '\w+' refers to sample_data token 'nope', which .*sample_data\.json lacks"),
    "prev_not_earlier": ("sample_data", lambda rows: latest_key(rows).update(timestamp=0),
                         r"sample_data\.json: the prev chain of '\w+' is broken: .* is not earlier"),
    "duplicate_token": ("sample_data", lambda rows: rows.append(dict(rows[0])),
                        r"sample_data\.json: token '\w+' appears twice"),
    "timestamp_type": ("sample_data", lambda rows: rows[0].update(timestamp="soon"),
                       r"sample_data\.json: the timestamp of '\w+' must be an integer"),
    "unit_quaternion": ("ego_pose", lambda rows: [r.update(rotation=[1.0, 0.5, 0.0, 0.0]) for r in rows],
                        r"ego_pose\.json record '\w+': the rotation quaternion \[1\.0, 0\.5, 0\.0, 0\.0\] has norm"),
    "translation_shape": ("calibrated_sensor", lambda rows: rows[0].update(translation=[0.9, 1.8]),
                          r"calibrated_sensor\.json: field 'translation' of '\w+' must be 3 finite numbers"),
    "unknown_sensor": ("calibrated_sensor", lambda rows: rows[0].update(sensor_token="gone"),
                       r"calibrated_sensor\.json record '\w+' refers to sensor token 'gone', which .*sensor\.json lacks"),
    "annotation_size": ("sample_annotation", lambda rows: rows[0].update(size=[1.0, -2.0, 1.5]),
                        r"sample_annotation\.json record '\w+': box sizes must be positive"),
    "unknown_instance": ("sample_annotation", lambda rows: rows[0].update(instance_token="who"),
                         r"sample_annotation\.json record '\w+' refers to instance token 'who', which .*instance\.json lacks"),
    "not_a_list": ("ego_pose", lambda rows: None, r"ego_pose\.json' must hold a JSON list of records"),
}


@pytest.mark.parametrize("case", sorted(NUSCENES_CASES))
def test_malformed_nuscenes_tables_name_the_file_and_the_problem(nuscenes_root, tmp_path, case):
    root = copy_tree(nuscenes_root, tmp_path / "root")
    table, change, pattern = NUSCENES_CASES[case]
    path = root / "v1.0-synth" / f"{table}.json"
    if case == "not_json":
        path.write_text(path.read_text()[:-20])
    elif case == "not_a_list":
        path.write_text(json.dumps({"records": json.loads(path.read_text())}))
    else:
        edit_table(root, table, change)
    with pytest.raises(ValueError, match=pattern) as raised:
        read_sweeps(root)
    assert str(path) in str(raised.value)


def test_broken_chains_and_missing_files(nuscenes_root, tmp_path):
    root = copy_tree(nuscenes_root, tmp_path / "root")
    read_sweeps(root)  # the copy itself is fine
    # a prev that reaches a sweep of another sensor
    def other_channel(rows):
        rows.append({"token": "radar", "channel": "RADAR_FRONT", "modality": "radar"})
    edit_table(root, "sensor", other_channel)
    edit_table(root, "calibrated_sensor", lambda rows: rows.append(dict(rows[0], token="cs-radar",
                                                                         sensor_token="radar")))
    edit_table(root, "sample_data", lambda rows: [r.update(calibrated_sensor_token="cs-radar")
                                                  for r in rows if not r["is_key_frame"]])
    with pytest.raises(ValueError, match=r"the prev chain of '\w+' \(LIDAR_TOP\) reaches '\w+' of channel RADAR_FRONT"):
        read_sweeps(root)

    root = copy_tree(nuscenes_root, tmp_path / "files")
    sweep = next(root.glob("sweeps/LIDAR_TOP/*.pcd.bin"))
    sweep.unlink()
    with pytest.raises(FileNotFoundError, match=rf"names '{sweep.relative_to(root)}', but .* does not exist"):
        read_sweeps(root)
    sweep.write_bytes(b"\x00" * 21)
    with pytest.raises(ValueError, match=r"has 21 bytes, not a multiple of the 20-byte record") as raised:
        read_sweeps(root)
    assert str(sweep) in str(raised.value)


def test_index_files_must_agree_with_the_tables(nuscenes_root, tmp_path):
    root = copy_tree(nuscenes_root, tmp_path / "root")
    lines = (root / "splits" / "train.txt").read_text().split()
    (root / "splits" / "swapped.txt").write_text(f"{lines[0]} {lines[3]}\n")
    with pytest.raises(ValueError, match=r"swapped\.txt pairs .* but .*lidarseg\.json gives that sweep the labels"):
        NuScenesLidarSeg(root, "swapped", version="v1.0-synth")
    sweep = next(root.glob("sweeps/LIDAR_TOP/*.pcd.bin")).relative_to(root)
    (root / "splits" / "sweep.txt").write_text(f"{sweep} {lines[1]}\n")
    (root / "extra.pcd.bin").write_bytes(b"\x00" * 20)
    (root / "splits" / "stray.txt").write_text(f"extra.pcd.bin {lines[1]}\n")
    with pytest.raises(ValueError, match=r"stray\.txt lists .*extra\.pcd\.bin', which no record of .*sample_data\.json"):
        NuScenesLidarSeg(root, "stray", version="v1.0-synth")
    with pytest.raises(ValueError, match=r"unknown split 'test': no scene list .*test_scenes\.txt"):
        NuScenesDetection(root, "v1.0-synth", "test")


# --- Waymo ---------------------------------------------------------------------------------------
def segment_pkl(root):
    """The info file of the train split's segment."""
    segment = (root / "ImageSets" / "train.txt").read_text().split()[0][:-len(".tfrecord")]
    return root / DEFAULT_TAG / segment / f"{segment}.pkl"


def edit_infos(root, change):
    path = segment_pkl(root)
    with open(path, "rb") as f:
        infos = pickle.load(f)
    change(infos)
    with open(path, "wb") as f:
        pickle.dump(infos, f)
    return path


WAYMO_CASES = {
    "missing_pose": (lambda infos: infos[0].pop("pose"), r"info 0 lacks the key 'pose'"),
    "pose_shape": (lambda infos: infos[1].update(pose=np.eye(4)[:3]), r"'pose' must be a finite 4 x 4 matrix"),
    "pose_not_rigid": (lambda infos: infos[1].update(pose=np.diag([2.0, 1.0, 1.0, 1.0])),
                       r"'pose' is not a rigid transform"),
    "sample_idx": (lambda infos: infos[1]["point_cloud"].update(sample_idx=-3),
                   r"info 1's sample_idx must be a non-negative int"),
    "duplicate_frame": (lambda infos: infos[1]["point_cloud"].update(sample_idx=0), r"frame 0 appears twice"),
    "other_segment": (lambda infos: infos[0]["point_cloud"].update(lidar_sequence="segment-x"),
                      r"info 0 belongs to segment 'segment-x'"),
    "boxes_shape": (lambda infos: infos[0]["annos"].update(gt_boxes_lidar=np.zeros((len(infos[0]["annos"]["name"]), 8))),
                    r"gt_boxes_lidar must be \[M, 7\] or \[M, 9\]"),
    "no_annos": (lambda infos: infos[0].pop("annos"), r"'annos' must hold 'name' and 'gt_boxes_lidar'"),
    "not_a_list": (lambda infos: infos.clear(), r"must hold a non-empty list of frame infos"),
    "foreign_object": (lambda infos: infos[0].update(extra=Counter("ab")),
                       r"holds an object of collections\.Counter; an info file holds only"),
}


@pytest.mark.parametrize("case", sorted(WAYMO_CASES))
def test_malformed_waymo_infos_name_the_file_and_the_problem(waymo_root, tmp_path, case):
    root = copy_tree(waymo_root, tmp_path / "root")
    change, pattern = WAYMO_CASES[case]
    path = edit_infos(root, change)
    with pytest.raises(ValueError, match=pattern) as raised:
        ds = WaymoDataset(root, "train", frames=2)
        for k in range(len(ds)):
            ds.read_frame(k)
    assert str(path) in str(raised.value)


def test_waymo_files_that_are_not_what_they_claim(waymo_root, tmp_path):
    root = copy_tree(waymo_root, tmp_path / "root")
    pkl = segment_pkl(root)
    pkl.write_bytes(pkl.read_bytes()[:100])
    with pytest.raises(ValueError, match=r"is not a readable pickle file") as raised:
        WaymoDataset(root, "train")
    assert str(pkl) in str(raised.value)

    root = copy_tree(waymo_root, tmp_path / "npy")
    frame = segment_pkl(root).parent / "0001.npy"
    np.save(frame, np.load(frame)[:, :5])
    with pytest.raises(ValueError, match=r"0001\.npy' holds 5 columns; a Waymo frame has 6"):
        WaymoDataset(root, "train").read_frame(1)

    root = copy_tree(waymo_root, tmp_path / "gap")
    path = edit_infos(root, lambda infos: infos.pop(0))
    with pytest.raises(ValueError, match=r"has no frame 0, which frame 1 needs for frames=2") as raised:
        WaymoDataset(root, "train", frames=2).read_frame(0)
    assert str(path) in str(raised.value)
    with pytest.raises(FileNotFoundError, match=r"processed-data folder .*other_tag' does not exist"):
        WaymoDataset(root, "train", tag="other_tag")
    with pytest.raises(ValueError, match=r"unknown split 'test'.*\['train', 'val'\]"):
        WaymoDataset(root, "test")
