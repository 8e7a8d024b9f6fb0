"""torchsparse.backends. ``allow_tf32`` is torchsparse_pp's switch (torchsparse_pp.backends).
``benchmark``, ``hash_rsv_ratio`` and ``allow_fp16`` described or tuned 2.1's own CUDA kernels and
hash tables and change no result; they are kept as plain settings (``torchsparse.tune`` sets
``benchmark`` as 2.1's did)."""
import sys
import types

import torch

from ... import backends as _library

benchmark = False
hash_rsv_ratio = 2


def _capability():
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return major * 100 + minor * 10


device_capability = _capability()
allow_fp16 = device_capability is not None and device_capability >= 750


def init() -> None:
    global benchmark, hash_rsv_ratio, device_capability, allow_fp16
    benchmark, hash_rsv_ratio, device_capability = False, 2, _capability()
    allow_fp16 = device_capability is not None and device_capability >= 750


class _Backends(types.ModuleType):
    @property
    def allow_tf32(self) -> bool:
        return _library.allow_tf32

    @allow_tf32.setter
    def allow_tf32(self, value: bool) -> None:
        _library.allow_tf32 = value


sys.modules[__name__].__class__ = _Backends
