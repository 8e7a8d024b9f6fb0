"""Peer checkpoints <-> torchsparse_pp state dicts, with a line per tensor saying what happened.

Every tensor of our model is either mapped from a named peer tensor (with the layout change it
needs), or listed as having no peer counterpart; every peer tensor is either used or listed as
not mapped. A missing or misshapen tensor is an error naming it.
"""
import re
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

import torch
from torch import nn

from ...nn import Conv3d
from . import layouts
from .names import Table

StateDict = Dict[str, torch.Tensor]


@dataclass
class Report:
    lines: List[str] = field(default_factory=list)

    def add(self, text: str) -> None:
        self.lines.append(text)

    def __str__(self) -> str:
        return "\n".join(self.lines)


def _shape(t: torch.Tensor) -> str:
    return "x".join(map(str, t.shape)) or "scalar"


def _convs(model: nn.Module) -> Dict[str, Conv3d]:
    return {f"{name}.kernel": m for name, m in model.named_modules() if isinstance(m, Conv3d)}


def _pointwise(conv: Conv3d) -> bool:
    return conv.geometry.volume == 1 and conv.geometry.is_unit_stride


def _to_native(table: Table, conv: Conv3d, tensor: torch.Tensor, axes: str) -> Tuple[torch.Tensor, str]:
    if table.peer == "spconv":
        how = "spconv 1x1 [C_out,1,1,1,C_in] memory read as [C_in, C_out]" if _pointwise(conv) else \
            f"spconv [C_out, k({axes}), C_in] -> [K, C_in, C_out]"
        return layouts.spconv_to_native(tensor, axes, _pointwise(conv)), how
    how = "2.1 [C_in, C_out] -> [1, C_in, C_out]" if tensor.dim() == 2 else \
        ("2.1 x-fastest rows -> z-fastest" if conv.geometry.volume % 2 else "2.1 rows (z-fastest) as they are")
    return layouts.torchsparse_to_native(tensor, conv.geometry.kernel_size), how


def _to_peer(table: Table, conv: Conv3d, tensor: torch.Tensor, axes: str) -> torch.Tensor:
    if table.peer == "spconv":
        return layouts.native_to_spconv(tensor, conv.geometry.kernel_size, axes, _pointwise(conv))
    return layouts.native_to_torchsparse(tensor, conv.geometry.kernel_size, conv.geometry.stride)


def _prefix(table: Table, model: nn.Module, peer_state: StateDict) -> str:
    names = [table.peer_key(k) for k in model.state_dict()]
    names = [n for n in names if n is not None]
    best = max(table.prefixes, key=lambda p: sum(p + n in peer_state for n in names))
    if not any(best + n in peer_state for n in names):
        raise ValueError(f"no tensor of the {table.peer} layout of {table.model} is in this checkpoint (looked for "
                         f"e.g. {names[0]!r} under the prefixes {list(table.prefixes)})")
    return best


def to_native(peer_state: StateDict, model: nn.Module, table: Table, axes: str = "zyx") -> Tuple[StateDict, Report]:
    """Our state dict for ``model`` from a peer checkpoint's tensors."""
    report, out, used = Report(), {}, set()
    prefix = _prefix(table, model, peer_state)
    convs = _convs(model)
    for key, mine in model.state_dict().items():
        name = table.peer_key(key)
        if name is None:
            if table.native_only and re.match(table.native_only, key):
                out[key] = mine
                report.add(f"  {key} [{_shape(mine)}]: no {table.peer} counterpart, kept at initialisation")
                continue
            raise ValueError(f"our tensor {key!r} has no name in the {table.peer} layout")
        peer_key = prefix + name
        if peer_key not in peer_state:
            if key.endswith("num_batches_tracked"):
                out[key] = mine
                report.add(f"  {key}: not in the checkpoint, starts at 0")
                continue
            raise ValueError(f"the checkpoint lacks {peer_key!r} (for our {key!r})")
        tensor, how = peer_state[peer_key], "as is"
        if key in convs:
            tensor, how = _to_native(table, convs[key], tensor, axes)
        if tensor.shape != mine.shape:
            raise ValueError(f"{peer_key!r} [{_shape(peer_state[peer_key])}] does not fit our {key!r} "
                             f"[{_shape(mine)}] (after: {how}); is --model the right config?")
        out[key] = tensor.to(mine.dtype).contiguous()
        used.add(peer_key)
        report.add(f"  {peer_key} [{_shape(peer_state[peer_key])}] -> {key} [{_shape(mine)}] ({how})")
    _fold_biases(peer_state, table, prefix, out, used, report)
    _list_unused(peer_state, table, used, report)
    return out, report


def _fold_biases(peer_state, table, prefix, out, used, report) -> None:
    """conv -> BatchNorm: BN(conv(x) + b) = BN'(conv(x)) with running_mean' = running_mean - b
    (exact in eval mode; in training mode the batch mean absorbs b either way)."""
    back = {prefix + (table.peer_key(k) or ""): k for k in out}
    for peer_key, tensor in peer_state.items():
        for suffix, bn in table.bias_folds.items():
            if peer_key.endswith("." + suffix) and peer_key.startswith(prefix):
                mean_key = peer_key[: -len(suffix)] + bn + ".running_mean"
                native = back.get(mean_key)
                if native is None:
                    raise ValueError(f"cannot fold {peer_key!r}: {mean_key!r} is not mapped")
                out[native] = out[native] - tensor.to(out[native].dtype)
                used.add(peer_key)
                report.add(f"  {peer_key} [{_shape(tensor)}] -> folded into {native} (running_mean - bias)")


def _list_unused(peer_state, table, used, report) -> None:
    unused = [k for k in peer_state if k not in used]
    for key in unused:
        why = table.peer_unused_why if table.peer_unused and re.search(table.peer_unused, key) else \
            "not part of this model's layout"
        report.add(f"  {key} [{_shape(peer_state[key])}]: not mapped ({why})")


def to_peer(state: StateDict, model: nn.Module, table: Table, axes: str = "zyx") -> Tuple[StateDict, Report]:
    """The peer layout's tensors for our ``model``'s state dict ``state``."""
    report, out = Report(), {}
    model.load_state_dict(state, strict=True)
    convs = _convs(model)
    prefix = table.prefixes[0]
    for key, tensor in state.items():
        name = table.peer_key(key)
        if name is None:
            report.add(f"  {key} [{_shape(tensor)}]: no {table.peer} counterpart, not written")
            continue
        value = _to_peer(table, convs[key], tensor, axes) if key in convs else tensor
        out[prefix + name] = value.contiguous()
        report.add(f"  {key} [{_shape(tensor)}] -> {prefix + name} [{_shape(value)}]")
        for suffix, bn in table.bias_folds.items():
            conv_name = suffix.split(".")[0]
            if name.endswith(f".{conv_name}.weight"):  # the peer's conv carries a bias: zero (folded)
                bias_key = prefix + name[: -len("weight")] + "bias"
                out[bias_key] = torch.zeros(value.shape[0], dtype=value.dtype)
                report.add(f"  (zeros) -> {bias_key} [{value.shape[0]}] (the BatchNorm after it holds the shift)")
    return out, report
