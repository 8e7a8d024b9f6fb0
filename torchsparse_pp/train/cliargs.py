"""Command-line parsing shared by every command: one-line errors (exit 2), checked numbers, and
``section.key=value`` overrides that may stand anywhere on the line."""
import argparse
import re
import sys
from typing import List, Optional, Sequence

__all__ = ["CommandParser", "parse_with_overrides", "positive_int", "non_negative_int", "OVERRIDES_HELP"]

OVERRIDE = re.compile(r"^[A-Za-z_]\w*(\.\w+)+=")
OVERRIDES_HELP = ("Config overrides section.key=value (value parsed as YAML, e.g. train.epochs=2 optim.lr=0.01 "
                  "data.crop=null) may stand anywhere on the line, before or after the options.")


class CommandParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, ``error: ...`` with a pointer to --help."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")


def _int_at_least(low: int, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
    return value


def positive_int(text: str) -> int:
    return _int_at_least(1, text)


def non_negative_int(text: str) -> int:
    return _int_at_least(0, text)


def parse_with_overrides(parser: argparse.ArgumentParser, argv: Optional[Sequence[str]]) -> argparse.Namespace:
    """Parses ``argv``; the tokens argparse does not know that look like ``section.key=value``
    become ``args.overrides`` (in their order) for commands that take overrides (those whose
    defaults set ``overrides=[]``); any other unknown token is an error of that command."""
    args, extra = parser.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    command = getattr(args, "command_parser", parser)
    takes = getattr(args, "overrides", None) is not None
    overrides: List[str] = list(args.overrides) if takes else []
    unknown = []
    for token in extra:
        (overrides if takes and OVERRIDE.match(token) else unknown).append(token)
    if unknown:
        hint = " (overrides look like section.key=value)" if takes else ""
        command.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
    if takes:
        args.overrides = overrides
    return args
