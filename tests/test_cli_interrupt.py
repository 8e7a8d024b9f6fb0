"""Ctrl-C during training saves a checkpoint and prints the exact command that resumes it; the
run shows one progress bar for all its steps, with an ETA."""
import csv
import re
import shlex
import signal
import subprocess
import time

import torch

from test_cli_support import REPO, cli_command, cli_env, tiny_config, tiny_data

STEPS = 24  # 12 epochs of 2 one-scan batches


def steps_logged(path):
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return [int(r["step"]) for r in csv.DictReader(f)]


def test_ctrl_c_saves_and_prints_the_resume_command(tmp_path):
    run = tmp_path / "run"
    config = tiny_config(tmp_path / "c.yaml", tiny_data(tmp_path / "data"), run, epochs=STEPS // 2, progress=True)
    proc = subprocess.Popen(cli_command("train", "--config", config), cwd=REPO, env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while not steps_logged(run / "train.csv") and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 130, err[-3000:]
    printed = re.search(r"^resume with: (.+)$", err, re.M)
    assert printed, err[-3000:]
    assert printed.group(1) == f"torchsparse-pp train --resume {run / 'last.pt'}"
    assert "Traceback" not in err
    state = torch.load(run / "last.pt", weights_only=True)
    done = steps_logged(run / "train.csv")
    assert 1 <= state["step"] < STEPS and done == list(range(1, state["step"] + 1))
    assert state["extra"]["finished"] is False

    # One bar for the whole run: every update counts towards all 24 steps and shows an ETA.
    bars = [part for part in re.split(r"[\r\n]", err) if re.match(r"\s*train:", part)]
    assert bars and all(f"/{STEPS} [" in bar for bar in bars), bars[:3]
    assert any(re.search(rf"\d+/{STEPS} \[\d\d:\d\d<\d\d:\d\d", bar) for bar in bars)
    assert not re.search(r"^\s*epoch \d+:", err, re.M)  # no per-epoch bars

    # The printed command, exactly as printed, finishes the run.
    args = shlex.split(printed.group(1))
    assert args[0] == "torchsparse-pp"
    resumed = subprocess.run(cli_command(*args[1:]), cwd=REPO, env=cli_env(), capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert steps_logged(run / "train.csv") == list(range(1, STEPS + 1))
    assert torch.load(run / "last.pt", weights_only=True)["extra"]["finished"] is True
