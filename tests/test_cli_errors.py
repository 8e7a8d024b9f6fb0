"""Bad command lines give one line, ``error: ...``, and exit status 2; --debug or
TORCHSPARSE_PP_DEBUG=1 shows the traceback; ``python -m torchsparse_pp`` and the installed script
are the same CLI. Nothing is written by a refused command."""
import shutil
import subprocess

import pytest

from test_cli_support import REPO, cli, cli_env, cli_many, one_error_line, tiny_config, tiny_data

DEMO_CONFIG = REPO / "configs" / "demo_minkunet.yaml"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    base = tmp_path_factory.mktemp("cli_errors")
    return base, tiny_config(base / "c.yaml", tiny_data(base / "data"), base / "run")


def test_bad_values_are_one_line_and_exit_2(setup):
    base, config = setup
    cases = [
        (("tune", "--config", config, "--threads", "-2", "--out", base / "t.yaml"), "argument --threads: must be >= 0"),
        (("demo", "--threads", "-1", "--out", base / "demo"), "argument --threads: must be >= 0, got -1"),
        (("synth", "--scans", "0", "--out", base / "s"), "argument --scans: must be >= 1"),
        (("train", "--config", base / "missing.yaml"), "config file"),
        (("train", "--config", config, "train.epochs=0"), "train.epochs must be >= 1"),
        (("train", "--config", config, "trian.epochs=2"), "unknown config key 'trian'"),
        (("train", "--config", config, "--epochs", "2"), "unrecognized arguments: --epochs 2"),
        (("tune", "--config", config, "--mode", "serving", "--out", base / "t.yaml"), "argument --mode"),
    ]
    for (args, message), proc in zip(cases, cli_many(*(args for args, _ in cases))):
        line = one_error_line(proc)
        assert message in line, (args, line)
        assert "Traceback" not in proc.stderr
    assert not any((base / name).exists() for name in ("t.yaml", "demo", "s", "run"))


def test_an_argument_error_names_the_command_and_its_help(setup):
    _, config = setup
    line = one_error_line(cli("train", "--config", config, "--bogus"))
    assert "(see `torchsparse-pp train --help`)" in line


def test_debug_shows_the_traceback(setup):
    base, _ = setup
    flag, env = cli("train", "--config", base / "missing.yaml", "--debug"), \
        cli("train", "--config", base / "missing.yaml", TORCHSPARSE_PP_DEBUG="1")
    for proc in (flag, env):
        assert proc.returncode != 0 and "Traceback (most recent call last)" in proc.stderr
        assert "FileNotFoundError: config file" in proc.stderr


def test_module_and_script_are_the_same_cli(setup):
    _, config = setup
    module = cli("train", "--help")
    assert module.returncode == 0 and "section.key=value" in module.stdout and "--resume" in module.stdout
    script = shutil.which("torchsparse-pp")
    if script is None:
        pytest.skip("the torchsparse-pp script is not on the PATH")
    proc = subprocess.run([script, "train", "--config", str(config), "--bogus"], capture_output=True, text=True,
                          env=cli_env(), timeout=120)
    assert "unrecognized arguments: --bogus" in one_error_line(proc)
