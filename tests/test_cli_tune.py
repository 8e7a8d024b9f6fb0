"""`torchsparse-pp tune` end to end: --out is checked before
the search, the file is named inside a directory, the printed command reproduces the model, a
mismatch names the setting, few repeats give a warning, the bars and the table agree; the shipped
CenterPoint backbone files apply from `train`."""
import re
import shlex

import pytest
import yaml

from test_cli_support import REPO, cli, cli_many, one_error_line, snapshot, tiny_config, tiny_data


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    base = tmp_path_factory.mktemp("cli_tune")
    config = tiny_config(base / "c.yaml", tiny_data(base / "data"), base / "run")
    (base / "tuned").mkdir()
    proc = cli("tune", "--config", config, "--synthetic", "--samples", 1, "--repeats", 1, "--warmup", 0,
               "--space", "compact", "--threads", 1, "--out", base / "tuned", "data.voxel_size=0.5", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return base, config, base / "tuned" / "c_inference_cpu.yaml", proc


def printed_command(stdout: str):
    line = stdout.splitlines()[stdout.splitlines().index(next(l for l in stdout.splitlines()
                                                              if l.endswith("use it with:"))) + 1]
    args = shlex.split(line)
    assert args[:2] == ["torchsparse-pp", "train"]
    return args[2:]


def test_out_directory_names_the_file_and_few_repeats_warn(tuned):
    base, config, path, proc = tuned
    assert sorted(p.name for p in (base / "tuned").iterdir()) == [path.name]
    doc = yaml.safe_load(path.read_text())
    assert doc["meta"]["settings"] == {"model.name": "minkunet", "model.cr": 0.125, "data.format": "semantickitti"}
    assert printed_command(proc.stdout) == ["--config", str(config), "--tuned", str(path), "data.voxel_size=0.5"]
    assert re.search(r"^warning: --repeats 1: .* Use --repeats 5 or more", proc.stderr, re.M)


def test_bars_and_table_agree(tuned):
    _, _, _, proc = tuned
    selected = re.search(r"^\s+(.+?)\s+[\d.]+ ms\s+\[[\d.]+, [\d.]+\]\s+<- selected$", proc.stdout, re.M).group(1)
    assert f"selected: {selected} (" in proc.stdout          # the line after the bars
    assert "final check (inference)" in proc.stderr           # the final check has its bar
    assert "pick=" in proc.stderr and "best=" not in proc.stderr
    if "greedy" not in selected.split(" = "):                 # overruled greedy picks are shown, not hidden
        assert "greedy pick" in proc.stdout


def test_printed_command_trains_and_a_mismatch_names_the_setting(tuned):
    base, _, path, proc = tuned
    args = printed_command(proc.stdout)
    run = base / "h"
    ok, other = cli_many(("train", *args, "--run-dir", run, "train.max_steps=1"),
                         ("train", *args, "--run-dir", base / "other", "model.cr=0.25"))
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert f"tuned configs from {path} on 42 sparse convs" in ok.stdout
    line = one_error_line(other)
    assert "model.cr: 0.125 (tuned file) vs 0.25 (this config)" in line and "data.voxel_size=0.5" in line
    assert not (base / "other").exists()

    before = snapshot(run)
    proc = cli("eval", "--checkpoint", run / "last.pt", "--tuned", path, "train.tuned_strict=false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {k: v for k, v in snapshot(run).items() if not k.startswith("eval-")} == before
    made = next(p for p in run.iterdir() if p.name.startswith("eval-"))
    assert yaml.safe_load((made / "config.yaml").read_text())["train"]["tuned"] == str(path)


def test_out_is_checked_before_tuning(tuned, tmp_path):
    base, config, path, _ = tuned
    before = snapshot(base / "tuned")
    common = ("tune", "--config", config, "--synthetic", "--samples", 1)
    exists, under_file = cli_many((*common, "--out", path), (*common, "--out", config / "x.yaml"))
    assert "exists; choose another path or pass --force" in one_error_line(exists)
    assert "c.yaml' exists and is not a directory" in one_error_line(under_file)
    for proc in (exists, under_file):
        assert proc.stdout == "" and "tuning" not in proc.stderr
    assert snapshot(base / "tuned") == before


def test_unknown_version_is_named(tuned, tmp_path):
    base, config, path, _ = tuned
    doc = yaml.safe_load(path.read_text())
    doc["torchsparse_pp_tuned"] = 2
    (tmp_path / "v2.yaml").write_text(yaml.safe_dump(doc))
    line = one_error_line(cli("train", "--config", config, "--tuned", tmp_path / "v2.yaml", "--run-dir",
                              tmp_path / "run"))
    assert "a tuned file of version 2" in line and "reads version 1" in line
    assert not (tmp_path / "run").exists()


def test_shipped_centerpoint_backbone_files_apply_from_train(tmp_path):
    data = tiny_data(tmp_path / "det", fmt="detection", scans=1)
    common = ("train", "--config", REPO / "configs" / "centerpoint_synthetic.yaml", "--tuned",
              REPO / "configs" / "tuned" / "centerpoint_backbone_inference_cpu.yaml", f"data.root={data}",
              "data.batch_size=1", "train.max_steps=1", "train.threads=1", "train.progress=false")
    loose, strict = cli_many((*common, "train.tuned_strict=false", "--run-dir", tmp_path / "run"),
                             (*common, "--run-dir", tmp_path / "strict"))
    assert loose.returncode == 0, loose.stderr[-3000:]
    assert "on 21 sparse convs of backbone" in loose.stdout
    line = one_error_line(strict)
    assert "VoxelResBackBone8x (backbone)" in line and "torchsparse-pp tune --config" in line
    assert not (tmp_path / "strict").exists()
