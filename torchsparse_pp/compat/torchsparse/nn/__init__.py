"""torchsparse.nn: modules (and the functional / utils submodules)."""
from . import functional, utils
from .modules import *  # noqa: F401,F403
from .modules import __all__
