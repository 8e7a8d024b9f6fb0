"""Choosing a backend: ConvConfig.backend / tile validation, the per-device default, the clear
errors when Triton cannot run (not installed; CPU tensors without TRITON_INTERPRET; the variable
changed after the kernels were defined; interpreter set for CUDA tensors), dtype support per
backend, the tuner's design space with backends and tiles, and that importing the library never
imports triton."""
import dataclasses
import subprocess
import sys

import pytest
import torch

import torchsparse_pp as tsp
from torchsparse_pp.nn.functional import ConvConfig, PassConfigs, conv3d
from torchsparse_pp.nn.functional import config as config_module
from torchsparse_pp.ops.triton import runtime
from torchsparse_pp.ops.triton.tiles import TILES, tiles_for
from torchsparse_pp.tune.space import config_from_dict, config_name, config_to_dict, design_space
from conftest import random_coords


def small_input(gen, dtype=torch.float32):
    coords = random_coords(gen, 60, batch=2, low=-3, high=4)
    return tsp.SparseTensor(torch.randn(len(coords), 3, generator=gen).to(dtype), coords)


# --------------------------------------------------------------------------------------------
# ConvConfig values
# --------------------------------------------------------------------------------------------
def test_backend_and_tile_values():
    assert ConvConfig().backend is None and ConvConfig().tile is None
    for dataflow in ("gather_scatter", "fetch_on_demand", "implicit_gemm"):
        for backend in ("native", "triton"):
            assert ConvConfig(dataflow, backend=backend).backend == backend
    tile = TILES[0].name
    assert ConvConfig("implicit_gemm", backend="triton", tile=tile, sorted=True, split_mask_num=3).tile == tile
    with pytest.raises(ValueError, match=r"unknown backend 'cuda'"):
        ConvConfig("fetch_on_demand", backend="cuda")
    with pytest.raises(ValueError, match=r"tile applies to backend='triton'"):
        ConvConfig("fetch_on_demand", tile=tile)  # the device default might be native: say it
    with pytest.raises(ValueError, match=r"tile applies to backend='triton'"):
        ConvConfig("fetch_on_demand", backend="native", tile=tile)
    with pytest.raises(ValueError, match=r"tile applies to .*dataflow='gather_scatter'"):
        ConvConfig("gather_scatter", backend="triton", tile=tile)
    with pytest.raises(ValueError, match=r"unknown Triton tile 'm7'"):
        ConvConfig("fetch_on_demand", backend="triton", tile="m7")


def test_every_mode_has_tiles_and_every_tile_a_mode():
    for mode in ("half", "tf32", "fp32", "fp64"):
        assert tiles_for(mode) and tiles_for(mode)[0].block_m == 32
    assert all(t.modes for t in TILES) and len({t.name for t in TILES}) == len(TILES)


# --------------------------------------------------------------------------------------------
# Resolution per device
# --------------------------------------------------------------------------------------------
def test_default_backend_per_device(monkeypatch):
    required = []
    monkeypatch.setattr(config_module.triton_runtime, "require", lambda device: required.append(device.type))
    cpu = config_module.resolve_configs(None, "cpu")
    assert {c.backend for c in cpu} == {"native"} and not required
    cuda = config_module.resolve_configs(PassConfigs(ConvConfig("fetch_on_demand"), ConvConfig("implicit_gemm"),
                                                     ConvConfig("gather_scatter")), "cuda")
    assert [c.backend for c in cuda] == ["triton"] * 3 and required == ["cuda"] * 3
    assert [c.dataflow for c in cuda] == ["fetch_on_demand", "implicit_gemm", "gather_scatter"]
    # An explicit backend is kept; the triton one is checked for runnability.
    mixed = config_module.resolve_configs((ConvConfig("fetch_on_demand", backend="triton"), ConvConfig(),
                                           ConvConfig()), "cpu")
    assert [c.backend for c in mixed] == ["triton", "native", "native"] and required[-1] == "cpu"


def test_triton_on_cpu_needs_the_interpreter(gen, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match=r"TRITON_INTERPRET=1"):
        conv3d(small_input(gen), torch.randn(27, 3, 2), 3, config=ConvConfig("fetch_on_demand", backend="triton"))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match=r"runs only under the Triton interpreter"):
        conv3d(small_input(gen), torch.randn(27, 3, 2), 3, config=ConvConfig("implicit_gemm", backend="triton"))


def test_triton_not_installed_is_named(gen, monkeypatch):
    monkeypatch.setattr(runtime, "installed", lambda: False)
    with pytest.raises(RuntimeError, match=r"needs the triton package: pip install 'torchsparse-pp\[triton\]'"):
        conv3d(small_input(gen), torch.randn(27, 3, 2), 3, config=ConvConfig("gather_scatter", backend="triton"))


def test_interpreter_state_must_not_change(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(runtime, "_defined_interpreted", False)
    with pytest.raises(RuntimeError, match=r"TRITON_INTERPRET changed after"):
        runtime.require(torch.device("cpu"))
    monkeypatch.setattr(runtime, "_defined_interpreted", None)
    runtime.require(torch.device("cpu"))  # nothing defined yet: fine


def test_interpreter_with_cuda_tensors_is_refused(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(runtime, "_defined_interpreted", None)
    with pytest.raises(RuntimeError, match=r"unset it for CUDA tensors"):
        runtime.require(torch.device("cuda"))
    with pytest.raises(RuntimeError, match=r"supports CUDA / ROCm tensors"):
        runtime.require(torch.device("meta"))


def test_dtypes_per_backend(gen):
    """float16 on the CPU: the native kernels compute it in float32 (rounded once to float16),
    the Triton ones take it as it is."""
    x = small_input(gen, torch.float16)
    w = torch.randn(27, 3, 2, generator=gen).half()
    native = conv3d(x, w, 3, config=ConvConfig("fetch_on_demand"))
    wide = conv3d(x.to(torch.float32), w.float(), 3, config=ConvConfig("fetch_on_demand"))
    assert native.F.dtype == torch.float16 and torch.equal(native.F, wide.F.half())
    y = conv3d(x, w, 3, config=ConvConfig("fetch_on_demand", backend="triton"))
    assert y.F.dtype == torch.float16 and y.F.shape == (x.num_points, 2)


def test_import_never_imports_triton():
    code = ("import sys, torchsparse_pp, torchsparse_pp.nn, torchsparse_pp.tune, torchsparse_pp.models, "
            "torchsparse_pp.nn.functional; print('triton' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --------------------------------------------------------------------------------------------
# The tuner's design space
# --------------------------------------------------------------------------------------------
def test_design_space_on_cuda_has_both_backends_and_every_tile(monkeypatch):
    monkeypatch.setitem(config_module.IMPLEMENTED, "cuda", config_module.CUDA_DATAFLOWS)
    monkeypatch.setattr(runtime, "installed", lambda: True)
    space = design_space("cuda")
    assert {c.backend for c in space} == {"native", "triton"}
    native = [c for c in space if c.backend == "native"]
    triton = [c for c in space if c.backend == "triton"]
    assert {c.dataflow for c in native} == set(config_module.CUDA_DATAFLOWS)
    assert {c.dataflow for c in triton} == {"gather_scatter", "fetch_on_demand", "implicit_gemm"}
    assert {c.tile for c in triton if c.dataflow == "fetch_on_demand"} == {t.name for t in TILES}
    assert {(c.split_mask_num, c.tile) for c in triton if c.dataflow == "implicit_gemm"} == \
        {(s, t.name) for s in range(5) for t in TILES}
    names = [config_name(c) for c in space]
    assert len(set(names)) == len(names) == len(space)
    assert f"triton:fetch_on_demand(tile={TILES[0].name})" in names
    for c in space:
        assert config_from_dict(config_to_dict(c), "test") == c
    fp32 = design_space("cuda", tile_mode="fp32")
    assert {c.tile for c in fp32 if c.tile} == {t.name for t in tiles_for("fp32")}
    compact = design_space("cuda", "compact")
    assert {(c.backend, c.dataflow) for c in compact} == \
        {("native", "gather_scatter"), ("native", "implicit_gemm"), ("triton", "gather_scatter"),
         ("triton", "fetch_on_demand"), ("triton", "implicit_gemm")}
    monkeypatch.setattr(runtime, "installed", lambda: False)
    assert {c.backend for c in design_space("cuda")} == {"native"}


def test_cpu_tuned_files_without_backend_still_load():
    """Tuned files written before backends existed name no backend: the device default."""
    cfg = config_from_dict({"dataflow": "implicit_gemm", "sorted": True, "split_mask_num": 2}, "old file")
    assert cfg.backend is None and dataclasses.replace(cfg, backend="native") in design_space("cpu")


def test_config_resolution_is_marked_constant_as_torch_marks_it():
    # config.py marks its trace-time resolution by hand (importing torch._dynamo would import triton);
    # this fails if torch changes how assume_constant_result marks a function.
    from torchsparse_pp.nn.functional import config

    def probe():
        return 0
    marked = torch.compiler.assume_constant_result(probe)
    assert vars(marked) == {"_dynamo_marked_constant": True}
    assert config._resolve_with_text_at_trace_time._dynamo_marked_constant is True
