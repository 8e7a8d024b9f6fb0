"""Writing results safely: whole files only (a temp file renamed into place), and output paths
checked before any long work starts, so a run never dies at its end on a bad path."""
import os
import tempfile
from pathlib import Path
from typing import Union

__all__ = ["atomic_write_text", "atomic_write", "check_writable_dir", "check_new_file"]

PathLike = Union[str, Path]


def atomic_write(path: PathLike, write) -> Path:
    """Calls ``write(tmp_path)`` on a temp file beside ``path``, then renames it to ``path``: a
    reader (or a crash) sees the old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: PathLike, text: str) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text))


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_writable_dir(path: PathLike, what: str) -> Path:
    """``path`` is a directory or can be made one, and we may write there (nothing is created)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{what} {str(path)!r} exists and is not a directory")
    base = _nearest_existing(path.absolute())
    if not base.is_dir():
        raise NotADirectoryError(f"{what} {str(path)!r}: {str(base)!r} is a file, not a directory")
    if not os.access(base, os.W_OK | os.X_OK):
        raise PermissionError(f"{what} {str(path)!r}: no permission to write in {str(base)!r}")
    return path


def check_new_file(path: PathLike, what: str, force: bool = False) -> Path:
    """``path`` can be written: not a directory, its directory writable, and not an existing file
    unless ``force``."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{what} {str(path)!r} is a directory; name a file")
    if path.exists() and not force:
        raise FileExistsError(f"{what} {str(path)!r} exists; choose another path or pass --force to replace it")
    check_writable_dir(path.parent, f"the directory of {what}")
    return path
