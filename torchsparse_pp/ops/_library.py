"""Loads the compiled operator library, which registers torch.ops.torchsparse_pp.*."""

import torch  # noqa: F401  (loads libc10/libtorch, which _C links against)


def load_library() -> None:
    try:
        from .. import _C  # noqa: F401  (importing registers the operators)
    except ImportError as err:
        raise ImportError(
            "torchsparse_pp._C is not built. Build it from the repository root with "
            "`pip install -e . --no-build-isolation` (see README.md)."
        ) from err
