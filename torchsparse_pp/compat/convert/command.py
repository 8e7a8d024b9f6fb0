"""``torchsparse-pp convert``: a spconv / torchsparse checkpoint to our model's state dict
(``--from``), or ours to the peer's layout (``--to``), printing what happened to every tensor."""
import argparse
from typing import Dict

import torch

from ...train.files import atomic_write, check_new_file
from .convert import to_native, to_peer
from .names import table_for

PEERS = ("spconv", "torchsparse")
STATE_KEYS = ("model_state", "state_dict", "model")  # OpenPCDet, Lightning-style, SPVNAS / ours


def add_convert_arguments(parser: argparse.ArgumentParser) -> None:
    way = parser.add_mutually_exclusive_group(required=True)
    way.add_argument("--from", dest="source", choices=PEERS, help="IN is a checkpoint of this peer; write ours")
    way.add_argument("--to", dest="target", choices=PEERS, help="IN is ours; write the peer's layout")
    parser.add_argument("input", metavar="IN.pt", help="the checkpoint to convert")
    parser.add_argument("--model", required=True, metavar="CONFIG",
                        help="training config (YAML) whose model.name / model.cr / data.format define our model")
    parser.add_argument("output", metavar="OUT.pt", help="where to write the converted state dict (torch.save)")
    parser.add_argument("--axes", choices=("zyx", "xyz"), default="zyx",
                        help="spconv only: the axis order of the peer's indices and kernels (OpenPCDet: zyx)")
    parser.add_argument("--force", action="store_true", help="overwrite OUT.pt if it exists")


def _state_dict(path: str) -> Dict[str, torch.Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as err:  # noqa: BLE001 (torch.load raises many kinds; one line says which file)
        raise ValueError(f"cannot read {path!r} as a checkpoint of tensors: {str(err).splitlines()[0]}") from err
    if isinstance(state, dict) and state and all(isinstance(v, torch.Tensor) for v in state.values()):
        return state
    for key in STATE_KEYS:
        inner = state.get(key) if isinstance(state, dict) else None
        if isinstance(inner, dict) and inner and all(isinstance(v, torch.Tensor) for v in inner.values()):
            return inner
    raise ValueError(f"{path!r} holds no state dict (a dict of tensors, or one under {list(STATE_KEYS)})")


def _model(config_path: str):
    from ...train.config import load_config
    from ...train.data import class_names
    from ...train.tasks import build_task

    config = load_config(config_path, ["data.root=placeholder"])
    return config.model.name, build_task(config, class_names(config)).build_model()


def run_convert(args) -> int:
    out = check_new_file(args.output, "OUT.pt", args.force)
    name, model = _model(args.model)
    state = _state_dict(args.input)
    if args.source:
        table = table_for(args.source, name)
        converted, report = to_native(state, model, table, args.axes)
        title = f"{args.source} {name} -> torchsparse_pp {name}"
    else:
        table = table_for(args.target, name)
        converted, report = to_peer(state, model, table, args.axes)
        title = f"torchsparse_pp {name} -> {args.target} {name}"
    print(f"{title} ({args.input}):")
    print(report)
    atomic_write(out, lambda tmp: torch.save(converted, tmp))
    print(f"wrote {len(converted)} tensors to {out}")
    return 0
