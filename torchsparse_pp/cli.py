"""Command line: ``torchsparse-pp {demo,train,eval,tune,info,synth}``."""
import argparse
import sys
from typing import List, Optional


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

    if args.threads:
        torch.set_num_threads(args.threads)
    run_demo(data=args.data, out=args.out, device=args.device, quick=args.quick, epochs=args.epochs,
             scans=args.scans, seed=args.seed)
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


def _synth(args) -> int:
    from torchsparse_pp.data.synth import write_synthetic

    counts = write_synthetic(args.out, format=args.format, scans=args.scans, seed=args.seed)
    splits = ", ".join(f"{split} {n}" for split, n in counts.items())
    print(f"wrote a synthetic {args.format} dataset to {args.out} ({splits} scans)")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="torchsparse-pp", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="train MinkUNet on synthetic (or given) SemanticKITTI scans and show mIoU "
                                        "before and after")
    demo.add_argument("--data", default=None, help="a SemanticKITTI root (default: generate a synthetic one)")
    demo.add_argument("--out", default="runs/demo", help="run directory (data, checkpoints, logs, PNG)")
    demo.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    demo.add_argument("--epochs", type=int, default=None, help="training epochs (default: 24, 2 with --quick)")
    demo.add_argument("--scans", type=int, default=None,
                      help="train scans to generate or use (default: 16, 2 with --quick)")
    demo.add_argument("--quick", action="store_true", help="a tiny setting that runs in well under a minute")
    demo.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=_demo)
    from torchsparse_pp.train.commands import add_eval_arguments, add_train_arguments

    train = sub.add_parser("train", help="train a model from a YAML config (docs/training.md)")
    add_train_arguments(train)
    train.set_defaults(func=_train)
    evaluate = sub.add_parser("eval", help="evaluate a checkpoint on the config's val split")
    add_eval_arguments(evaluate)
    evaluate.set_defaults(func=_eval)
    from torchsparse_pp.tune.command import add_tune_arguments

    tune = sub.add_parser("tune", help="tune the dataflow of each kernel-map group of a config's model, write a "
                                        "tuned file (docs/autotune.md)")
    add_tune_arguments(tune)
    tune.set_defaults(func=_tune)
    info = sub.add_parser("info", help="print versions and available kernels")
    info.set_defaults(func=_info)
    synth = sub.add_parser("synth", help="write a synthetic LiDAR dataset in a real on-disk format")
    synth.add_argument("--out", required=True, help="new or empty directory to write into")
    synth.add_argument("--format", default="semantickitti", choices=("semantickitti", "nuscenes", "detection"))
    synth.add_argument("--scans", type=int, default=2, help="scans per split (train and val)")
    synth.add_argument("--seed", type=int, default=0, help="scan k uses seed + k")
    synth.set_defaults(func=_synth)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
