"""Exact resume and safe checkpoints, through real processes.

- Training N steps equals training k steps, killing the process (SIGKILL, no chance to save),
  resuming from step k and training the remaining N - k steps, bit for bit: weights, optimizer
  and scheduler state, RNG states, the loss of every step (so the data order), with AMP.
- A process killed while it writes a checkpoint leaves the previous one intact.
- A truncated, empty or foreign checkpoint gives a CheckpointError (one `error:` line through the
  CLI) that names the file.
- The AMP grad scaler's state goes through a checkpoint unchanged.
"""
import csv
import os
import signal
import subprocess
import sys
import textwrap
import time
import zipfile

import pytest
import torch

from torchsparse_pp.train.checkpoint import CheckpointError, load_checkpoint, save_checkpoint, temp_path
from test_cli_support import REPO, cli, cli_command, cli_env, one_error_line, tiny_config, tiny_data

EPOCHS = 5        # of 2 one-scan batches: N = 10 steps
KILL_AFTER = 3    # k: resume from step_3.pt, in the middle of the second epoch


def losses(run_dir):
    with open(run_dir / "train.csv", newline="") as f:
        return {int(r["step"]): r["loss"] for r in csv.DictReader(f)}


def assert_same_state(a, b, what=""):
    """Nested dicts / lists / tensors equal bit for bit (NaN == NaN; tensors: same dtype and shape)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, what
        assert torch.equal(a, b) or (a.is_floating_point() and torch.equal(a.isnan(), b.isnan())
                                     and torch.equal(a.nan_to_num(), b.nan_to_num())), what
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{what}: keys {sorted(a)} vs {sorted(b)}"
        for key in a:
            assert_same_state(a[key], b[key], f"{what}.{key}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), what
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_state(x, y, f"{what}[{i}]")
    elif isinstance(a, float) and a != a:
        assert isinstance(b, float) and b != b, what
    else:
        assert a == b, f"{what}: {a!r} vs {b!r}"


def start(*args):
    """The CLI in its own process group (its DataLoader workers, if any, go with it on a kill)."""
    return subprocess.Popen(cli_command(*args), cwd=REPO, env=cli_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def test_kill_and_resume_equals_the_uninterrupted_run(tmp_path, amp=True):
    """With AMP (bfloat16 autocast on the CPU); float32 resumes are also checked in process by
    test_training.py."""
    data = tiny_data(tmp_path / "data")
    full, killed, resumed = tmp_path / "full", tmp_path / "killed", tmp_path / "resumed"
    settings = dict(epochs=EPOCHS, amp=amp)
    uninterrupted = start("train", "--config", tiny_config(tmp_path / "a.yaml", data, full, **settings))
    victim = start("train", "--config", tiny_config(tmp_path / "b.yaml", data, killed, checkpoint_every=1,
                                                    **settings))
    checkpoint = killed / f"step_{KILL_AFTER}.pt"
    deadline = time.monotonic() + 240
    while not checkpoint.exists() and victim.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert victim.poll() is None, "the run ended before it could be killed: " + victim.communicate()[1][-2000:]
    os.killpg(victim.pid, signal.SIGKILL)
    victim.communicate(timeout=60)
    assert victim.returncode == -signal.SIGKILL
    out, err = uninterrupted.communicate(timeout=300)
    assert uninterrupted.returncode == 0, err[-3000:]
    state = load_checkpoint(killed / "last.pt") if (killed / "last.pt").exists() else None
    assert state is None or state["step"] < 2 * EPOCHS  # it really was cut off

    done = cli("train", "--resume", checkpoint, "--run-dir", resumed, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

    a, b = torch.load(full / "last.pt", weights_only=True), torch.load(resumed / "last.pt", weights_only=True)
    assert a["step"] == b["step"] == 2 * EPOCHS and a["extra"]["finished"] and b["extra"]["finished"]
    for key in ("model", "optimizer", "scheduler", "scaler", "rng", "epoch", "step", "batch_in_epoch", "extra"):
        assert_same_state(a[key], b[key], key)
    # The same loss at every step: the same batches in the same order, before and after the kill.
    ref = losses(full)
    assert sorted(ref) == list(range(1, 2 * EPOCHS + 1))
    assert losses(resumed) == ref
    assert {s: v for s, v in losses(killed).items() if s <= KILL_AFTER} == {s: ref[s] for s in range(1, KILL_AFTER + 1)}


# --------------------------------------------------------------------------------------------
# A kill during a save
# --------------------------------------------------------------------------------------------
SAVER = textwrap.dedent("""
    import sys, torch
    from torchsparse_pp.train.checkpoint import save_checkpoint
    model = torch.nn.Linear(2048, 4096)            # 32 MiB of weights: a save takes a while
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    step = 0
    while True:
        step += 1
        with torch.no_grad():
            model.weight.fill_(step)
        save_checkpoint(sys.argv[1], model=model, optimizer=optimizer, scheduler=scheduler, scaler=None,
                        epoch=0, step=step, batch_in_epoch=step, world_size=1, config={}, extra={})
        print(step, flush=True)
""")


def test_a_kill_during_a_save_leaves_the_previous_checkpoint(tmp_path):
    path = tmp_path / "last.pt"
    tmp = temp_path(path)
    for attempt in range(2):
        saver = subprocess.Popen([sys.executable, "-c", SAVER, str(path)], cwd=REPO, env=cli_env(),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        # Wait for a whole checkpoint, then for the next save to be under way.
        while not path.exists() and saver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.001)
        while not tmp.exists() and saver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.0005)
        assert saver.poll() is None, saver.communicate()[1][-2000:]
        written = tmp.stat().st_size if tmp.exists() else None
        saver.send_signal(signal.SIGKILL)
        out, _ = saver.communicate(timeout=60)
        assert saver.returncode == -signal.SIGKILL
        state = load_checkpoint(path)  # whole, and consistent with itself
        step = state["step"]
        assert step >= 1 and state["batch_in_epoch"] == step
        assert bool((state["model"]["weight"] == step).all())
        assert step >= max(int(line) for line in out.split()) if out.strip() else True
        note = f"killed with {written} bytes of the next save written"
        if tmp.exists():  # the interrupted temp file is never mistaken for the checkpoint
            assert tmp.stat().st_size < path.stat().st_size or not zipfile.is_zipfile(tmp), note
    # The next save of the same path replaces a stale temp file and succeeds.
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    save_checkpoint(path, model=model, optimizer=optimizer,
                    scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0), scaler=None, epoch=0,
                    step=99, batch_in_epoch=0, world_size=1, config={}, extra={})
    assert load_checkpoint(path)["step"] == 99 and not tmp.exists()


# --------------------------------------------------------------------------------------------
# Truncated and foreign files
# --------------------------------------------------------------------------------------------
def small_checkpoint(path, scaler=None):
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.randn(4, 5)).sum().backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5)
    return save_checkpoint(path, model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler, epoch=1,
                           step=7, batch_in_epoch=1, world_size=1, config={"model": {"name": "x"}}, extra={})


def bad_files(tmp_path):
    good = small_checkpoint(tmp_path / "good.pt")
    data = good.read_bytes()
    cases = {}
    for fraction in (0.1, 0.5, 0.9, 0.999):
        cases[f"cut at {fraction}"] = (data[:int(len(data) * fraction)], r"is truncated or damaged")
    cases["empty"] = (b"", r"is empty \(0 bytes\)")
    cases["garbage"] = (os.urandom(4096), r"is not a zip archive as torch\.save writes")
    damaged = bytearray(data)
    middle = len(damaged) // 2
    damaged[middle:middle + 64] = bytes(64)
    cases["zeroed bytes"] = (bytes(damaged), r"is damaged \(")
    foreign_zip = tmp_path / "foreign.zip"
    with zipfile.ZipFile(foreign_zip, "w") as z:
        z.writestr("readme.txt", "not a checkpoint")
    cases["foreign zip"] = (foreign_zip.read_bytes(), r"\(torch\.load: ")
    torch.save(torch.nn.Linear(2, 2).state_dict(), tmp_path / "weights.pt")
    cases["bare state dict"] = ((tmp_path / "weights.pt").read_bytes(), r"a dict without a 'format' entry")
    torch.save([1, 2, 3], tmp_path / "list.pt")
    cases["a list"] = ((tmp_path / "list.pt").read_bytes(), r"it holds a list")
    state = torch.load(good, weights_only=True)
    torch.save(dict(state, format=2), tmp_path / "newer.pt")
    cases["newer format"] = ((tmp_path / "newer.pt").read_bytes(), r"it has format 2")
    torch.save({k: v for k, v in state.items() if k != "rng"}, tmp_path / "partial.pt")
    cases["missing entries"] = ((tmp_path / "partial.pt").read_bytes(), r"it lacks \['rng'\]")
    return cases


def test_truncated_and_foreign_checkpoints_name_the_file(tmp_path):
    for name, (content, pattern) in bad_files(tmp_path).items():
        path = tmp_path / f"bad {name}.pt"
        path.write_bytes(content)
        with pytest.raises(CheckpointError, match=pattern) as raised:
            load_checkpoint(path)
        assert repr(str(path)) in str(raised.value), (name, str(raised.value))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.pt")
    with pytest.raises(FileNotFoundError, match="is not a file"):
        load_checkpoint(tmp_path)


def test_the_cli_reports_a_truncated_checkpoint_in_one_line(tmp_path):
    good = small_checkpoint(tmp_path / "ok.pt")
    cut = tmp_path / "cut.pt"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    line = one_error_line(cli("train", "--resume", cut))
    assert str(cut) in line and "truncated or damaged" in line


def test_grad_scaler_state_goes_through_a_checkpoint(tmp_path):
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=2)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(6):  # growth twice, a skipped step (Inf gradient) backs off once
        optimizer.zero_grad()
        scaler.scale(model(torch.randn(3, 4)).sum() * (float("inf") if step == 4 else 1.0)).backward()
        scaler.step(optimizer)
        scaler.update()
    before = scaler.state_dict()
    assert before["scale"] == 2.0 ** 11 and before["_growth_tracker"] == 1
    path = small_checkpoint(tmp_path / "amp.pt", scaler=scaler)
    restored = torch.amp.GradScaler("cpu")
    restored.load_state_dict(load_checkpoint(path)["scaler"])
    assert_same_state(restored.state_dict(), before, "scaler")
