"""Parameter names of the peers' published model layouts against ours.

- torchsparse: SPVNAS's MinkUNet and SPVCNN (``stem``, ``stage1..4``, ``up1..4``, ``classifier.0``,
  ``point_transforms``) -> our MinkUNet / SPVCNN (``stem``, ``encoder``, ``up``, ``decoder``,
  ``classifier``, ``point_transforms``);
- spconv: OpenPCDet's VoxelResBackBone8x (``conv_input``, ``conv1..4``, ``conv_out``; in full
  detector checkpoints under ``backbone_3d.``) -> our CenterPoint's ``backbone``. Its residual
  blocks' convs have biases that the BatchNorm right after them absorbs (bias_folds).
"""
import re
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

Rule = Tuple[str, Callable[[re.Match], str]]


def _rule(pattern: str, build: Callable[[re.Match], str]) -> Rule:
    return pattern, build


SPVNAS = [
    _rule(r"stem\.(\d)\.(\d)\.", lambda m: f"stem.{3 * int(m[1]) + int(m[2])}."),
    _rule(r"encoder\.(\d)\.0\.(\d)\.", lambda m: f"stage{int(m[1]) + 1}.0.net.{m[2]}."),
    _rule(r"encoder\.(\d)\.(\d)\.body\.", lambda m: f"stage{int(m[1]) + 1}.{m[2]}.net."),
    _rule(r"encoder\.(\d)\.(\d)\.shortcut\.", lambda m: f"stage{int(m[1]) + 1}.{m[2]}.downsample."),
    _rule(r"up\.(\d)\.(\d)\.", lambda m: f"up{int(m[1]) + 1}.0.net.{m[2]}."),
    _rule(r"decoder\.(\d)\.(\d)\.body\.", lambda m: f"up{int(m[1]) + 1}.1.{m[2]}.net."),
    _rule(r"decoder\.(\d)\.(\d)\.shortcut\.", lambda m: f"up{int(m[1]) + 1}.1.{m[2]}.downsample."),
    _rule(r"classifier\.", lambda m: "classifier.0."),
    _rule(r"point_transforms\.", lambda m: "point_transforms."),
]

_BLOCK_PARTS = {"0": "conv1", "1": "bn1", "3": "conv2", "4": "bn2"}
OPENPCDET = [
    _rule(r"backbone\.conv_input\.(\d)\.", lambda m: f"conv_input.{m[1]}."),
    _rule(r"backbone\.stages\.0\.(\d)\.body\.(\d)\.", lambda m: f"conv1.{m[1]}.{_BLOCK_PARTS[m[2]]}."),
    _rule(r"backbone\.stages\.(\d)\.0\.(\d)\.", lambda m: f"conv{int(m[1]) + 1}.0.{m[2]}."),
    _rule(r"backbone\.stages\.(\d)\.(\d)\.body\.(\d)\.", lambda m: f"conv{int(m[1]) + 1}.{m[2]}.{_BLOCK_PARTS[m[3]]}."),
    _rule(r"backbone\.conv_out\.(\d)\.", lambda m: f"conv_out.{m[1]}."),
]


@dataclass(frozen=True)
class Table:
    """How one peer layout names one of our models."""
    peer: str
    model: str
    rules: List[Rule]
    prefixes: Tuple[str, ...] = ("",)         # where the peer layout may sit in a checkpoint
    native_only: Optional[str] = None         # our keys with no peer counterpart (regex)
    peer_unused: Optional[str] = None         # peer keys our model does not use (regex), with why
    peer_unused_why: str = ""
    bias_folds: Dict[str, str] = field(default_factory=dict)  # peer conv bias suffix -> its BatchNorm
    kernel_name: str = "kernel"               # the peer's name of a conv weight

    def peer_key(self, native_key: str) -> Optional[str]:
        for pattern, build in self.rules:
            m = re.match(pattern, native_key)
            if m:
                rest = native_key[m.end():]
                return build(m) + (self.kernel_name if rest == "kernel" else rest)
        return None


TABLES = {
    ("torchsparse", "minkunet"): Table(
        "torchsparse", "minkunet", SPVNAS, ("", "module."), peer_unused=r"point_transforms\.",
        peer_unused_why="SPVNAS's MinkUNet holds SPVCNN's point transforms; its forward never reads them"),
    ("torchsparse", "spvcnn"): Table("torchsparse", "spvcnn", SPVNAS, ("", "module.")),
    ("spconv", "centerpoint"): Table(
        "spconv", "centerpoint", OPENPCDET, ("backbone_3d.", "", "module.backbone_3d."),
        native_only=r"(bev_backbone|head)\.",
        bias_folds={"conv1.bias": "bn1", "conv2.bias": "bn2"}, kernel_name="weight"),
}


def table_for(peer: str, model: str) -> Table:
    try:
        return TABLES[(peer, model)]
    except KeyError:
        known = ", ".join(f"--from {p} with model.name {m}" for p, m in TABLES)
        raise ValueError(f"no parameter-name table for {peer} checkpoints of model.name={model!r}; known: {known}") from None
