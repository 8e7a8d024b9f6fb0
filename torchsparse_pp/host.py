"""Host copies of device values that the library keeps on purpose (per-offset pair counts that
host-side schedules loop over). Made by ``to_host``: one device read, then host tensors, which
torchsparse_pp.utils.gpu_cost does not count as device reads when read again (on a GPU reading
them is free)."""
import torch
from torch.utils.weak import WeakIdKeyDictionary

# Keyed by identity: a WeakSet would compare tensors with ==.
_host = WeakIdKeyDictionary()


def to_host(t: torch.Tensor) -> torch.Tensor:
    """``t.cpu()``, marked as a host tensor."""
    host = t.cpu()
    if host is t:  # a CPU tensor standing for a device one (backends.device_policy): copy it
        host = t.clone()
    _host[host] = True
    return host


def mark_host(t: torch.Tensor) -> torch.Tensor:
    """``t``, a tensor made on the host from host copies, marked as one."""
    _host[t] = True
    return t


def host_views(t: torch.Tensor, *bounds: int):
    """Slices ``t[bounds[i]:bounds[i + 1]]`` of a host copy, each marked as a host tensor."""
    views = tuple(t[a:b] for a, b in zip(bounds[:-1], bounds[1:]))
    for v in views:
        _host[v] = True
    return views


def is_host(t: torch.Tensor) -> bool:
    return t in _host
