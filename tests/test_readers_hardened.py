"""Hardened readers: SemanticKITTI .bin / .label, nuScenes, .npy, PCD and PLY
files that are truncated, misaligned or oversized raise ValueError naming the file (never a
crash, never silently shortened data); rows holding NaN / Inf are dropped with a warning that
counts them (or refused); a fuzz test (hypothesis on bytes) feeds mutated and random files to
every reader for a bounded number of examples."""
import struct
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchsparse_pp import io
from torchsparse_pp.data import NuScenesLidarSeg, SemanticKITTI
from torchsparse_pp.data.semantickitti import read_labels


def points_of(seed, n=50, columns=4):
    return np.random.default_rng(seed).uniform(-40, 40, (n, columns)).astype(np.float32)


# --- files of every format, written by hand (independent of the readers) ---------------------------
def pcd_bytes(points, data="binary", fields=("x", "y", "z", "intensity"), extra_header=""):
    n = len(points)
    head = (f"# .PCD v0.7\nVERSION 0.7\nFIELDS {' '.join(fields)}\nSIZE {' '.join(['4'] * len(fields))}\n"
            f"TYPE {' '.join(['F'] * len(fields))}\nCOUNT {' '.join(['1'] * len(fields))}\nWIDTH {n}\nHEIGHT 1\n"
            f"VIEWPOINT 0 0 0 1 0 0 0\n{extra_header}POINTS {n}\nDATA {data}\n").encode()
    values = np.ascontiguousarray(points[:, :len(fields)], dtype="<f4")
    if data == "ascii":
        return head + "".join(" ".join(repr(float(v)) for v in row) + "\n" for row in values).encode()
    if data == "binary":
        return head + values.tobytes()
    soa = np.ascontiguousarray(values.T).tobytes()  # binary_compressed: fields one after another
    packed = lzf_literals(soa)
    return head + struct.pack("<II", len(packed), len(soa)) + packed


def lzf_literals(raw: bytes) -> bytes:
    """Valid LZF made of literal runs only (up to 32 bytes each)."""
    out = bytearray()
    for i in range(0, len(raw), 32):
        chunk = raw[i:i + 32]
        out.append(len(chunk) - 1)
        out += chunk
    return bytes(out)


def ply_bytes(points, fmt="binary_little_endian", props=("x", "y", "z", "intensity"), faces=0):
    n = len(points)
    head = f"ply\nformat {fmt} 1.0\ncomment test\nelement vertex {n}\n"
    head += "".join(f"property float {p}\n" for p in props)
    if faces:
        head += f"element face {faces}\nproperty list uchar int vertex_indices\n"
    head += "end_header\n"
    values = points[:, :len(props)]
    if fmt == "ascii":
        body = "".join(" ".join(repr(float(v)) for v in row) + "\n" for row in values).encode()
        body += b"".join(b"3 0 1 2\n" for _ in range(faces))
    else:
        order = "<" if fmt == "binary_little_endian" else ">"
        body = np.ascontiguousarray(values, dtype=order + "f4").tobytes()
        body += b"".join(struct.pack(order + "Biii", 3, 0, 1, 2) for _ in range(faces))
    return head.encode() + body


def npy_bytes(tmp_path, points):
    np.save(tmp_path / "tmp.npy", points)
    return (tmp_path / "tmp.npy").read_bytes()


def object_npy(tmp_path):
    np.save(tmp_path / "objects.npy", np.array([[1, "a", None]] * 2, dtype=object), allow_pickle=True)
    return (tmp_path / "objects.npy").read_bytes()


VALID = {
    "pcd_binary": (".pcd", lambda p, t: pcd_bytes(p, "binary")),
    "pcd_ascii": (".pcd", lambda p, t: pcd_bytes(p, "ascii")),
    "pcd_compressed": (".pcd", lambda p, t: pcd_bytes(p, "binary_compressed")),
    "ply_le": (".ply", lambda p, t: ply_bytes(p)),
    "ply_be": (".ply", lambda p, t: ply_bytes(p, "binary_big_endian")),
    "ply_ascii": (".ply", lambda p, t: ply_bytes(p, "ascii")),
    "npy": (".npy", lambda p, t: npy_bytes(t, p)),
    "bin": (".bin", lambda p, t: np.ascontiguousarray(p, dtype="<f4").tobytes()),
}


@pytest.mark.parametrize("kind", sorted(VALID))
def test_every_format_reads_back_exactly(tmp_path, seed, kind):
    suffix, make = VALID[kind]
    points = points_of(seed)
    path = tmp_path / f"scan{suffix}"
    path.write_bytes(make(points, tmp_path))
    got = io.read_points(path)
    assert got.dtype == np.float32 and got.shape == points.shape
    assert np.array_equal(got, points)


def test_ply_faces_after_the_vertices_and_xyz_only_pcd(tmp_path, seed):
    points = points_of(seed, 20)
    for fmt in ("binary_little_endian", "ascii"):
        (tmp_path / "mesh.ply").write_bytes(ply_bytes(points, fmt, faces=3))
        assert np.array_equal(io.read_points(tmp_path / "mesh.ply"), points)
    (tmp_path / "xyz.pcd").write_bytes(pcd_bytes(points, fields=("x", "y", "z")))
    assert np.array_equal(io.read_points(tmp_path / "xyz.pcd"), points[:, :3])


def test_open3d_files_read_back(tmp_path, seed):
    """What open3d writes (binary, ascii and LZF-compressed PCD; PLY) reads back exactly."""
    o3d = pytest.importorskip("open3d")
    points = points_of(seed, 300)[:, :3].astype(np.float64)
    cloud = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(points))
    for name, kwargs in (("b.pcd", {}), ("a.pcd", dict(write_ascii=True)), ("c.pcd", dict(compressed=True)),
                         ("p.ply", {})):
        o3d.io.write_point_cloud(str(tmp_path / name), cloud, **kwargs)
        assert np.allclose(io.read_points(tmp_path / name), points, rtol=0, atol=1e-4), name


# --- truncated, misaligned, oversized ---------------------------------------------------------------
@pytest.mark.parametrize("kind", sorted(VALID))
def test_truncated_files_name_the_file(tmp_path, seed, kind):
    suffix, make = VALID[kind]
    data = make(points_of(seed), tmp_path)
    for cut in (1, 3, len(data) // 3, len(data) - 7):
        path = tmp_path / f"cut{cut}{suffix}"
        path.write_bytes(data[:-cut] if cut < len(data) else b"")
        with pytest.raises(ValueError) as raised:
            io.read_points(path)
        assert str(path) in str(raised.value), str(raised.value)


def test_misaligned_and_extra_data(tmp_path, seed):
    points = points_of(seed, 30)
    cases = {
        "extra.pcd": (pcd_bytes(points) + b"\x00" * 5, r"has 5 bytes after its 30 points"),
        "width.pcd": (pcd_bytes(points).replace(b"WIDTH 30", b"WIDTH 31"), r"WIDTH x HEIGHT \(31 x 1\) differs"),
        "fields.pcd": (pcd_bytes(points).replace(b"SIZE 4 4 4 4", b"SIZE 4 4 4"), r"must list as many entries"),
        "noz.pcd": (pcd_bytes(points, fields=("x", "y", "i")), r"has no 'z' field"),
        "type.pcd": (pcd_bytes(points).replace(b"TYPE F F F F", b"TYPE F F F Q"), r"unsupported TYPE Q"),
        "mode.pcd": (pcd_bytes(points).replace(b"DATA binary", b"DATA zip"), r"unsupported PCD DATA 'zip'"),
        "nodata.pcd": (pcd_bytes(points).split(b"DATA")[0], r"no 'DATA' header line"),
        "packed.pcd": (pcd_bytes(points, "binary_compressed")[:-10], r"is truncated: \d+ compressed bytes announced"),
        "unpacked.pcd": (pcd_bytes(points, "binary_compressed").replace(struct.pack("<I", 30 * 16), struct.pack(
            "<I", 30 * 16 + 4)), r"the uncompressed size 484 differs from 30 points of 16 bytes"),
        "extra.ply": (ply_bytes(points) + b"\x01\x02", r"the data is \d+ bytes but the header's elements take"),
        "keyword.ply": (ply_bytes(points).replace(b"comment test", b"bogus"), r"unknown keyword 'bogus'"),
        "novertex.ply": (ply_bytes(points).replace(b"element vertex", b"element point"), r"has no vertex element"),
        "list.ply": (ply_bytes(points).replace(b"property float intensity",
                                               b"property list uchar int intensity"), r"list properties"),
        "magic.ply": (b"PLY" + ply_bytes(points)[3:], r"is not a PLY file"),
        "ascii.ply": (ply_bytes(points, "ascii").replace(b"end_header\n", b"end_header\nx y z w\n"),
                      r"ascii data line 1 holds a value that is not a number"),
        "records.bin": (np.zeros(30 * 4 + 1, dtype="<f4").tobytes(), r"not a multiple of the 16-byte record"),
        "shape.npy": (npy_bytes(tmp_path, points[:, :2]), r"points are \[N, 3\+\]"),
        "object.npy": (object_npy(tmp_path), r"holds object values; point files hold plain numbers"),
        "header.npy": (npy_bytes(tmp_path, points)[:30], r"is not a valid \.npy file"),
        "long.npy": (npy_bytes(tmp_path, points) + b"\x00" * 4, r"longer than its header says"),
    }
    for name, (content, pattern) in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(ValueError, match=pattern) as raised:
            io.read_points(path)
        assert str(path) in str(raised.value), (name, str(raised.value))


def test_oversized_files_are_refused_before_reading(tmp_path, seed):
    points = points_of(seed, 40)
    header_only = {
        "huge.pcd": pcd_bytes(points[:0]).replace(b"WIDTH 0", b"WIDTH 99999999999").replace(
            b"POINTS 0", b"POINTS 99999999999"),
        "huge.ply": ply_bytes(points[:0]).replace(b"element vertex 0", b"element vertex 99999999999"),
        "huge.npy": npy_bytes(tmp_path, points)[:128].replace(b"(40, 4)", b"(99999999999, 4)"),
    }
    for name, content in header_only.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ValueError, match=r"holds 99999999999 records.*more than max_rows=67108864") as raised:
            io.read_points(tmp_path / name)
        assert str(tmp_path / name) in str(raised.value)
    (tmp_path / "scan.bin").write_bytes(points.tobytes())
    with pytest.raises(ValueError, match=r"holds 40 records \(640 bytes\), more than max_rows=39"):
        io.read_points(tmp_path / "scan.bin", max_rows=39)
    assert len(io.read_points(tmp_path / "scan.bin", max_rows=40)) == 40
    assert len(io.read_points(tmp_path / "scan.bin", max_rows=None)) == 40
    with pytest.raises(ValueError, match=r"max_rows must be a non-negative int or None"):
        io.read_points(tmp_path / "scan.bin", max_rows=-1)


# --- NaN / Inf rows ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["bin", "npy", "pcd_binary", "ply_le"])
def test_nonfinite_rows_are_dropped_with_a_count(tmp_path, seed, kind):
    suffix, make = VALID[kind]
    points = points_of(seed, 40)
    bad_rows = [3, 17, 18, 39]
    points[3, 0], points[17, 2], points[18, 1], points[39, 3] = np.nan, np.inf, -np.inf, np.nan
    path = tmp_path / f"scan{suffix}"
    path.write_bytes(make(points, tmp_path))
    with pytest.warns(io.NonFiniteWarning, match=rf"{path.name}': dropped 4 of 40 points holding NaN or Inf"):
        got = io.read_points(path)
    assert np.array_equal(got, np.delete(points, bad_rows, 0))
    with pytest.raises(ValueError, match=r"4 of 40 points hold NaN or Inf \(the first is row 3"):
        io.read_points(path, nonfinite="error")
    with pytest.raises(ValueError, match=r"nonfinite must be one of"):
        io.read_points(path, nonfinite="keep")


def test_datasets_drop_nonfinite_points_with_their_labels(tmp_path, seed):
    rng = np.random.default_rng(seed)
    points = points_of(seed, 60)
    points[5, 1], points[44, 0] = np.nan, np.inf
    scans = tmp_path / "kitti" / "sequences" / "08"
    (scans / "velodyne").mkdir(parents=True)
    (scans / "labels").mkdir()
    points.tofile(scans / "velodyne" / "000000.bin")
    raw = rng.choice([10, 40, 50, 70], 60).astype(np.uint32) | (rng.integers(0, 5, 60).astype(np.uint32) << 16)
    raw.tofile(scans / "labels" / "000000.label")
    ds = SemanticKITTI(tmp_path / "kitti", "val", voxel_size=0.5)
    with pytest.warns(io.NonFiniteWarning, match=r"dropped 2 of 60 points"):
        frame = ds.read_frame(0)
    keep = np.delete(np.arange(60), [5, 44])
    assert np.array_equal(frame["points"], points[keep])
    assert np.array_equal(frame["raw_labels"], (raw & 0xFFFF)[keep]) and len(frame["labels"]) == 58
    assert np.array_equal(frame["instances"], (raw >> 16)[keep])
    with pytest.warns(io.NonFiniteWarning):
        sample = ds[0]
    assert len(sample["point_targets"]) == 58

    root = tmp_path / "nusc"
    (root / "samples").mkdir(parents=True)
    (root / "lidarseg").mkdir()
    (root / "splits").mkdir()
    cloud = points_of(seed + 1, 30, columns=5)
    cloud[0, 2] = np.nan
    cloud.tofile(root / "samples" / "f.pcd.bin")
    rng.integers(0, 32, 30).astype(np.uint8).tofile(root / "lidarseg" / "f_lidarseg.bin")
    (root / "splits" / "s.txt").write_text("samples/f.pcd.bin lidarseg/f_lidarseg.bin\n")
    with pytest.warns(io.NonFiniteWarning, match=r"f\.pcd\.bin': dropped 1 of 30 points"):
        frame = NuScenesLidarSeg(root, "s").read_frame(0)
    assert np.array_equal(frame["points"], cloud[1:]) and len(frame["labels"]) == 29


# --- fuzzing ---------------------------------------------------------------------------------------
def mutate(data: bytes, ops) -> bytes:
    out = bytearray(data)
    for kind, pos, value in ops:
        if not out:
            break
        i = pos % len(out)
        if kind == "flip":
            out[i] ^= value or 1
        elif kind == "cut":
            del out[i:]
        elif kind == "insert":
            out[i:i] = bytes([value])
        else:  # duplicate a slice (repeated headers, longer data)
            out[i:i] = out[i:i + value]
    return bytes(out)


FUZZ_KINDS = sorted(VALID) + ["label"]
mutations = st.lists(st.tuples(st.sampled_from(["flip", "cut", "insert", "dup"]), st.integers(0, 1 << 20),
                               st.integers(0, 255)), min_size=1, max_size=4)


@settings(max_examples=1500, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(FUZZ_KINDS), ops=mutations, raw=st.one_of(st.none(), st.binary(max_size=300)),
       n=st.integers(0, 12), seed=st.integers(0, 2 ** 32 - 1))
def test_fuzzed_files_give_points_or_a_clear_error(tmp_path, kind, ops, raw, n, seed):
    """Every reader, on mutated valid files and on random bytes: whole finite float32 points, or
    ValueError naming the file. Nothing else (no crash, no other exception type)."""
    points = points_of(seed, n)
    if kind == "label":
        path = tmp_path / "fuzz.label"
        data = np.arange(n, dtype="<u4").tobytes()
    else:
        suffix, make = VALID[kind]
        path = tmp_path / f"fuzz{suffix}"
        data = make(points, tmp_path)
    path.write_bytes(raw if raw is not None else mutate(data, ops))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", io.NonFiniteWarning)
            if kind == "label":
                semantic, instances = read_labels(path)
                assert semantic.dtype == np.uint16 and semantic.shape == instances.shape
                return
            got = io.read_points(path, max_rows=1 << 16)
    except ValueError as err:
        assert str(path) in str(err), f"the message does not name the file: {err}"
        return
    assert got.dtype == np.float32 and got.ndim == 2 and got.shape[1] >= 3
    assert np.isfinite(got).all()
