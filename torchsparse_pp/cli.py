"""The torchsparse-pp command line: demo, train, eval, tune, convert, info, synth (also python -m torchsparse_pp).

Errors are one line on stderr: ``error: ...``, exit status 2 for bad arguments, configs, paths
and data, 1 for anything unexpected. ``--debug`` (or TORCHSPARSE_PP_DEBUG=1) shows the traceback."""
import argparse
import contextlib
import os
import sys
import warnings
from typing import Callable, List, Optional

from .train.cliargs import CommandParser, non_negative_int, parse_with_overrides, positive_int

DEBUG_ENV = "TORCHSPARSE_PP_DEBUG"
# What a user can fix: arguments, configs, paths, data, missing packages.
USER_ERRORS = (ValueError, OSError, ImportError)


def _info(_args) -> int:
    import torch

    import torchsparse_pp
    from torchsparse_pp.nn.functional.config import IMPLEMENTED

    print(f"torchsparse_pp {torchsparse_pp.__version__}")
    print(f"torch {torch.__version__} (CUDA build: {torch.version.cuda or 'no'})")
    print(f"threads: {torch.get_num_threads()}")
    for device, dataflows in IMPLEMENTED.items():
        print(f"dataflows on {device}: {', '.join(dataflows)}")
    return 0


def _demo(args) -> int:
    import torch

    from torchsparse_pp.demo import run_demo
    from torchsparse_pp.train.commands import resume_command
    from torchsparse_pp.train.interrupt import TrainingInterrupted

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        run_demo(data=args.data, out=args.out, device=args.device, quick=args.quick, epochs=args.epochs,
                 scans=args.scans, seed=args.seed)
    except TrainingInterrupted as stop:
        print(f"interrupted at step {stop.step} of {stop.total_steps}; saved {stop.checkpoint}\n"
              f"continue its training with: {resume_command(stop.checkpoint)} (a new demo starts over)",
              file=sys.stderr)
        return 130
    return 0


def _train(args) -> int:
    from torchsparse_pp.train.commands import run_train

    return run_train(args)


def _eval(args) -> int:
    from torchsparse_pp.train.commands import run_eval

    return run_eval(args)


def _tune(args) -> int:
    from torchsparse_pp.tune.command import run_tune

    return run_tune(args)


def _convert(args) -> int:
    from torchsparse_pp.compat.convert.command import run_convert

    return run_convert(args)


def _synth(args) -> int:
    from torchsparse_pp.data.synth import write_synthetic

    extra = {} if args.sweeps is None else {"sweeps": args.sweeps}
    counts = write_synthetic(args.out, format=args.format, scans=args.scans, seed=args.seed, **extra)
    splits = ", ".join(f"{split} {n}" for split, n in counts.items())
    print(f"wrote a synthetic {args.format} dataset to {args.out} ({splits} scans)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help=f"show the traceback of an error (or set {DEBUG_ENV}=1)")
    parser = CommandParser(prog="torchsparse-pp", description=__doc__.splitlines()[0], parents=[common])
    sub = parser.add_subparsers(dest="command", required=True, metavar="{demo,train,eval,tune,convert,info,synth}")

    def command(name: str, func: Callable, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help, parents=[common])
        p.set_defaults(func=func, command_parser=p)
        return p

    demo = command("demo", _demo, "train MinkUNet on synthetic (or given) SemanticKITTI scans and show mIoU before "
                                  "and after")
    demo.add_argument("--data", default=None, help="a SemanticKITTI root (default: generate a synthetic one)")
    demo.add_argument("--out", default="runs/demo",
                      help="directory for the data, the run and the PNG (default runs/demo; a new demo starts over)")
    demo.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    demo.add_argument("--epochs", type=positive_int, default=None, help="training epochs (default: 24, 2 with --quick)")
    demo.add_argument("--scans", type=positive_int, default=None,
                      help="train scans to generate or use (default: 16, 2 with --quick)")
    demo.add_argument("--quick", action="store_true", help="a tiny setting that runs in well under a minute")
    demo.add_argument("--threads", type=non_negative_int, default=0, help="torch threads (0: torch's default)")
    demo.add_argument("--seed", type=non_negative_int, default=0)
    from torchsparse_pp.train.commands import add_eval_arguments, add_train_arguments

    add_train_arguments(command("train", _train, "train a model from a YAML config (docs/training.md)"))
    add_eval_arguments(command("eval", _eval, "evaluate a checkpoint on the val split"))
    from torchsparse_pp.tune.command import add_tune_arguments

    add_tune_arguments(command("tune", _tune, "tune the dataflow of each kernel-map group of a config's model, "
                                              "write a tuned file (docs/autotune.md)"))
    from torchsparse_pp.compat.convert.command import add_convert_arguments

    add_convert_arguments(command("convert", _convert, "convert a spconv / torchsparse checkpoint to a "
                                                       "torchsparse_pp model's state dict, or back (docs/migrating.md)"))
    command("info", _info, "print versions and available kernels")
    synth = command("synth", _synth, "write a synthetic LiDAR dataset in a real on-disk format")
    synth.add_argument("--out", required=True, help="new or empty directory to write into")
    synth.add_argument("--format", default="semantickitti", choices=("semantickitti", "nuscenes", "detection", "waymo"))
    synth.add_argument("--scans", type=positive_int, default=2, help="scans (key frames) per split (train and val)")
    synth.add_argument("--seed", type=non_negative_int, default=0,
                       help="scan k uses seed + k (nuscenes, waymo: split s's sequence uses seed + s)")
    synth.add_argument("--sweeps", type=positive_int, default=None,
                       help="nuscenes: sweeps per key-frame interval (default 10, 20 Hz sweeps and 2 Hz key frames)")
    return parser


@contextlib.contextmanager
def _one_line_warnings():
    """Warnings as ``warning: ...`` lines, without the source line Python shows."""
    def show(message, category, filename, lineno, file=None, line=None):
        print(f"warning: {message}", file=file or sys.stderr, flush=True)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield


def run_command(parse: Callable[[], argparse.Namespace], run: Callable[[argparse.Namespace], int]) -> int:
    """Parses and runs a command; errors become one line and an exit status (see the module doc)."""
    try:
        args = parse()
    except SystemExit as done:  # --help, or a usage error already printed
        return done.code if isinstance(done.code, int) else 2
    debug = getattr(args, "debug", False) or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    with _one_line_warnings():
        try:
            return run(args)
        except KeyboardInterrupt:
            if debug:
                raise
            print("interrupted", file=sys.stderr)
            return 130
        except Exception as err:  # noqa: BLE001 (every error ends as one line unless --debug)
            if debug:
                raise
            if isinstance(err, USER_ERRORS):
                print(f"error: {err}", file=sys.stderr)
                return 2
            print(f"error: {type(err).__name__}: {err} (unexpected; run again with --debug for the traceback)",
                  file=sys.stderr)
            return 1


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    return run_command(lambda: parse_with_overrides(parser, argv), lambda args: args.func(args))


if __name__ == "__main__":
    sys.exit(main())
