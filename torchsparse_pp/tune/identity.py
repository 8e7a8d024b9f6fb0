"""What a tuned file is bound to: the model's structure and the device it was tuned on."""
import hashlib
import platform

import torch
from torch import nn

from ..nn.modules.conv import Conv3d


def structural_hash(model: nn.Module) -> str:
    """A hash of the sparse convs (names, channels, geometry) and of every parameter's name and
    shape. Configs, weights, the device and norm classes (BatchNorm vs SyncBatchNorm) do not
    enter it."""
    lines = []
    for name, m in model.named_modules():
        if isinstance(m, Conv3d):
            g = m.geometry
            lines.append(f"{name}:Conv3d({m.in_channels},{m.out_channels},k={g.kernel_size},s={g.stride},"
                         f"d={g.dilation},p={g.padding},t={m.transposed},gen={m.generative},mode={m.downsample_mode})")
    lines += [f"{name}{list(p.shape)}" for name, p in model.named_parameters()]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


def device_name(device: torch.device) -> str:
    """'Intel(R) Xeon(R) ...' or 'NVIDIA H100 80GB HBM3': what tuned latencies depend on."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        return _cpu_name()
    return device.type


def model_device(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    raise ValueError(f"{type(model).__name__} has no parameters: cannot tell which device it runs on")
