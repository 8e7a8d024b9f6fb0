"""DistributedDataParallel in the trainer: 2 CPU processes (gloo over the loopback interface)
started by torchrun through the real ``train`` command, on tiny generated data. Checks that both
ranks end with the same weights bit for bit, that the 2-process run with batch B per process
equals a 1-process run with batch 2B on the same data (BatchNorm included: SyncBatchNorm, and
each step's loss is the mean over all processes' targets), that gradient accumulation
(``no_sync``) gives that same run again, and that a 2-process checkpoint resumes in 1 process
onto the same weights. Checkpoints hold the plain module's state dict. And the teardown order."""
import gc
import os
import socket
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch
import yaml

from torchsparse_pp.data.synth import write_synthetic
from torchsparse_pp.train.distributed import cleanup, wrap_ddp

REPO = Path(__file__).resolve().parent.parent
TIMEOUT = 150  # seconds per command; the whole test takes well under a minute on 2 cores

# The real CLI (torchsparse_pp.cli.main), with Trainer.fit wrapped to write what each process
# ends with: the only way to see rank 1's weights, which the run itself never writes.
WRAPPER = """
import os, sys, torch
import torchsparse_pp.train.loop as loop
from torchsparse_pp.cli import main
from torchsparse_pp.nn import SyncBatchNorm

fit = loop.Trainer.fit

def fit_and_dump(self, *args, **kwargs):
    initial = {k: v.clone() for k, v in self.model.state_dict().items()}
    result = fit(self, *args, **kwargs)
    torch.save({"initial": initial, "state": self.model.state_dict(), "losses": self.losses,
                "params": [n for n, _ in self.model.named_parameters()], "world": self.dist.world_size,
                "ddp": self.ddp is not None, "steps": self.step,
                "sync": sum(isinstance(m, SyncBatchNorm) for m in self.model.modules())},
               os.path.join(os.environ["DUMP_DIR"], f"rank{self.dist.rank}.pt"))
    return result

loop.Trainer.fit = fit_and_dump
sys.exit(main(sys.argv[1:]))
"""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_for(dump: Path) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", DUMP_DIR=str(dump), MASTER_ADDR="127.0.0.1",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TORCHSPARSE_PP_DEBUG", None)
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT"):
        env.pop(key, None)
    if sys.platform.startswith("linux"):
        env["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only
    dump.mkdir(parents=True, exist_ok=True)
    return env


def launch(tmp: Path, name: str, args, processes: int) -> subprocess.Popen:
    """``train ARGS`` through the wrapper: torchrun with ``processes`` > 1, else one process."""
    if processes > 1:
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node",
                   str(processes), "--master_addr", "127.0.0.1", "--master_port", str(free_port())]
    else:
        command = [sys.executable]
    command += [str(tmp / "wrapper.py"), "train", *map(str, args)]
    return subprocess.Popen(command, cwd=tmp, env=env_for(tmp / f"dump_{name}"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> str:
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"timed out after {TIMEOUT} s: {err[-3000:]}")
    assert proc.returncode == 0, err[-4000:]
    return out + err


def dumps(tmp: Path, name: str, processes: int):
    return [torch.load(tmp / f"dump_{name}" / f"rank{r}.pt", weights_only=True) for r in range(processes)]


def params(state, names):
    return {k: v for k, v in state.items() if k in names}


def max_difference(a, b) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].is_floating_point())


def checkpoint(tmp: Path, run: str, step: int):
    return torch.load(tmp / run / f"step_{step}.pt", weights_only=True)["model"]


def assert_same_step(tmp: Path, run: str, oracle: str, step: int, names=None, rtol: float = 2e-5) -> None:
    """The weights after ``step`` (from the same weights at ``step`` - 1, or at the start) equal
    the oracle run's within fp32 rounding: differences far below how far the step moved them.
    (Over several steps this model amplifies rounding: two 1-process runs whose convs differ
    only in summation order drift apart by ~1e-2 in 4 steps; so each step is checked.)"""
    a, b = checkpoint(tmp, run, step), checkpoint(tmp, oracle, step)
    if names is not None:
        a, b = params(a, names), params(b, names)
    before = checkpoint(tmp, oracle, step - 1) if step > 1 else dumps(tmp, oracle, 1)[0]["initial"]
    moved = max_difference(a, params(before, a.keys()))
    assert moved > 1e-3, moved
    for k in a:
        if a[k].is_floating_point():
            torch.testing.assert_close(a[k], b[k], rtol=rtol, atol=rtol * moved, msg=lambda m: f"{k}: {m}")
        else:
            assert torch.equal(a[k], b[k]), k
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Five runs, three then two at once (a checkpoint after every step):
    - two: 2 processes x batch 1, sparse SyncBatchNorm (4 steps);
    - one: 1 process x batch 2 (the oracle of ``two``);
    - nosync: 2 processes x batch 1 accumulating 2 batches per step (DDP no_sync), per-process
      BatchNorm (train.sync_batchnorm=false; 2 steps);
    - acc: 1 process x batch 1 accumulating 4 (the oracle of ``nosync``: BatchNorm over 1 scan);
    - resumed: ``two`` from its step-2 checkpoint in 1 process x batch 2."""
    tmp = tmp_path_factory.mktemp("ddp")
    data = tmp / "data"
    write_synthetic(data, format="semantickitti", scans=4, seed=11, progress=False)
    config = {"data": {"format": "semantickitti", "root": str(data), "voxel_size": 0.4, "crop": 8.0,
                       "batch_size": 1, "augment": True},
              "model": {"name": "minkunet", "cr": 0.125},
              "optim": {"name": "sgd", "lr": 0.05, "momentum": 0.9, "schedule": "cosine", "weight_decay": 1e-4},
              "train": {"epochs": 2, "threads": 1, "deterministic": True, "progress": False, "seed": 5,
                        "conv_dataflow": "fetch_on_demand", "log_every": 1, "eval_every_epoch": False,
                        "checkpoint_every": 1}}
    (tmp / "c.yaml").write_text(yaml.safe_dump(config))
    (tmp / "wrapper.py").write_text(WRAPPER)
    outputs = {}
    waves = [[("two", ["--config", "c.yaml"], 2),
              ("one", ["--config", "c.yaml", "data.batch_size=2"], 1),
              ("acc", ["--config", "c.yaml", "train.accumulate=4"], 1)],
             [("nosync", ["--config", "c.yaml", "train.accumulate=2", "train.sync_batchnorm=false"], 2),
              ("resumed", ["--resume", "two/step_2.pt", "data.batch_size=2"], 1)]]
    for wave in waves:
        procs = [(name, launch(tmp, name, [*args, "--run-dir", name], n)) for name, args, n in wave]
        outputs.update((name, finish(proc)) for name, proc in procs)
    return tmp, outputs


def test_two_ranks_end_identical(runs):
    tmp, _ = runs
    for run, steps in (("two", 4), ("nosync", 2)):
        rank0, rank1 = dumps(tmp, run, 2)
        assert rank0["world"] == rank1["world"] == 2 and rank0["ddp"]
        assert rank0["steps"] == steps and len(rank0["losses"]) == steps
        a, b = rank0["state"], rank1["state"]
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        assert rank0["losses"] == rank1["losses"]  # each step's loss is the mean over both processes
        # Rank 0 wrote the checkpoints, with the plain module's keys (no DDP "module." prefix).
        saved = torch.load(tmp / run / "last.pt", weights_only=True)["model"]
        assert not any(k.startswith("module.") for k in saved)
        assert saved.keys() == a.keys() and all(torch.equal(saved[k], a[k]) for k in a)
    assert dumps(tmp, "two", 1)[0]["sync"] > 0 and dumps(tmp, "nosync", 1)[0]["sync"] == 0


def test_two_ranks_equal_one_rank_with_twice_the_batch(runs):
    tmp, _ = runs
    (two,), (one,) = dumps(tmp, "two", 1), dumps(tmp, "one", 1)
    assert one["world"] == 1 and not one["ddp"] and one["sync"] == 0 and one["steps"] == 4
    assert all(torch.equal(two["initial"][k], one["initial"][k]) for k in one["initial"])
    # Step 1, parameters and BatchNorm statistics: the same within fp32 rounding.
    assert_same_step(tmp, "two", "one", 1)
    # Later steps start from weights that already differ by rounding, which this model
    # amplifies; the losses stay close.
    assert two["losses"] == pytest.approx(one["losses"], rel=1e-3)
    assert two["losses"][:2] == pytest.approx(one["losses"][:2], rel=1e-5)


def test_accumulation_with_no_sync_equals_one_rank_accumulating(runs):
    tmp, _ = runs
    (nosync,), (acc,) = dumps(tmp, "nosync", 1), dumps(tmp, "acc", 1)
    assert acc["steps"] == 2 and not acc["ddp"]
    # BatchNorm normalises each scan alone in both; its running statistics are updated once per
    # batch in one, averaged over the processes in the other: only the parameters compare.
    assert_same_step(tmp, "nosync", "acc", 1, names=set(acc["params"]))
    assert nosync["losses"] == pytest.approx(acc["losses"], rel=1e-4)


def test_two_rank_checkpoint_resumes_in_one_rank(runs):
    tmp, outputs = runs
    (two,), (resumed,) = dumps(tmp, "two", 1), dumps(tmp, "resumed", 1)
    assert resumed["world"] == 1 and resumed["steps"] == 4
    assert "processes: 2 (checkpoint) vs 1 (now)" in outputs["resumed"]
    # Steps 3 and 4 on the same samples as the 2-process run took them, from the same weights.
    assert resumed["losses"] == pytest.approx(two["losses"][2:], rel=1e-5)
    assert_same_step(tmp, "resumed", "two", 3)
    assert_same_step(tmp, "resumed", "two", 4)


def test_cleanup_frees_the_ddp_reducer_before_the_process_group(tmp_path):
    """torch's DistributedDataParallel is in a reference cycle (a closure over itself): dropping
    its last name frees neither it nor the process group its reducer holds, until a cyclic
    collection, which may come at interpreter exit. A gloo group finalised there has its worker
    threads release their last work's tensors without the GIL ("terminate called without an
    active exception"). cleanup() collects first, so the reducer goes, then the group."""
    import torch.distributed as dist
    was_enabled = gc.isenabled()
    gc.disable()  # no collection but cleanup's
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        model = wrap_ddp(torch.nn.Linear(4, 3), torch.device("cpu"))
        model(torch.randn(8, 4)).sum().backward()
        alive = weakref.ref(model)
        del model
        cleanup()
        assert alive() is None, "the DDP wrapper outlived cleanup()"
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        if was_enabled:
            gc.enable()
