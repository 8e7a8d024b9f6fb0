"""The ``tune`` command: tune a model of a training config on a few batches of its data."""
import argparse
import contextlib
import dataclasses
import shlex
import tempfile
import warnings
from pathlib import Path
from typing import List, Optional

import torch

DTYPES = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}

__all__ = ["add_tune_arguments", "run_tune", "main"]


def add_tune_arguments(parser: argparse.ArgumentParser) -> None:
    from ..train.cliargs import OVERRIDES_HELP, non_negative_int, positive_int
    from .binding import BINDINGS, MODES
    from .space import SPACES

    parser.usage = "%(prog)s --config FILE --out PATH [--synthetic | --data DIR] [options] [section.key=value ...]"
    parser.epilog = OVERRIDES_HELP
    parser.add_argument("--config", required=True, help="training YAML config: the model and its data (configs/)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--data", default=None, help="dataset root (default: the config's data.root)")
    source.add_argument("--synthetic", action="store_true",
                        help="tune on a freshly generated synthetic dataset in the config's data.format")
    parser.add_argument("--samples", type=positive_int, default=2, help="batches timed per trial (default 2)")
    parser.add_argument("--mode", default="inference", choices=MODES)
    parser.add_argument("--binding", default=None, choices=BINDINGS,
                        help="--mode training only: which passes share a config (default workload)")
    parser.add_argument("--space", default="full", choices=SPACES,
                        help="design space: full grid or one config per dataflow (default full)")
    parser.add_argument("--device", default=None, choices=("cpu", "cuda"), help="default: the config's train.device")
    parser.add_argument("--dtype", default="float32", choices=tuple(DTYPES),
                        help="float32, or bfloat16 / float16 autocast as in train.amp (float16: CUDA only)")
    parser.add_argument("--repeats", type=positive_int, default=3,
                        help="timed passes per trial, median taken (default 3; fewer gives a warning: the "
                             "differences are then mostly noise)")
    parser.add_argument("--warmup", type=non_negative_int, default=1,
                        help="untimed passes before each slot's trials (default 1)")
    parser.add_argument("--start", default="best_uniform", choices=("best_uniform", "default"),
                        help="configs the groups hold before their turn (default: the fastest uniform config)")
    parser.add_argument("--min-gain", type=float, default=0.05,
                        help="a group leaves its current config only for a choice this much faster (default 0.05)")
    parser.add_argument("--threads", type=non_negative_int, default=0,
                        help="torch threads (0: the config's train.threads)")
    parser.add_argument("--out", required=True,
                        help="tuned YAML file to write (e.g. configs/tuned/<model>_cpu.yaml); an existing directory "
                             "gets <config>_<mode>_<device>.yaml inside. Checked before tuning starts")
    parser.add_argument("--force", action="store_true", help="replace an existing --out file")
    parser.set_defaults(overrides=[])


def _check(args) -> None:
    if args.binding and args.mode != "training":
        raise ValueError("--binding applies to --mode training only")
    if not 0.0 <= args.min_gain < 1.0:
        raise ValueError(f"--min-gain must lie in [0, 1), got {args.min_gain}")


def _out_path(args, device: str) -> Path:
    """--out, or a file named after the config inside --out when that is a directory; checked
    now, so a long search never ends on an unwritable path."""
    from ..train.files import check_new_file

    out = Path(args.out)
    if out.is_dir():
        binding = f"_{args.binding}" if args.binding else ""
        out = out / f"{Path(args.config).stem}_{args.mode}{binding}_{device}.yaml"
    return check_new_file(out, "--out", force=args.force)


def _use_command(args, path: Path) -> List[str]:
    """The train command that builds the model this file was tuned for: the same config and
    overrides (a synthetic tuning set aside)."""
    overrides = list(args.overrides)
    if args.data:
        overrides.append(f"data.root={args.data}")
    if args.device:
        overrides.append(f"train.device={args.device}")
    return ["torchsparse-pp", "train", "--config", str(args.config), "--tuned", str(path), *overrides]


def _batches(config, samples: int):
    """The first ``samples`` batches of the val split (batch size: train.batch_size for training
    mode, so the timed work is a training step's)."""
    from ..train.data import build_dataset, build_loader, class_names

    dataset = build_dataset(config, train=False)
    loader = build_loader(config, dataset, False, 1, 0)
    batches = []
    for batch in loader:
        batches.append(batch)
        if len(batches) == samples:
            break
    if len(batches) < samples:
        raise ValueError(f"the {config.data.val_split} split has only {len(batches)} batch(es); asked for "
                         f"--samples {samples}")
    return batches, class_names(config, dataset)


def run_tune(args) -> int:
    from ..nn.functional import ConvConfig, default_config
    from ..train.config import load_config
    from ..train.data import write_synthetic_data
    from ..train.matching import model_settings
    from ..train.tasks import build_task
    from .tuner import tune

    _check(args)
    overrides = list(args.overrides)
    if args.device:
        overrides.append(f"train.device={args.device}")
    # Everything but the data (set below; a placeholder root lets a config without one be read).
    probe = load_config(args.config, [*overrides, "data.root=placeholder"])
    path = _out_path(args, probe.train.device)
    with contextlib.ExitStack() as stack:
        if args.synthetic:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="tspp_tune_"))
            per_split = args.samples * max(probe.data.batch_size, probe.data.val_batch_size)
            overrides += write_synthetic_data(probe, Path(tmp), per_split)
        elif args.data:
            overrides.append(f"data.root={args.data}")
        config = load_config(args.config, overrides)
        if args.mode == "training":
            config.data = dataclasses.replace(config.data, val_batch_size=config.data.batch_size)
        threads = args.threads or config.train.threads
        if threads:
            torch.set_num_threads(threads)
        device = torch.device("cuda" if config.train.device == "cuda" else "cpu")
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda, but torch sees no CUDA device")
        if args.dtype == "float16" and device.type != "cuda":
            raise ValueError("--dtype float16 needs CUDA (the CPU kernels take float32, float64, bfloat16)")
        batches, names = _batches(config, args.samples)
        task = build_task(config, names)
        torch.manual_seed(config.train.seed)
        model = task.build_model().to(device)
        if config.train.conv_dataflow:  # "default" is what training with this config runs
            stack.enter_context(default_config(ConvConfig(config.train.conv_dataflow)))
        result = tune(model, batches, mode=args.mode, binding=args.binding, space=args.space, start=args.start,
                      forward=lambda m, b: task.forward(m, b, device),
                      loss=lambda m, b: task.loss(m, b, device)["loss"],
                      repeats=args.repeats, warmup=args.warmup, min_gain=args.min_gain, autocast_dtype=DTYPES[args.dtype])
    print(result.table())
    for text in result.noise_warnings():
        warnings.warn(text, stacklevel=1)
    use = shlex.join(_use_command(args, path))
    result.save(path, {"settings": model_settings(config), "train_command": use})
    print(f"wrote {path}; use it with:\n  {use}\n(eval takes --tuned too; in Python: "
          "torchsparse_pp.tune.apply(model, path))")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    from ..cli import run_command
    from ..train.cliargs import CommandParser, parse_with_overrides

    parser = CommandParser(prog="tune", description="tune the dataflow of each kernel-map group")
    add_tune_arguments(parser)
    return run_command(lambda: parse_with_overrides(parser, argv), run_tune)
