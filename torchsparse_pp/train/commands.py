"""The ``train`` and ``eval`` commands (cli.py and tools/ call these)."""
import argparse
import datetime
import json
import shlex
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

from .cliargs import OVERRIDES_HELP, CommandParser, parse_with_overrides

__all__ = ["add_train_arguments", "add_eval_arguments", "run_train", "run_eval", "main_train", "main_eval"]


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage = "%(prog)s [--config FILE] [--resume CKPT] [options] [section.key=value ...]"
    parser.epilog = OVERRIDES_HELP
    parser.add_argument("--config", default=None,
                        help="YAML config (see configs/ and docs/training.md); with --resume, default: the "
                             "config stored in the checkpoint")
    parser.add_argument("--resume", default=None,
                        help="checkpoint to continue from (last.pt or step_N.pt); the run continues in the "
                             "checkpoint's directory")
    parser.add_argument("--run-dir", default=None,
                        help="run directory (sets train.run_dir; with --resume: continue in this directory instead)")
    parser.add_argument("--tuned", default=None, help="tuned configs from `torchsparse-pp tune` (sets train.tuned)")
    parser.add_argument("--force", action="store_true",
                        help="start over in a run directory that holds a run (its run files are replaced), or "
                             "resume with settings that change the schedule")
    parser.set_defaults(overrides=[])


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage = "%(prog)s --checkpoint CKPT [--config FILE] [options] [section.key=value ...]"
    parser.epilog = OVERRIDES_HELP
    parser.add_argument("--checkpoint", required=True, help="checkpoint whose model to evaluate")
    parser.add_argument("--config", default=None,
                        help="YAML config (default: the config stored in the checkpoint); settings that define "
                             "the model or the data's meaning must equal the checkpoint's")
    parser.add_argument("--tuned", default=None, help="tuned configs from `torchsparse-pp tune` (sets train.tuned)")
    parser.add_argument("--out", default=None,
                        help="directory for config.yaml and eval.json (default: a new eval-<time>/ beside the "
                             "checkpoint); the training run's files are never written")
    parser.add_argument("--force", action="store_true", help="replace the results in an --out that holds some")
    parser.add_argument("--fuse", action="store_true",
                        help="evaluate the fused inference model (torchsparse_pp.nn.fuse: BatchNorm folded into the "
                             "convs, ReLU and residual sums in their kernels); same results up to float rounding")
    parser.set_defaults(overrides=[])


def _overrides(args) -> List[str]:
    """The overrides, with ``--tuned FILE`` as train.tuned (quoted so YAML keeps it a string)."""
    overrides = list(args.overrides)
    if getattr(args, "tuned", None):
        overrides.append("train.tuned=" + json.dumps(str(args.tuned)))
    return overrides


def _base_values(config_path: Optional[str], state: Dict[str, Any], checkpoint: str) -> Dict[str, Any]:
    from .config import _read_yaml

    if config_path is not None:
        return _read_yaml(config_path)
    if not state.get("config"):
        raise ValueError(f"{checkpoint!r} stores no config; pass --config FILE")
    return state["config"]


def _resume_config(args):
    """The config of a resumed run: --config (or the checkpoint's) with the overrides; the run
    directory is the checkpoint's unless --run-dir or train.run_dir says otherwise."""
    import yaml

    from .checkpoint import load_checkpoint
    from .config import apply_overrides, config_from_dict

    state = load_checkpoint(args.resume, mmap=True)
    values = apply_overrides(_base_values(args.config, state, args.resume), _overrides(args))
    explicit = args.run_dir or next((yaml.safe_load(o.split("=", 1)[1]) for o in reversed(args.overrides)
                                     if o.startswith("train.run_dir=")), None)
    train = values.setdefault("train", {})
    home = Path(args.resume).parent
    stored = train.get("run_dir")
    if explicit:
        train["run_dir"] = str(explicit)
    elif not (stored and Path(stored).resolve() == home.resolve()):  # a moved or copied run
        train["run_dir"] = str(home)
    return config_from_dict(values)


def resume_command(checkpoint) -> str:
    return shlex.join(["torchsparse-pp", "train", "--resume", str(checkpoint)])


def run_train(args) -> int:
    from .changes import describe
    from .config import load_config
    from .distributed import cleanup
    from .interrupt import TrainingInterrupted
    from .loop import Trainer

    if args.config is None and args.resume is None:
        raise ValueError("train needs --config FILE (or --resume CKPT to continue a run)")
    if args.resume is not None:
        config = _resume_config(args)
    else:
        overrides = _overrides(args) + ([f"train.run_dir={json.dumps(args.run_dir)}"] if args.run_dir else [])
        config = load_config(args.config, overrides)
    trainer = None
    try:
        trainer = Trainer(config, resume=args.resume, force=args.force)
        main = trainer.dist.is_main
        if main and trainer.changes:
            print(f"resuming with changed settings: {describe(trainer.changes, 'checkpoint', 'now')}")
        if trainer.done:
            if main:
                print(f"the run of {args.resume} is finished (step {trainer.step} of {trainer.total_steps}); "
                      f"nothing to do. To train longer: {resume_command(args.resume)} train.epochs=N --force")
            return 0
        try:
            trainer.fit()
        except TrainingInterrupted as stop:
            if main:
                print(f"interrupted at step {stop.step} of {stop.total_steps}; saved {stop.checkpoint}\n"
                      f"resume with: {resume_command(stop.checkpoint)}", file=sys.stderr)
            return 130
        if main:
            print(f"run directory: {trainer.run_dir} (last.pt, train.csv, eval.csv, eval.json)")
    finally:
        del trainer  # before the process group (see cleanup)
        cleanup()
    return 0


def _eval_dir(args, checkpoint: Path) -> Path:
    """--out, or a new eval-<time> directory beside the checkpoint; checked before evaluating."""
    from .files import check_writable_dir

    if args.out is not None:
        out = check_writable_dir(args.out, "--out")
        if (out / "last.pt").exists() or (out / "train.csv").exists():
            raise FileExistsError(f"--out {str(out)!r} is a training run's directory; eval writes into its own "
                                  "(leave --out out for a new eval-<time>/ beside the checkpoint)")
        taken = [n for n in ("eval.json", "config.yaml") if (out / n).exists()]
        if taken and not args.force:
            raise FileExistsError(f"--out {str(out)!r} already holds {' and '.join(taken)}; choose another "
                                  "directory or pass --force to replace them")
        return out
    check_writable_dir(checkpoint.parent, "the checkpoint's directory (pass --out DIR to write elsewhere)")
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out, n = checkpoint.parent / f"eval-{stamp}", 1
    while out.exists():
        n += 1
        out = checkpoint.parent / f"eval-{stamp}-{n}"
    return out


def run_eval(args) -> int:
    from .checkpoint import load_checkpoint
    from .config import apply_overrides, config_from_dict, config_to_dict, dump_config
    from .distributed import cleanup
    from .files import atomic_write_text
    from .loop import Trainer, format_results, result_summary
    from .matching import check_same_model, load_model_state

    checkpoint = Path(args.checkpoint)
    state = load_checkpoint(checkpoint)
    values = apply_overrides(_base_values(args.config, state, args.checkpoint), _overrides(args))
    out = _eval_dir(args, checkpoint)
    values.setdefault("train", {})["run_dir"] = str(out)
    config = config_from_dict(values)
    stored = state.get("config") or {}
    check_same_model(checkpoint, stored, config_to_dict(config), None, ())
    trainer = None
    try:
        trainer = Trainer(config)
        check_same_model(checkpoint, stored, config_to_dict(config), state["extra"].get("class_names"),
                         trainer.task.class_names)
        load_model_state(trainer.model, state["model"], checkpoint)
        if args.fuse:
            from ..nn import fuse
            trainer.model = fuse(trainer.model)
        result = trainer.evaluate()
        if trainer.dist.is_main:
            out.mkdir(parents=True, exist_ok=True)
            dump_config(config, out / "config.yaml")
            summary = dict(checkpoint=str(checkpoint), step=state["step"], **result_summary(result))
            atomic_write_text(out / "eval.json", json.dumps(summary, indent=1))
            print(f"checkpoint {checkpoint} (step {state['step']}):")
            print(format_results(result, trainer.task.class_names))
            print(f"wrote {out / 'eval.json'} and {out / 'config.yaml'}")
    finally:
        del trainer  # before the process group (see cleanup)
        cleanup()
    return 0


def _main(description: str, add, run, argv) -> int:
    from ..cli import run_command

    parser = CommandParser(description=description)
    add(parser)
    return run_command(lambda: parse_with_overrides(parser, argv), run)


def main_train(argv: Optional[List[str]] = None) -> int:
    return _main("train a torchsparse_pp model from a YAML config", add_train_arguments, run_train, argv)


def main_eval(argv: Optional[List[str]] = None) -> int:
    return _main("evaluate a torchsparse_pp checkpoint on the val split", add_eval_arguments, run_eval, argv)
