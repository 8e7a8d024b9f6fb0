"""Loading info .pkl files without running code from them: an unpickler that builds only plain
containers, numbers, strings and numpy arrays / scalars / dtypes, and refuses any other class
with a ValueError naming the file (pickle.load would import and call whatever the file names)."""
from __future__ import annotations

import pickle
from pathlib import Path

__all__ = ["load_pickle"]

# (module, name) a numpy array or scalar pickles as, in numpy 1.x and 2.x.
_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "complex"),
    ("collections", "OrderedDict"),
}


class _Refused(ValueError):
    """A class the file names that plain data does not need."""


class _PlainUnpickler(pickle.Unpickler):
    def __init__(self, file, path: Path):
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED or (module == "numpy.dtypes" and name.endswith("DType")):
            return super().find_class(module, name)
        raise _Refused(f"{str(self.path)!r} holds an object of {module}.{name}; an info file holds only "
                         "dicts, lists, numbers, strings and numpy arrays")


def load_pickle(path: Path):
    """The contents of a pickle of plain data and numpy arrays; ValueError naming the file if it
    is not one."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"info file {str(path)!r} does not exist")
    with open(path, "rb") as f:
        try:
            return _PlainUnpickler(f, path).load()
        except _Refused:
            raise
        except Exception as err:  # truncated or not a pickle: UnpicklingError, EOFError, ...
            raise ValueError(f"{str(path)!r} is not a readable pickle file: {type(err).__name__}: {err}") from err
