"""A run directory belongs to the run that made it: the real
CLI in a subprocess on tiny generated data, with the files on disk compared before and after."""
import csv
import shutil

import pytest
import torch
import yaml

from test_cli_support import cli, cli_many, one_error_line, snapshot, tiny_config, tiny_data
from torchsparse_pp.train.optim import WarmupCosine

LR = 0.004


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One finished 2-step run in base/a (checkpoints after each step), trained with overrides
    before and after the options."""
    base = tmp_path_factory.mktemp("cli_runs")
    data = tiny_data(base / "data")
    config = tiny_config(base / "c.yaml", data, base / "elsewhere")
    proc = cli("train", "data.augment=false", "--config", config, "--run-dir", base / "a",
               "train.checkpoint_every=1", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return base, config, proc


def outside_evals(snap):
    return {k: v for k, v in snap.items() if not k.startswith("eval-")}


def test_overrides_anywhere_and_the_run_files(run):
    base, _, proc = run
    a = base / "a"
    assert sorted(p.name for p in a.iterdir()) == ["config.yaml", "eval.csv", "eval.json", "last.pt", "step_1.pt",
                                                   "step_2.pt", "train.csv"]
    assert not (base / "elsewhere").exists()  # --run-dir wins over the config's train.run_dir
    stored = yaml.safe_load((a / "config.yaml").read_text())
    assert stored["data"]["augment"] is False and stored["train"]["checkpoint_every"] == 1
    assert stored["train"]["run_dir"] == str(a)
    # Warnings are single lines without Python's source line; TensorBoard's appears at most once.
    warnings = [line for line in proc.stderr.splitlines() if "tensorboard" in line.lower()]
    assert len(warnings) <= 1 and all(line.startswith("warning: ") for line in warnings)
    assert "warnings.warn" not in proc.stderr and "UserWarning" not in proc.stderr


def test_logged_lr_is_the_steps_own(run):
    base, _, _ = run
    logged = [float(r["lr"]) for r in rows(base / "a" / "train.csv")]
    schedule = WarmupCosine(total=2, warmup=0, min_ratio=0.0, cosine=True)
    assert logged == pytest.approx([LR * schedule(0), LR * schedule(1)])
    assert logged[0] == pytest.approx(LR)  # the first step runs at the full lr, not the next step's


def test_eval_writes_only_its_own_directory(run):
    base, _, _ = run
    a = base / "a"
    before = snapshot(a)
    proc = cli("eval", "--checkpoint", a / "last.pt", "train.progress=false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert outside_evals(snapshot(a)) == before  # the training run's files are untouched
    made = [p for p in a.iterdir() if p.name.startswith("eval-")]
    assert len(made) == 1 and sorted(p.name for p in made[0].iterdir()) == ["config.yaml", "eval.json"]
    result = yaml.safe_load((made[0] / "eval.json").read_text())
    assert result["step"] == 2 and 0 <= result["miou"] <= 1
    assert f"wrote {made[0] / 'eval.json'}" in proc.stdout

    other, into_run = cli_many(("eval", "--checkpoint", a / "last.pt", "data.voxel_size=0.5", "model.cr=0.25"),
                               ("eval", "--checkpoint", a / "last.pt", "--out", a, "--force"))
    line = one_error_line(other)
    assert "data.voxel_size: 0.4 (checkpoint) vs 0.5 (this config)" in line
    assert "model.cr: 0.125 (checkpoint) vs 0.25 (this config)" in line
    assert "training run's directory" in one_error_line(into_run)
    assert len([p for p in a.iterdir() if p.name.startswith("eval-")]) == 1  # refused evals made no directory
    assert outside_evals(snapshot(a)) == before


def test_eval_of_the_fused_model_gives_the_same_result(run, tmp_path):
    base, _, _ = run
    plain, fused = cli_many(("eval", "--checkpoint", base / "a" / "last.pt", "--out", tmp_path / "plain"),
                            ("eval", "--checkpoint", base / "a" / "last.pt", "--out", tmp_path / "fused", "--fuse"))
    assert plain.returncode == 0 and fused.returncode == 0, (plain.stderr[-2000:], fused.stderr[-2000:])
    a = yaml.safe_load((tmp_path / "plain" / "eval.json").read_text())
    b = yaml.safe_load((tmp_path / "fused" / "eval.json").read_text())
    assert b["miou"] == pytest.approx(a["miou"], abs=1e-3)  # the same model up to float rounding


def test_finished_run_and_taken_directory_change_nothing(run):
    base, config, _ = run
    a = base / "a"
    before = snapshot(a)
    finished, fresh = cli_many(("train", "--resume", a / "last.pt"), ("train", "--config", config, "--run-dir", a))
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert f"the run of {a / 'last.pt'} is finished (step 2 of 2); nothing to do" in finished.stdout
    assert "already holds a run (last.pt at step 2)" in one_error_line(fresh)
    assert outside_evals(snapshot(a)) == outside_evals(before)


def test_resume_of_a_copied_run_stays_in_its_directory(run):
    base, _, _ = run
    a, b = base / "a", base / "b"
    shutil.copytree(a, b, ignore=shutil.ignore_patterns("eval-*"))
    before_a, before_b = outside_evals(snapshot(a)), snapshot(b)
    args = ("train", "--config", b / "config.yaml", "--resume", b / "last.pt", "train.epochs=2")
    line = one_error_line(cli(*args))
    assert "train.epochs: 1 (checkpoint) vs 2 (now)" in line and "--force" in line
    assert snapshot(b) == before_b

    proc = cli(*args, "--force")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resuming with changed settings: train.epochs: 1 (checkpoint) vs 2 (now)" in proc.stdout
    assert outside_evals(snapshot(a)) == before_a  # nothing went to the run it was copied from
    steps = rows(b / "train.csv")
    assert [int(r["step"]) for r in steps] == [1, 2, 3, 4]
    stored = yaml.safe_load((b / "config.yaml").read_text())
    assert stored["train"]["run_dir"] == str(b) and stored["train"]["epochs"] == 2
    # From step 2 on, the lr follows the 4-step schedule.
    longer = WarmupCosine(total=4, warmup=0, min_ratio=0.0, cosine=True)
    assert [float(r["lr"]) for r in steps[2:]] == pytest.approx([LR * longer(2), LR * longer(3)])
    assert torch.load(b / "last.pt", weights_only=True)["extra"]["finished"] is True


def test_rewinding_a_run_needs_a_new_directory_or_force(run):
    base, _, _ = run
    a, c = base / "a", base / "c"
    before = outside_evals(snapshot(a))
    line = one_error_line(cli("train", "--resume", a / "step_1.pt"))
    assert "is at step 2, past this checkpoint's step 1" in line and "--run-dir" in line
    proc = cli("train", "--resume", a / "step_1.pt", "--run-dir", c)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert outside_evals(snapshot(a)) == before
    original, branched = rows(a / "train.csv"), rows(c / "train.csv")
    assert [r["step"] for r in branched] == ["1", "2"]
    assert branched[0] == original[0]                      # history copied up to the checkpoint
    assert branched[1]["loss"] == original[1]["loss"]      # and the same step 2 (deterministic resume)


def test_checkpoints_that_do_not_fit_say_why_in_one_line(run, tmp_path):
    base, config, _ = run
    state = torch.load(base / "a" / "last.pt", weights_only=True)
    state.pop("config")
    state["extra"].pop("class_names")
    torch.save(state, tmp_path / "bare.pt")
    yaml_resume, weights, betas = cli_many(
        ("train", "--resume", config),
        ("eval", "--checkpoint", tmp_path / "bare.pt", "--config", config, "model.cr=0.25", "--out", tmp_path / "e"),
        ("train", "--config", config, "optim.name=sgd", "optim.betas=[0.9,0.99]", "--run-dir", tmp_path / "d"))
    assert "not a torchsparse_pp training checkpoint" in one_error_line(yaml_resume)
    assert "pass it as --config" in one_error_line(yaml_resume)
    line = one_error_line(weights)
    assert "do not fit this model" in line and "tensors of another shape" in line
    assert "optim.betas" in one_error_line(betas) and "'sgd'" in one_error_line(betas)
    assert not (tmp_path / "e").exists() and not (tmp_path / "d").exists()
