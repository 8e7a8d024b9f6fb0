"""Group discovery: which sparse convs share one kernel map.

All layers of a group read one map, so they must run one dataflow (each dataflow builds its own
view of the map). One sample goes through the model with forward hooks on every Conv3d; each
conv is assigned the cache entry of the map it used. A transposed conv finds the strided conv's
map, so it joins that group. 1x1x1 convs build no map and are not tuned.
"""
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from ..kmap import ConvGeometry
from ..kmap.cache import KernelMapKey
from ..kmap.geometry import Triple
from ..kmap.kernel_map import KernelMap
from ..nn.modules.conv import Conv3d
from ..tensor import SparseTensor

ForwardFn = Callable[[nn.Module, Any], Any]


@dataclass
class LayerInfo:
    name: str
    in_channels: int
    out_channels: int
    transposed: bool
    macs: int  # pairs * C_in * C_out of the discovery sample


@dataclass
class Group:
    """Layers that share one kernel map, and that map's size on the discovery sample."""
    name: str
    mode: str                  # submanifold | spconv | minkowski | generative
    geometry: ConvGeometry
    tensor_stride: Triple      # stride of the map's input side
    pairs: int
    num_in: int
    num_out: int
    build_seconds: float
    layers: List[LayerInfo] = field(default_factory=list)

    @property
    def layer_names(self) -> List[str]:
        return [layer.name for layer in self.layers]

    @property
    def macs(self) -> int:
        return sum(layer.macs for layer in self.layers)

    def describe(self) -> str:
        k = "x".join(map(str, self.geometry.kernel_size))
        text = f"{self.mode} k{k}"
        if not self.geometry.is_unit_stride:
            text += " s" + "x".join(map(str, self.geometry.stride))
        if self.geometry.dilation != (1, 1, 1):
            text += " d" + "x".join(map(str, self.geometry.dilation))
        return text + " @ stride " + "x".join(map(str, self.tensor_stride))

    def key(self) -> Dict[str, object]:
        """What identifies the group in a tuned file (with its position in discovery order)."""
        g = self.geometry
        return {"mode": self.mode, "kernel_size": list(g.kernel_size), "stride": list(g.stride),
                "dilation": list(g.dilation), "padding": list(g.padding), "tensor_stride": list(self.tensor_stride)}


def _used_map(conv: Conv3d, inp: SparseTensor, out: SparseTensor) -> Tuple[KernelMapKey, KernelMap]:
    """The cache entry this conv read: maps run input -> output, transposed ones output -> input."""
    src, dst = (out.C, inp.C) if conv.transposed else (inp.C, out.C)
    for key, kmap in inp.cache.maps():
        if kmap.in_coords is src and kmap.out_coords is dst and kmap.geometry == conv.geometry:
            return key, kmap
    raise RuntimeError(f"conv {conv!r}: found no kernel map in its input's cache (was the cache cleared "
                       "during the forward pass?)")


def conv_layers(model: nn.Module) -> Dict[str, Conv3d]:
    """The model's sparse convs that build maps (1x1x1 stride-1 convs do not), by module name."""
    return {name: m for name, m in model.named_modules()
            if isinstance(m, Conv3d) and not m.geometry.is_pointwise}


def discover_groups(model: nn.Module, sample: Any, forward: Optional[ForwardFn] = None) -> List[Group]:
    """Runs ``forward(model, sample)`` (default ``model(sample)``) once under no_grad in eval mode
    and returns the groups in order of first use. The sample's SparseTensors should be fresh
    (no maps built yet), so the reported build times are real."""
    forward = forward or (lambda m, s: m(s))
    layers = conv_layers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__} has no sparse conv with a kernel map: nothing to tune")
    groups: Dict[KernelMapKey, Group] = {}
    layer_group: Dict[str, Group] = {}

    def hook(name: str):
        def record(conv: Conv3d, inputs, output):
            inp = inputs[0]
            key, kmap = _used_map(conv, inp, output)
            group = groups.get(key)
            if group is None:
                side = output if conv.transposed else inp
                pairs = int((kmap.out_in >= 0).sum())
                group = Group(f"g{len(groups)}", kmap.mode, kmap.geometry, side.s, pairs, kmap.num_in,
                              kmap.num_out, kmap.build_seconds)
                groups[key] = group
            previous = layer_group.get(name)
            if previous is not None and previous is not group:
                raise ValueError(f"layer {name!r} ran twice on different kernel maps ({previous.name} and "
                                 f"{group.name}); per-layer configs cannot tune it")
            if previous is None:
                layer_group[name] = group
                group.layers.append(LayerInfo(name, conv.in_channels, conv.out_channels, conv.transposed,
                                              group.pairs * conv.in_channels * conv.out_channels))
        return record

    handles = [m.register_forward_hook(hook(name)) for name, m in layers.items()]
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            forward(model, sample)
    finally:
        model.train(was_training)
        for handle in handles:
            handle.remove()
    unused = [name for name in layers if name not in layer_group]
    if unused:
        warnings.warn(f"the sample did not reach these sparse convs; they are not tuned: {unused}")
    return list(groups.values())
