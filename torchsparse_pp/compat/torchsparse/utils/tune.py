"""``torchsparse.tune``: 2.1's per-group config tuner, by measured latency on torchsparse_pp.

Groups are 2.1's: convs with one (tensor stride, kernel size, stride, dilation) share a kernel
map. For each group in turn, every candidate config of ``dataflow_range`` is timed on the first
``n_samples`` inputs (forward, plus backward with ``tune_with_bwd``; fresh caches per pass) and
the fastest is kept. Results are saved to ``save_dir/tune_tag`` (torch.save of
``(name_to_group, group_configs)``, as 2.1) and reloaded unless ``force_retune``; each conv's
``_config`` is set to its group's config.
"""
import os
import time
from collections import defaultdict
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import torch
from torch import nn

from .. import backends
from ..nn.functional.conv_config import Dataflow, get_default_conv_config, get_global_conv_config
from ..nn.modules.conv import Conv3d
from ..tensor import SparseTensor
from .tensor_cache import TensorCache



def recursive_apply(x, func):
    if isinstance(x, dict):
        return {k: recursive_apply(v, func) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(recursive_apply(v, func) for v in x)
    if isinstance(x, SparseTensor):
        result = func(x)
        return result if isinstance(result, SparseTensor) else x
    return x


def _fresh(x: SparseTensor) -> SparseTensor:
    out = SparseTensor(x.feats, x.coords, x.stride, x.spatial_range)
    out._caches = TensorCache()
    return out


def candidates(dataflow: Dataflow, tune_with_bwd: bool) -> List[Dict[str, Any]]:
    """The configs tried for one dataflow (2.1's knobs of it)."""
    if dataflow == Dataflow.ImplicitGEMM:
        forward = [(False, 1)] + [(True, n) for n in range(1, 5)]
        backward = range(1, 5) if tune_with_bwd else (3,)
        return [{"dataflow": dataflow, "ifsort": s, "split_mask_num": n, "split_mask_num_bwd": b}
                for s, n in forward for b in backward]
    if dataflow == Dataflow.GatherScatter:
        return [{"dataflow": dataflow, "epsilon": e, "mm_thresh": t} for e, t in ((0.0, 0), (0.3, 10000), (0.5, 20000))]
    if dataflow == Dataflow.FetchOnDemand:
        return [{"dataflow": dataflow, "FOD_fusion": True}]
    raise NotImplementedError(f"dataflow {dataflow!r} cannot be tuned here")


def _groups(model: nn.Module, sample) -> Tuple[Dict[str, Tuple], Dict[Tuple, List[str]]]:
    name_to_group: Dict[str, Tuple] = {}
    group_to_name: Dict[Tuple, List[str]] = defaultdict(list)

    def hook(name):
        def record(module, inputs, output):
            stride = inputs[0].stride
            if module.transposed:
                stride = tuple(t // s for t, s in zip(stride, module.stride))
            group = (stride, module.kernel_size, module.stride, module.dilation)
            if name not in name_to_group:
                name_to_group[name] = group
                group_to_name[group].append(name)
        return record

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules()
               if isinstance(m, Conv3d) and m.kernel.dim() == 3]
    try:
        with torch.no_grad():
            model(recursive_apply(sample, _fresh))
    finally:
        for h in handles:
            h.remove()
    return name_to_group, group_to_name


def _timer(model: nn.Module, samples: List[Any], tune_with_bwd: bool, autocast: bool) -> Callable[[], float]:
    device = next(model.parameters()).device

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def run() -> float:
        total = 0.0
        for sample in samples:
            inputs = recursive_apply(sample, _fresh)
            sync()
            start = time.perf_counter()
            with torch.autocast(device.type, torch.float16, enabled=autocast), torch.set_grad_enabled(tune_with_bwd):
                out = model(inputs)
                if tune_with_bwd:
                    feats = out.feats if isinstance(out, SparseTensor) else out
                    feats.float().square().mean().backward()
            sync()
            total += time.perf_counter() - start
        return total
    return run


def _config_for(module: Conv3d, values: Dict[str, Any]):
    base = module._config if module._config is not None else (get_global_conv_config() or get_default_conv_config())
    config = base.copy()
    config.update(values)
    return config


def tune(model: nn.Module, data_loader: Iterable, n_samples: int = 100, collect_fn: Callable = lambda data: data,
         enable_fp16: bool = False, save_dir: str = ".torchsparse-tune", tune_tag: str = "temp",
         force_retune: bool = False, dataflow_range: Optional[List[Dataflow]] = None, dataflow_prune: bool = False,
         tune_with_bwd: bool = False, verbose: bool = True, skip_warning: bool = False) -> None:
    dataflow_range = [Dataflow.ImplicitGEMM] if dataflow_range is None else list(dataflow_range)
    device = next(model.parameters()).device
    backends.benchmark = True
    samples = []
    for batch in data_loader:
        samples.append(collect_fn(batch))
        if len(samples) == n_samples:
            break
    if not samples:
        raise ValueError("tune needs at least one sample from data_loader")
    if enable_fp16:
        model.half()
        samples = [recursive_apply(s, lambda x: x.half()) for s in samples]
    path = os.path.join(save_dir, tune_tag)
    if os.path.exists(path) and not force_retune:
        name_to_group, group_configs = torch.load(path, weights_only=False)
    else:
        name_to_group, group_to_name = _groups(model, samples[0])
        modules = dict(model.named_modules())
        measure = _timer(model, samples, tune_with_bwd, enable_fp16)
        group_configs = {}
        for group, names in group_to_name.items():
            choices = [c for d in dataflow_range for c in candidates(d, tune_with_bwd)]
            if dataflow_prune:
                first = {d: candidates(d, tune_with_bwd)[0] for d in dataflow_range}
                best = min(first, key=lambda d: _time_with(modules, names, first[d], measure))
                choices = candidates(best, tune_with_bwd)
            timed = [(_time_with(modules, names, c, measure), i) for i, c in enumerate(choices)]
            group_configs[group] = choices[min(timed)[1]]
            for name in names:  # later groups are timed with this group's choice
                modules[name]._config = _config_for(modules[name], group_configs[group])
            if verbose:
                print(f"group {group}: {group_configs[group]}")
        os.makedirs(save_dir, exist_ok=True)
        torch.save((name_to_group, group_configs), path)
    for name, module in model.named_modules():
        if isinstance(module, Conv3d) and name_to_group.get(name) in group_configs:
            module._config = _config_for(module, group_configs[name_to_group[name]])


def _time_with(modules, names, values, measure) -> float:
    saved = {name: modules[name]._config for name in names}
    for name in names:
        modules[name]._config = _config_for(modules[name], values)
    try:
        return measure()
    finally:
        for name, config in saved.items():
            modules[name]._config = config
