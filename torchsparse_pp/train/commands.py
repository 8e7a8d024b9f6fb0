"""The ``train`` and ``eval`` commands (cli.py and tools/ call these)."""
import argparse
import json
from typing import List, Optional

__all__ = ["add_train_arguments", "add_eval_arguments", "run_train", "run_eval"]


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="YAML config (see configs/ and docs/training.md)")
    parser.add_argument("--resume", default=None, help="checkpoint to continue from (last.pt or step_N.pt)")
    parser.add_argument("--tuned", default=None, help="tuned configs from `torchsparse-pp tune` (sets train.tuned)")
    parser.add_argument("overrides", nargs="*", help="section.key=value, e.g. train.epochs=2 optim.lr=0.01")


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="YAML config the model was trained with")
    parser.add_argument("--checkpoint", required=True, help="checkpoint whose model to evaluate")
    parser.add_argument("--tuned", default=None, help="tuned configs from `torchsparse-pp tune` (sets train.tuned)")
    parser.add_argument("overrides", nargs="*", help="section.key=value, e.g. data.val_split=val")


def _with_tuned(args) -> List[str]:
    """The overrides, with ``--tuned FILE`` as train.tuned (quoted so YAML keeps it a string)."""
    overrides = list(args.overrides)
    if getattr(args, "tuned", None):
        overrides.append("train.tuned=" + json.dumps(str(args.tuned)))
    return overrides


def run_train(args) -> int:
    from .config import load_config
    from .distributed import cleanup
    from .loop import Trainer

    config = load_config(args.config, _with_tuned(args))
    try:
        trainer = Trainer(config, resume=args.resume)
        trainer.fit()
        if trainer.dist.is_main:
            print(f"run directory: {trainer.run_dir} (last.pt, train.csv, eval.csv, eval.json)")
    finally:
        cleanup()
    return 0


def run_eval(args) -> int:
    from .checkpoint import load_checkpoint
    from .config import load_config
    from .distributed import cleanup
    from .loop import Trainer, format_results

    config = load_config(args.config, _with_tuned(args))
    try:
        trainer = Trainer(config)
        state = load_checkpoint(args.checkpoint, map_location=trainer.device)
        trainer.model.load_state_dict(state["model"])
        result = trainer.evaluate()
        if trainer.dist.is_main:
            print(f"checkpoint {args.checkpoint} (step {state['step']}):")
            print(format_results(result, trainer.task.class_names))
    finally:
        cleanup()
    return 0


def main_train(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="train a torchsparse_pp model from a YAML config")
    add_train_arguments(parser)
    return run_train(parser.parse_args(argv))


def main_eval(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="evaluate a torchsparse_pp checkpoint on the val split")
    add_eval_arguments(parser)
    return run_eval(parser.parse_args(argv))
