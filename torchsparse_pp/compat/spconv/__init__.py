"""spconv 2.x surface over torchsparse_pp: ``spconv.pytorch`` (and, as in spconv 1.x, the same
names at the top level). See docs/migrating.md for what is supported."""
from . import core, pytorch
from .pytorch import *  # noqa: F401,F403  (spconv 1.x code uses the top-level names)
from .pytorch import __all__

# A local version label: the API is spconv 2.3.8's, the implementation is not spconv.
__version__ = "2.3.8+torchsparse_pp"
