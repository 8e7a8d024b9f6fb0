"""Point-cloud files: KITTI-style ``.bin``, ``.npy``, ``.pcd`` and ``.ply``.

Points are float32 ``[N, C]`` arrays whose first three columns are x, y, z. Every reader is
numpy only and checks a file against its own header before it reads the values: a truncated,
misaligned, oversized or malformed file raises ``ValueError`` naming the file (never a crash
and never silently shortened data). Rows holding NaN or Inf are dropped with a
``NonFiniteWarning`` that counts them (``nonfinite="error"`` raises instead).

``.pcd`` (ascii, binary, binary_compressed) and ``.ply`` (ascii, binary little / big endian)
give ``[N, 3]``, or ``[N, 4]`` when the file has an ``intensity`` field. Writing ``.pcd`` /
``.ply`` goes through open3d (the ``io`` extra, imported only then): a fourth column is stored
as the point attribute ``intensity``; more columns have no standard attribute in those formats
and are refused rather than dropped.
"""
from __future__ import annotations

import os
import struct
import warnings
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

import numpy as np

__all__ = ["read_bin", "write_bin", "read_points", "write_points", "label_colors", "save_prediction_ply",
           "require_open3d", "read_pcd", "read_ply", "drop_nonfinite", "NonFiniteWarning", "MAX_ROWS"]

PathLike = Union[str, os.PathLike]
_OPEN3D_SUFFIXES = (".pcd", ".ply")
#: Default bound on the records a reader accepts (67M points, 1 GiB of float32 x, y, z, i):
#: far above any LiDAR scan, and a file claiming more is refused before anything is allocated.
MAX_ROWS = 1 << 26
# A .pcd / .ply header longer than this is not a point-cloud header.
_MAX_HEADER_BYTES = 1 << 16
_NONFINITE = ("drop", "error")


class NonFiniteWarning(UserWarning):
    """Rows with NaN or Inf values were dropped from a point file."""


def require_open3d():
    """The open3d module, or an ImportError that says how to install it."""
    try:
        import open3d
    except ImportError as err:  # also raised when open3d's system libraries (libusb-1.0) are missing
        raise ImportError(
            "writing .pcd/.ply files needs open3d, which comes with the 'io' extra: "
            "pip install 'torchsparse-pp[io]' (open3d also needs the system library libusb-1.0-0; "
            f"scripts/setup.sh installs it). Import failed with: {err}") from err
    return open3d


def _existing_file(path: PathLike, what: str) -> Path:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} {str(path)!r} does not exist" if not path.exists()
                                else f"{what} {str(path)!r} is not a file")
    return path


def _check_max_rows(max_rows: Optional[int]) -> Optional[int]:
    if max_rows is not None and (isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 0):
        raise ValueError(f"max_rows must be a non-negative int or None, got {max_rows!r}")
    return max_rows


def _refuse_oversized(path: Path, rows: int, max_rows: Optional[int], detail: str = "") -> None:
    if max_rows is not None and rows > max_rows:
        raise ValueError(f"{str(path)!r} holds {rows} records{detail}, more than max_rows={max_rows}: refused "
                         "before reading (pass a larger max_rows, or None, if the file is meant to be this big)")


def read_bin(path: PathLike, columns: int = 4, dtype=np.float32, max_rows: Optional[int] = MAX_ROWS) -> np.ndarray:
    """A flat binary file of fixed-size records as ``[N, columns]`` (KITTI velodyne: 4 float32,
    nuScenes ``.pcd.bin``: 5 float32, labels: 1 uint32 / uint8). Raises if the size is not a
    whole number of records, or if there are more than ``max_rows`` (None: no bound)."""
    path = _existing_file(path, "point file")
    if isinstance(columns, bool) or not isinstance(columns, int) or columns < 1:
        raise ValueError(f"columns must be a positive int, got {columns!r}")
    max_rows = _check_max_rows(max_rows)
    record = columns * np.dtype(dtype).itemsize
    size = path.stat().st_size
    if size % record:
        raise ValueError(f"{str(path)!r} has {size} bytes, not a multiple of the {record}-byte record "
                         f"({columns} x {np.dtype(dtype).name}): the file is truncated or not in this format")
    _refuse_oversized(path, size // record, max_rows, f" ({size} bytes)")
    data = np.fromfile(path, dtype=np.dtype(dtype).newbyteorder("<"))
    if data.size * data.itemsize != size:  # the file changed while it was read
        raise ValueError(f"{str(path)!r}: read {data.size * data.itemsize} of {size} bytes")
    return data.astype(dtype, copy=False).reshape(-1, columns)


def write_bin(path: PathLike, points: np.ndarray, dtype=np.float32) -> None:
    """Writes ``[N, C]`` values as flat little-endian records (the layout read_bin reads)."""
    points = np.asarray(points)
    if points.ndim != 2:
        raise ValueError(f"points must be [N, C], got shape {points.shape}")
    np.ascontiguousarray(points, dtype=np.dtype(dtype).newbyteorder("<")).tofile(path)


def _check_points(points: np.ndarray, max_columns: Optional[int] = None) -> np.ndarray:
    points = np.asarray(points)
    if points.ndim != 2 or points.shape[1] < 3:
        raise ValueError(f"points must be [N, 3+] (x, y, z, ...), got shape {points.shape}")
    if max_columns is not None and points.shape[1] > max_columns:
        raise ValueError(f"points have {points.shape[1]} columns; .pcd/.ply files here store x, y, z and "
                         f"optionally intensity (at most {max_columns}); save more columns as .npy or .bin")
    if not np.issubdtype(points.dtype, np.number):
        raise TypeError(f"points must be numeric, got {points.dtype}")
    return points


def drop_nonfinite(points: np.ndarray, path: PathLike, nonfinite: str = "drop", *aligned: np.ndarray):
    """``points`` without the rows that hold NaN or Inf, and each of ``aligned`` (per-point arrays:
    labels, instance ids) without the same rows. ``nonfinite="drop"`` warns with the count
    (NonFiniteWarning); ``"error"`` raises ValueError naming the file and the first such row.
    Returns the points alone, or (points, *aligned) when arrays are given."""
    if nonfinite not in _NONFINITE:
        raise ValueError(f"nonfinite must be one of {_NONFINITE}, got {nonfinite!r}")
    finite = np.isfinite(points).all(1) if points.size else np.ones(len(points), dtype=bool)
    bad = int(len(points) - np.count_nonzero(finite))
    if bad:
        if nonfinite == "error":
            first = int(np.argmin(finite))
            raise ValueError(f"{str(path)!r}: {bad} of {len(points)} points hold NaN or Inf (the first is row "
                             f"{first}: {points[first].tolist()})")
        warnings.warn(f"{str(path)!r}: dropped {bad} of {len(points)} points holding NaN or Inf", NonFiniteWarning,
                      stacklevel=2)
        points = points[finite]
        aligned = tuple(np.asarray(a)[finite] for a in aligned)
    return (points, *aligned) if aligned else points


def read_points(path: PathLike, columns: int = 4, nonfinite: str = "drop",
                max_rows: Optional[int] = MAX_ROWS) -> np.ndarray:
    """Points from ``.bin`` (``columns`` float32 per point), ``.npy``, ``.pcd`` or ``.ply``.

    ``.pcd``/``.ply`` give ``[N, 3]`` float32, or ``[N, 4]`` when the file has an intensity
    attribute. ``columns`` only applies to ``.bin``. Rows holding NaN or Inf are dropped with a
    warning (``nonfinite="error"``: raise). Files with more than ``max_rows`` points are refused
    before reading (None: no bound).
    """
    if nonfinite not in _NONFINITE:
        raise ValueError(f"nonfinite must be one of {_NONFINITE}, got {nonfinite!r}")
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".bin":
        points = read_bin(path, columns, max_rows=max_rows)
    elif suffix == ".npy":
        points = _read_npy(_existing_file(path, "point file"), _check_max_rows(max_rows))
    elif suffix == ".pcd":
        points = read_pcd(path, max_rows=max_rows)
    elif suffix == ".ply":
        points = read_ply(path, max_rows=max_rows)
    else:
        raise ValueError(f"unsupported point file suffix {suffix!r} for {str(path)!r}; "
                         "use .bin, .npy, .pcd or .ply")
    return drop_nonfinite(points, path, nonfinite)


def _read_npy(path: Path, max_rows: Optional[int]) -> np.ndarray:
    """A 2-D numeric ``.npy`` array with >= 3 columns, its header checked against the file size
    before the values are read."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        try:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f"unsupported .npy format version {version}")
        except Exception as err:  # numpy parses the header with ast / tokenize: any of their errors
            raise ValueError(f"{str(path)!r} is not a valid .npy file: {type(err).__name__}: {err}") from None
        offset = f.tell()
    if dtype.hasobject or dtype.fields is not None or dtype.kind not in "biuf":
        raise ValueError(f"{str(path)!r} holds {dtype} values; point files hold plain numbers")
    if len(shape) != 2 or shape[1] < 3:
        raise ValueError(f"{str(path)!r} holds an array of shape {shape}; points are [N, 3+] (x, y, z, ...)")
    _refuse_oversized(path, shape[0], max_rows)
    expected = shape[0] * shape[1] * dtype.itemsize
    if size - offset != expected:
        state = "truncated" if size - offset < expected else "longer than its header says"
        raise ValueError(f"{str(path)!r} is {state}: its header promises {shape} {dtype} ({expected} bytes of "
                         f"data), the file has {size - offset}")
    data = np.fromfile(path, dtype=dtype, offset=offset)
    points = data.reshape(shape[::-1]).T if fortran else data.reshape(shape)
    return np.ascontiguousarray(points, dtype=np.float32)


# --- .pcd and .ply ----------------------------------------------------------------------------------
def _header_lines(path: Path, data: bytes, last: bytes) -> Tuple[List[str], int]:
    """The header lines up to and including the first starting with ``last``, and the offset of
    the data after it."""
    pos = 0
    lines = []
    while True:
        end = data.find(b"\n", pos, _MAX_HEADER_BYTES + 1)
        if end < 0:
            raise ValueError(f"{str(path)!r}: no {last.decode()!r} header line within the first "
                             f"{min(len(data), _MAX_HEADER_BYTES)} bytes (truncated or not this format)")
        raw = data[pos:end].rstrip(b"\r")
        try:
            line = raw.decode("ascii").strip()
        except UnicodeDecodeError:
            raise ValueError(f"{str(path)!r}: header line {len(lines) + 1} is not ASCII text") from None
        lines.append(line)
        pos = end + 1
        if raw.split(b" ", 1)[0] == last or raw == last:
            return lines, pos


def _int_field(path: Path, key: str, value: str, low: int = 0) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{str(path)!r}: header {key} must be an integer, got {value!r}") from None
    if number < low:
        raise ValueError(f"{str(path)!r}: header {key} must be >= {low}, got {number}")
    return number


_PCD_TYPES = {("F", 4): "f4", ("F", 8): "f8", ("I", 1): "i1", ("I", 2): "i2", ("I", 4): "i4", ("I", 8): "i8",
              ("U", 1): "u1", ("U", 2): "u2", ("U", 4): "u4", ("U", 8): "u8"}


def read_pcd(path: PathLike, max_rows: Optional[int] = MAX_ROWS) -> np.ndarray:
    """x, y, z (and intensity when present) of a ``.pcd`` file (PCD v0.5-0.7: ascii, binary,
    binary_compressed) as float32 ``[N, 3 or 4]``; NaN rows are kept (read_points drops them)."""
    path = _existing_file(path, "point file")
    max_rows = _check_max_rows(max_rows)
    data = path.read_bytes()
    lines, offset = _header_lines(path, data, b"DATA")
    header: Dict[str, List[str]] = {}
    for line in lines:
        if not line or line.startswith("#"):
            continue
        key, *values = line.split()
        if key in header:
            raise ValueError(f"{str(path)!r}: header field {key} appears twice")
        header[key] = values
    for key in ("FIELDS", "SIZE", "TYPE", "POINTS", "DATA"):
        if key not in header:
            raise ValueError(f"{str(path)!r}: the PCD header has no {key} line")
    fields, sizes, types = header["FIELDS"], header["SIZE"], header["TYPE"]
    counts = header.get("COUNT", ["1"] * len(fields))
    if not fields or not len(fields) == len(sizes) == len(types) == len(counts):
        raise ValueError(f"{str(path)!r}: FIELDS, SIZE, TYPE and COUNT must list as many entries "
                         f"({len(fields)}, {len(sizes)}, {len(types)}, {len(counts)})")
    if len(header["POINTS"]) != 1 or len(header["DATA"]) != 1:
        raise ValueError(f"{str(path)!r}: POINTS and DATA take one value each")
    points = _int_field(path, "POINTS", header["POINTS"][0])
    if "WIDTH" in header and "HEIGHT" in header and len(header["WIDTH"]) == len(header["HEIGHT"]) == 1:
        width = _int_field(path, "WIDTH", header["WIDTH"][0])
        height = _int_field(path, "HEIGHT", header["HEIGHT"][0])
        if width * height != points:
            raise ValueError(f"{str(path)!r}: WIDTH x HEIGHT ({width} x {height}) differs from POINTS ({points})")
    _refuse_oversized(path, points, max_rows)
    columns = []
    for name, size, kind, count in zip(fields, sizes, types, counts):
        code = _PCD_TYPES.get((kind, _int_field(path, "SIZE", size, 1)))
        if code is None:
            raise ValueError(f"{str(path)!r}: field {name!r} has an unsupported TYPE {kind} / SIZE {size}")
        count = _int_field(path, "COUNT", count, 1)
        if count > 4096:
            raise ValueError(f"{str(path)!r}: field {name!r} has COUNT {count}, more than 4096")
        columns.append((name, code, count))
    names = [name for name, _, _ in columns]
    for name in ("x", "y", "z"):
        if name not in names:
            raise ValueError(f"{str(path)!r}: the PCD file has no {name!r} field (fields: {names})")
    named = [name for name in names if name != "_"]  # "_" marks padding and may repeat
    if len(set(named)) != len(named):
        raise ValueError(f"{str(path)!r}: repeated field names {names}")
    layout = [(name if name != "_" else f"_{i}", "<" + code, (count,)) for i, (name, code, count) in enumerate(columns)]
    record = np.dtype(layout)
    mode = header["DATA"][0]
    body = memoryview(data)[offset:]
    if mode == "ascii":
        table = _ascii_rows(path, bytes(body), points, sum(count for _, _, count in columns))
        values = {}
        col = 0
        for name, _, count in columns:
            values[name] = table[:, col]
            col += count
    elif mode == "binary":
        expected = points * record.itemsize
        if len(body) < expected:
            raise ValueError(f"{str(path)!r} is truncated: {points} points of {record.itemsize} bytes need "
                             f"{expected} bytes of data, the file has {len(body)}")
        if len(body) > expected:
            raise ValueError(f"{str(path)!r} has {len(body) - expected} bytes after its {points} points "
                             "(misaligned or not the header's layout)")
        rows = np.frombuffer(body, dtype=record, count=points)
        values = {name: rows[name][:, 0] for name in ("x", "y", "z", "intensity") if name in names}
    elif mode == "binary_compressed":
        if len(body) < 8:
            raise ValueError(f"{str(path)!r} is truncated: no compressed-size words after the header")
        packed, unpacked = struct.unpack("<II", body[:8])
        if packed > len(body) - 8:
            raise ValueError(f"{str(path)!r} is truncated: {packed} compressed bytes announced, "
                             f"{len(body) - 8} present")
        if unpacked != points * record.itemsize:
            raise ValueError(f"{str(path)!r}: the uncompressed size {unpacked} differs from {points} points of "
                             f"{record.itemsize} bytes")
        raw = _lzf_decompress(path, bytes(body[8:8 + packed]), unpacked)
        values, start = {}, 0
        for name, code, count in columns:  # field by field (structure of arrays)
            width = np.dtype("<" + code).itemsize * count
            column = np.frombuffer(raw, dtype="<" + code, count=points * count, offset=start)
            values[name] = column.reshape(points, count)[:, 0]
            start += width * points
    else:
        raise ValueError(f"{str(path)!r}: unsupported PCD DATA {mode!r} (ascii, binary or binary_compressed)")
    keep = ["x", "y", "z"] + (["intensity"] if "intensity" in names else [])
    return np.stack([np.asarray(values[name], dtype=np.float32) for name in keep], 1).reshape(points, len(keep))


def _ascii_rows(path: Path, body: bytes, rows: int, width: int) -> np.ndarray:
    """``rows`` lines of ``width`` numbers each (blank lines ignored) as float64."""
    try:
        text = body.decode("ascii")
    except UnicodeDecodeError:
        raise ValueError(f"{str(path)!r}: the ascii data is not ASCII text") from None
    if rows and not text.rstrip(" \t\r").endswith("\n"):
        raise ValueError(f"{str(path)!r}: the ascii data does not end with a line break (truncated?)")
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) != rows:
        raise ValueError(f"{str(path)!r}: the header promises {rows} points, the ascii data has {len(lines)} lines")
    out = np.empty((rows, width), dtype=np.float64)
    for i, line in enumerate(lines):
        parts = line.split()
        if len(parts) < width:
            raise ValueError(f"{str(path)!r}: ascii data line {i + 1} has {len(parts)} values, expected {width}")
        try:
            out[i] = [float(v) for v in parts[:width]]
        except ValueError:
            raise ValueError(f"{str(path)!r}: ascii data line {i + 1} holds a value that is not a number") from None
    return out


def _lzf_decompress(path: Path, data: bytes, expected: int) -> bytes:
    """LZF (liblzf) decompression with every reference checked: exactly ``expected`` bytes."""
    out = bytearray()
    i, n = 0, len(data)
    while i < n:
        ctrl = data[i]
        i += 1
        if ctrl < 32:  # a literal run of ctrl + 1 bytes
            length = ctrl + 1
            if i + length > n:
                raise ValueError(f"{str(path)!r}: the compressed data is truncated (a literal runs past its end)")
            out += data[i:i + length]
            i += length
        else:  # a back reference
            length = ctrl >> 5
            if length == 7:
                if i >= n:
                    raise ValueError(f"{str(path)!r}: the compressed data is truncated")
                length += data[i]
                i += 1
            if i >= n:
                raise ValueError(f"{str(path)!r}: the compressed data is truncated")
            ref = len(out) - ((ctrl & 0x1F) << 8) - data[i] - 1
            i += 1
            length += 2
            if ref < 0:
                raise ValueError(f"{str(path)!r}: the compressed data refers before its start (corrupt)")
            if ref + length <= len(out):
                out += out[ref:ref + length]
            else:  # an overlapping copy repeats the bytes it writes
                for _ in range(length):
                    out.append(out[ref])
                    ref += 1
        if len(out) > expected:
            raise ValueError(f"{str(path)!r}: the compressed data expands past the {expected} bytes announced")
    if len(out) != expected:
        raise ValueError(f"{str(path)!r}: the compressed data expands to {len(out)} bytes, not the {expected} "
                         "announced (truncated or corrupt)")
    return bytes(out)


_PLY_TYPES = {"char": "i1", "int8": "i1", "uchar": "u1", "uint8": "u1", "short": "i2", "int16": "i2",
              "ushort": "u2", "uint16": "u2", "int": "i4", "int32": "i4", "uint": "u4", "uint32": "u4",
              "float": "f4", "float32": "f4", "double": "f8", "float64": "f8"}


def read_ply(path: PathLike, max_rows: Optional[int] = MAX_ROWS) -> np.ndarray:
    """x, y, z (and intensity when present) of the ``vertex`` element of a ``.ply`` file (ascii,
    binary_little_endian, binary_big_endian) as float32 ``[N, 3 or 4]``."""
    path = _existing_file(path, "point file")
    max_rows = _check_max_rows(max_rows)
    data = path.read_bytes()
    if not data.startswith(b"ply\n") and not data.startswith(b"ply\r\n"):
        raise ValueError(f"{str(path)!r} is not a PLY file (it does not start with 'ply')")
    lines, offset = _header_lines(path, data, b"end_header")
    fmt = None
    elements: List[list] = []  # [name, count, [(property name, type code or None for lists)]]
    for number, line in enumerate(lines[1:-1], 2):
        words = line.split()
        if not words or words[0] in ("comment", "obj_info"):
            continue
        if words[0] == "format":
            if len(words) != 3 or words[1] not in ("ascii", "binary_little_endian", "binary_big_endian"):
                raise ValueError(f"{str(path)!r}: unsupported PLY format line {line!r}")
            fmt = words[1]
        elif words[0] == "element":
            if len(words) != 3:
                raise ValueError(f"{str(path)!r}: header line {number} {line!r}: expected 'element <name> <count>'")
            elements.append([words[1], _int_field(path, f"element {words[1]} count", words[2]), []])
        elif words[0] == "property":
            if not elements:
                raise ValueError(f"{str(path)!r}: header line {number}: a property before any element")
            if len(words) == 5 and words[1] == "list":
                if words[2] not in _PLY_TYPES or words[3] not in _PLY_TYPES:
                    raise ValueError(f"{str(path)!r}: header line {number}: unknown list types in {line!r}")
                elements[-1][2].append((words[4], None))
            elif len(words) == 3 and words[1] in _PLY_TYPES:
                elements[-1][2].append((words[2], _PLY_TYPES[words[1]]))
            else:
                raise ValueError(f"{str(path)!r}: header line {number}: unsupported property {line!r}")
        else:
            raise ValueError(f"{str(path)!r}: header line {number}: unknown keyword {words[0]!r}")
    if fmt is None:
        raise ValueError(f"{str(path)!r}: the PLY header has no format line")
    names = [e[0] for e in elements]
    if "vertex" not in names:
        raise ValueError(f"{str(path)!r}: the PLY file has no vertex element (elements: {names})")
    before = elements[:names.index("vertex")]
    name, count, props = elements[names.index("vertex")]
    prop_names = [p for p, _ in props]
    for axis in ("x", "y", "z"):
        if axis not in prop_names:
            raise ValueError(f"{str(path)!r}: the vertex element has no {axis!r} property (properties: {prop_names})")
    if len(set(prop_names)) != len(prop_names):
        raise ValueError(f"{str(path)!r}: repeated vertex properties {prop_names}")
    if any(code is None for _, code in props) or any(code is None for e in before for _, code in e[2]):
        raise ValueError(f"{str(path)!r}: list properties in or before the vertex element are not supported "
                         "(a point cloud's vertices hold plain values)")
    _refuse_oversized(path, count, max_rows)
    body = memoryview(data)[offset:]
    keep = ["x", "y", "z"] + (["intensity"] if "intensity" in prop_names else [])
    if fmt == "ascii":
        skip = sum(e[1] for e in before)
        text_rows = _ascii_rows_prefix(path, bytes(body), skip + count, len(props))
        table = text_rows[skip:]
        out = np.stack([table[:, prop_names.index(k)] for k in keep], 1)
        return out.astype(np.float32).reshape(count, len(keep))
    order = "<" if fmt == "binary_little_endian" else ">"
    start = 0
    for _, n, eprops in before:
        start += n * np.dtype([(p, order + c) for p, c in eprops]).itemsize
    record = np.dtype([(p, order + c) for p, c in props])
    end = start + count * record.itemsize
    if end > len(body):
        raise ValueError(f"{str(path)!r} is truncated: {count} vertices of {record.itemsize} bytes end at byte "
                         f"{end} of the data, the file has {len(body)}")
    after = elements[names.index("vertex") + 1:]
    if all(code is not None for e in after for _, code in e[2]):
        tail = sum(n * np.dtype([(p, order + c) for p, c in eprops]).itemsize for _, n, eprops in after)
        if end + tail != len(body):
            raise ValueError(f"{str(path)!r}: the data is {len(body)} bytes but the header's elements take "
                             f"{end + tail} (truncated or misaligned)")
    rows = np.frombuffer(body, dtype=record, count=count, offset=start)
    return np.stack([rows[k].astype(np.float32) for k in keep], 1).reshape(count, len(keep))


def _ascii_rows_prefix(path: Path, body: bytes, rows: int, width: int) -> np.ndarray:
    """The first ``rows`` non-blank lines of ascii PLY data (later elements may follow)."""
    try:
        text = body.decode("ascii")
    except UnicodeDecodeError:
        raise ValueError(f"{str(path)!r}: the ascii data is not ASCII text") from None
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) < rows or (len(lines) == rows and rows and not text.rstrip(" \t\r").endswith("\n")):
        raise ValueError(f"{str(path)!r} is truncated: the header promises {rows} ascii rows, the data has "
                         f"{len(lines)}" + ("" if len(lines) < rows else " (the last without its line break)"))
    return _ascii_rows(path, "".join(line + "\n" for line in lines[:rows]).encode(), rows, width)


def write_points(path: PathLike, points: np.ndarray, colors: Optional[np.ndarray] = None) -> None:
    """Writes points to ``.bin``/``.npy`` (all columns, float32) or ``.pcd``/``.ply`` (x, y, z and
    an optional intensity column, plus optional uint8 ``[N, 3]`` RGB colours)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in (".bin", ".npy"):
        if colors is not None:
            raise ValueError(f"{suffix} files hold no colours; write .ply or .pcd to keep them")
        points = _check_points(points).astype(np.float32)
        if suffix == ".bin":
            write_bin(path, points)
        else:
            np.save(path, points)
        return
    if suffix not in _OPEN3D_SUFFIXES:
        raise ValueError(f"unsupported point file suffix {suffix!r} for {str(path)!r}; "
                         "use .bin, .npy, .pcd or .ply")
    points = _check_points(points, max_columns=4).astype(np.float32)
    o3d = require_open3d()
    cloud = o3d.t.geometry.PointCloud()
    cloud.point.positions = o3d.core.Tensor(np.ascontiguousarray(points[:, :3]))
    if points.shape[1] == 4:
        cloud.point.intensity = o3d.core.Tensor(np.ascontiguousarray(points[:, 3:4]))
    if colors is not None:
        colors = np.asarray(colors)
        if colors.shape != (len(points), 3) or colors.dtype != np.uint8:
            raise ValueError(f"colors must be uint8 [{len(points)}, 3], got {colors.dtype} {colors.shape}")
        cloud.point.colors = o3d.core.Tensor(np.ascontiguousarray(colors))
    if not o3d.t.io.write_point_cloud(str(path), cloud):
        raise OSError(f"open3d could not write {str(path)!r}")


def label_colors(labels: np.ndarray, ignore_index: Optional[int] = 255) -> np.ndarray:
    """uint8 RGB per label: a fixed palette of 20 distinct colours (cycled for larger ids);
    ``ignore_index`` is drawn grey."""
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be a 1-D integer array, got {labels.dtype} {labels.shape}")
    if labels.size and labels.min() < 0:
        raise ValueError(f"labels must be non-negative, got {labels.min()}")
    colors = _PALETTE[labels % len(_PALETTE)]
    if ignore_index is not None:
        colors[labels == ignore_index] = _IGNORE_COLOR
    return colors


def save_prediction_ply(path: PathLike, points: np.ndarray, labels: np.ndarray,
                        ignore_index: Optional[int] = 255) -> None:
    """A ``.ply`` of the points coloured by predicted (or ground-truth) label (see label_colors)."""
    if Path(path).suffix.lower() != ".ply":
        raise ValueError(f"save_prediction_ply writes .ply files, got {str(path)!r}")
    points = _check_points(points)
    labels = np.asarray(labels)
    if labels.shape != (len(points),):
        raise ValueError(f"labels must have one entry per point ({len(points)}), got shape {labels.shape}")
    write_points(path, points[:, :3], colors=label_colors(labels, ignore_index))


def _palette(count: int) -> np.ndarray:
    """``count`` distinct colours: hues a golden-ratio step apart, alternating in brightness so
    neighbouring ids also differ in lightness."""
    hue = (np.arange(count) * 0.618033988749895) % 1.0
    value = np.where(np.arange(count) % 2 == 0, 0.95, 0.7)
    saturation = 0.8
    # HSV -> RGB
    sector = np.floor(hue * 6.0)
    frac = hue * 6.0 - sector
    p, q, t = value * (1 - saturation), value * (1 - saturation * frac), value * (1 - saturation * (1 - frac))
    table = [(value, t, p), (q, value, p), (p, value, t), (p, q, value), (t, p, value), (value, p, q)]
    rgb = np.zeros((count, 3))
    for k, (r, g, b) in enumerate(table):
        pick = sector == k
        rgb[pick] = np.stack([r, g, b], 1)[pick]
    return np.round(rgb * 255).astype(np.uint8)


_PALETTE = _palette(20)  # one colour per class of the 19- and 16-class tasks
_IGNORE_COLOR = np.array([128, 128, 128], dtype=np.uint8)
