"""spconv 2.x surface over torchsparse_pp: ``spconv.pytorch`` (and, as in spconv 1.x, the same
names at the top level), ``spconv.core``, ``spconv.constants``, ``spconv.utils`` (voxel
generators) and ``spconv.test_utils``. See docs/migrating.md for what is supported."""
from ... import __version__ as __torchsparse_pp_version__
from . import constants, core, pytorch
from .core import AlgoHint, ConvAlgo
from .pytorch import *  # noqa: F401,F403  (spconv 1.x code uses the top-level names)
from .pytorch import __all__ as _pytorch_names

# The API version this adapter reproduces: client code compares it (OpenPCDet reads
# float(__version__[2:])). torchsparse_pp's own version is __torchsparse_pp_version__.
__version__ = "2.3.8"
SPCONV_VERSION_NUMBERS = [2, 3, 8]

__all__ = list(_pytorch_names) + ["AlgoHint", "constants", "core", "pytorch", "__torchsparse_pp_version__",
                                  "SPCONV_VERSION_NUMBERS"]
