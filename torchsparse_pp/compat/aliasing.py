"""Module aliases: after ``install("torchsparse", target)``, ``import torchsparse.x.y`` returns the
module ``target.x.y`` itself (one module object under two names), so unchanged peer code imports
our adapters. The finder sits first on ``sys.meta_path``; it answers only for the aliased names."""
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from typing import Dict


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target
        self._spec = None

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        self._spec = module.__spec__
        return module

    def exec_module(self, module) -> None:
        # The import system stamped the alias's spec on the shared module; give it back its own.
        module.__spec__ = self._spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.aliases: Dict[str, str] = {}  # alias top-level name -> target package

    def _target(self, fullname: str):
        top, _, rest = fullname.partition(".")
        base = self.aliases.get(top)
        if base is None:
            return None
        return base + ("." + rest if rest else "")

    def find_spec(self, fullname, path=None, target=None):
        name = self._target(fullname)
        if name is None:
            return None
        if importlib.util.find_spec(name) is None:
            return None  # -> ModuleNotFoundError naming the alias, as for any missing module
        is_package = hasattr(importlib.import_module(name), "__path__")
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(name), is_package=is_package)


_FINDER = _AliasFinder()


def install(alias: str, target: str, real_package: str) -> None:
    """Makes ``alias`` (and its submodules) import ``target``. Raises if the real package is
    already imported: its classes would then be mixed with ours in one process."""
    present = sys.modules.get(alias)
    if present is not None and not (getattr(present, "__name__", None) == target):
        raise RuntimeError(
            f"torchsparse_pp.compat.alias({alias!r}): the real {real_package} is already imported "
            f"(from {getattr(present, '__file__', '?')}). Call alias({alias!r}) before anything imports "
            f"{alias}, or use the adapters directly: from torchsparse_pp.compat import {alias}")
    _FINDER.aliases[alias] = target
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    # Submodules the real package was not imported under yet resolve through the finder.
    importlib.import_module(alias)


def installed() -> Dict[str, str]:
    return dict(_FINDER.aliases)
