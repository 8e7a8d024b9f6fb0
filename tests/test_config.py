"""ConvConfig / PassConfigs values, the global default, per-conv configs, per-pass dispatch,
backends.deterministic and device resolution.

Which dataflow ran is observed, not timed: DATAFLOW_MODULES entries are replaced by wrappers
that record every pass they serve and then call the real dataflow.
"""
import dataclasses
import types

import pytest
import torch

import torchsparse_pp as tsp
from torchsparse_pp import backends
from torchsparse_pp.nn import Conv3d
from torchsparse_pp.nn.functional import (DATAFLOWS, ConvConfig, PassConfigs, conv3d, default_config,
                                          get_default_config, set_default_config)
from torchsparse_pp.nn.functional import config as config_module
from torchsparse_pp.nn.functional import dataflows
from conftest import random_coords

GS = ConvConfig("gather_scatter")
GS_GROUPED = ConvConfig("gather_scatter", epsilon=0.5, mm_thresh=50)
FOD = ConvConfig("fetch_on_demand")
IG = ConvConfig("implicit_gemm")
IG_SORTED2 = ConvConfig("implicit_gemm", sorted=True, split_mask_num=2)
MIXED = PassConfigs(IG_SORTED2, FOD, GS_GROUPED)
CPU_DEFAULT = config_module.DEVICE_DEFAULTS["cpu"]


def native(cfg):
    """The config as a CPU conv resolves it: the device's default backend filled in."""
    if isinstance(cfg, PassConfigs):
        return PassConfigs(*(native(c) for c in cfg))
    return dataclasses.replace(cfg, backend="native")


def short(cfg) -> str:
    """A short test id for a config."""
    if isinstance(cfg, PassConfigs):
        return "+".join(short(c) for c in cfg)
    params = {"gather_scatter": ("epsilon", "mm_thresh"), "implicit_gemm": ("sorted", "split_mask_num")}
    values = [str(getattr(cfg, p)) for p in params.get(cfg.dataflow, ())]
    return "-".join([cfg.dataflow] + values)


@pytest.fixture(autouse=True)
def clean_global_state():
    """Every test starts from and leaves the library defaults: no global config, flag off."""
    set_default_config(None)
    flag = backends.deterministic
    try:
        yield
    finally:
        set_default_config(None)
        backends.deterministic = flag


# --------------------------------------------------------------------------------------------
# ConvConfig values
# --------------------------------------------------------------------------------------------
def test_default_is_gather_scatter_one_gemm_per_offset():
    cfg = ConvConfig()
    assert (cfg.dataflow, cfg.epsilon, cfg.mm_thresh, cfg.sorted, cfg.split_mask_num) == \
        ("gather_scatter", 0.0, 0, None, None)
    assert DATAFLOWS == ("gather_scatter", "fetch_on_demand", "implicit_gemm")


@pytest.mark.parametrize("kwargs, expected", [
    (dict(dataflow="gather_scatter"), dict(epsilon=0.0, mm_thresh=0, sorted=None, split_mask_num=None)),
    (dict(dataflow="gather_scatter", epsilon=0.3), dict(epsilon=0.3, mm_thresh=0)),
    (dict(dataflow="gather_scatter", mm_thresh=64), dict(epsilon=0.0, mm_thresh=64)),
    (dict(dataflow="gather_scatter", epsilon=1), dict(epsilon=1.0, mm_thresh=0)),
    (dict(dataflow="fetch_on_demand"), dict(epsilon=None, mm_thresh=None, sorted=None, split_mask_num=None)),
    (dict(dataflow="implicit_gemm"), dict(sorted=False, split_mask_num=0, epsilon=None, mm_thresh=None)),
    (dict(dataflow="implicit_gemm", sorted=False), dict(sorted=False, split_mask_num=0)),
    (dict(dataflow="implicit_gemm", sorted=True), dict(sorted=True, split_mask_num=1)),
    (dict(dataflow="implicit_gemm", split_mask_num=0), dict(sorted=False, split_mask_num=0)),
    (dict(dataflow="implicit_gemm", split_mask_num=3), dict(sorted=True, split_mask_num=3)),
    (dict(dataflow="implicit_gemm", sorted=True, split_mask_num=4), dict(sorted=True, split_mask_num=4)),
], ids=str)
def test_defaults_per_dataflow(kwargs, expected):
    cfg = ConvConfig(**kwargs)
    for name, value in expected.items():
        got = getattr(cfg, name)
        assert got == value and type(got) is type(value), f"{name}: {got!r} != {value!r}"


def test_positional_dataflow():
    assert ConvConfig("implicit_gemm", True, 2) == ConvConfig("implicit_gemm", sorted=True, split_mask_num=2)


@pytest.mark.parametrize("cfg", [GS, GS_GROUPED, FOD, IG, IG_SORTED2], ids=short)
def test_frozen(cfg):
    for name, value in [("dataflow", "fetch_on_demand"), ("epsilon", 0.9), ("mm_thresh", 3),
                        ("sorted", True), ("split_mask_num", 2)]:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(cfg, name, value)
    with pytest.raises(dataclasses.FrozenInstanceError):
        MIXED.forward = FOD


def test_equality_and_hash_follow_normalised_values():
    # Equal after defaults are filled in, whatever was spelled out.
    assert ConvConfig() == ConvConfig("gather_scatter", epsilon=0.0, mm_thresh=0) == ConvConfig(epsilon=0)
    assert ConvConfig("implicit_gemm", sorted=True) == ConvConfig("implicit_gemm", split_mask_num=1)
    assert ConvConfig("implicit_gemm") == ConvConfig("implicit_gemm", sorted=False, split_mask_num=0)
    assert hash(ConvConfig("implicit_gemm", sorted=True)) == hash(ConvConfig("implicit_gemm", split_mask_num=1))
    assert hash(ConvConfig(epsilon=0)) == hash(ConvConfig())
    assert ConvConfig("implicit_gemm", split_mask_num=2) != ConvConfig("implicit_gemm", split_mask_num=3)
    assert ConvConfig(epsilon=0.2) != ConvConfig(epsilon=0.2, mm_thresh=1)
    assert FOD != GS and GS != IG

    table = {ConvConfig(): "a", ConvConfig("implicit_gemm", sorted=True): "b", FOD: "c"}
    assert table[ConvConfig("gather_scatter", epsilon=0.0)] == "a"
    assert table[ConvConfig("implicit_gemm", split_mask_num=1)] == "b"
    assert table[ConvConfig("fetch_on_demand")] == "c"
    assert len({ConvConfig(), ConvConfig(mm_thresh=0), ConvConfig(epsilon=0.0)}) == 1

    passes = {MIXED: 1, PassConfigs.of(GS): 2}
    assert passes[PassConfigs(IG_SORTED2, FOD, GS_GROUPED)] == 1
    assert passes[PassConfigs(ConvConfig(), ConvConfig(), ConvConfig())] == 2


# --------------------------------------------------------------------------------------------
# Invalid configs
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, message", [
    (dict(dataflow="winograd"), r"unknown dataflow 'winograd'; expected one of"),
    (dict(dataflow="Gather_Scatter"), r"unknown dataflow 'Gather_Scatter'"),
    (dict(dataflow=None), r"unknown dataflow None"),
    (dict(dataflow="fetch_on_demand", epsilon=0.1), r"epsilon does not apply to the fetch_on_demand dataflow"),
    (dict(dataflow="fetch_on_demand", mm_thresh=10), r"mm_thresh does not apply to the fetch_on_demand dataflow"),
    (dict(dataflow="fetch_on_demand", sorted=False), r"sorted does not apply to the fetch_on_demand dataflow"),
    (dict(dataflow="fetch_on_demand", split_mask_num=0), r"split_mask_num does not apply to the fetch_on_demand"),
    (dict(dataflow="implicit_gemm", epsilon=0.0), r"epsilon does not apply to the implicit_gemm dataflow"),
    (dict(dataflow="implicit_gemm", mm_thresh=0), r"mm_thresh does not apply to the implicit_gemm dataflow"),
    (dict(dataflow="gather_scatter", sorted=True), r"sorted does not apply to the gather_scatter dataflow"),
    (dict(dataflow="gather_scatter", split_mask_num=2), r"split_mask_num does not apply to the gather_scatter"),
    (dict(dataflow="implicit_gemm", sorted=True, split_mask_num=0),
     r"sorted=True needs split_mask_num >= 1, got 0"),
    (dict(dataflow="implicit_gemm", sorted=False, split_mask_num=2),
     r"sorted=False needs split_mask_num = 0, got 2"),
    (dict(dataflow="implicit_gemm", split_mask_num=-1), r"split_mask_num must be an int >= 0, got -1"),
    (dict(dataflow="implicit_gemm", sorted=True, split_mask_num=-2), r"split_mask_num must be an int >= 0"),
    (dict(dataflow="implicit_gemm", split_mask_num=1.5), r"split_mask_num must be an int >= 0, got 1.5"),
    (dict(dataflow="implicit_gemm", split_mask_num=2.0), r"split_mask_num must be an int >= 0, got 2.0"),
    (dict(dataflow="implicit_gemm", split_mask_num=True), r"split_mask_num must be an int >= 0, got True"),
    (dict(dataflow="implicit_gemm", sorted=1), r"sorted must be a bool, got 1"),
    (dict(dataflow="implicit_gemm", sorted="yes", split_mask_num=1), r"sorted must be a bool, got 'yes'"),
    (dict(epsilon=-0.1), r"epsilon must be in \[0, 1\], got -0.1"),
    (dict(epsilon=1.5), r"epsilon must be in \[0, 1\], got 1.5"),
    (dict(epsilon=float("nan")), r"epsilon must be in \[0, 1\], got nan"),
    (dict(epsilon=float("inf")), r"epsilon must be in \[0, 1\], got inf"),
    (dict(mm_thresh=-1), r"mm_thresh must be an int >= 0, got -1"),
    (dict(mm_thresh=10.0), r"mm_thresh must be an int >= 0, got 10.0"),
    (dict(mm_thresh=2.5), r"mm_thresh must be an int >= 0, got 2.5"),
    (dict(mm_thresh=True), r"mm_thresh must be an int >= 0, got True"),
    (dict(mm_thresh="50"), r"mm_thresh must be an int >= 0, got '50'"),
], ids=str)
def test_invalid_config_raises_value_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ConvConfig(**kwargs)


def test_parameter_error_names_the_dataflows_parameters():
    with pytest.raises(ValueError, match=r"its parameters: none"):
        ConvConfig("fetch_on_demand", epsilon=0.5)
    with pytest.raises(ValueError, match=r"its parameters: sorted, split_mask_num"):
        ConvConfig("implicit_gemm", mm_thresh=5)
    with pytest.raises(ValueError, match=r"its parameters: epsilon, mm_thresh"):
        ConvConfig("gather_scatter", sorted=False)


# --------------------------------------------------------------------------------------------
# PassConfigs and the forms a conv accepts
# --------------------------------------------------------------------------------------------
def test_pass_configs_of():
    p = PassConfigs.of(IG_SORTED2)
    assert isinstance(p, PassConfigs)
    assert p.forward == p.dgrad == p.wgrad == IG_SORTED2
    assert PassConfigs.of(MIXED) is MIXED
    t = PassConfigs.of((IG_SORTED2, FOD, GS_GROUPED))
    assert t == MIXED and (t.forward, t.dgrad, t.wgrad) == (IG_SORTED2, FOD, GS_GROUPED)
    assert tuple(MIXED) == (IG_SORTED2, FOD, GS_GROUPED)  # iterates forward, dgrad, wgrad
    with pytest.raises(TypeError, match=r"PassConfigs.dgrad must be a ConvConfig, got str"):
        PassConfigs(GS, "fetch_on_demand", GS)
    with pytest.raises(TypeError, match=r"PassConfigs.forward must be a ConvConfig"):
        PassConfigs.of((None, GS, GS))


BAD_CONFIGS = ["gather_scatter", {"dataflow": "gather_scatter"}, (GS, FOD), (GS,), (GS, FOD, IG, GS), 3,
               ConvConfig, "fetch_on_demand"]
BAD_IDS = ["str", "dict", "2-tuple", "1-tuple", "4-tuple", "int", "class", "str2"]


@pytest.mark.parametrize("bad", BAD_CONFIGS, ids=BAD_IDS)
def test_wrong_config_type_raises_type_error(bad, gen):
    with pytest.raises(TypeError, match=r"a conv config must be a ConvConfig, a PassConfigs or a "
                                        r"\(forward, dgrad, wgrad\) tuple"):
        PassConfigs.of(bad)
    with pytest.raises(TypeError, match=r"a conv config must be a ConvConfig"):
        Conv3d(2, 3, 3, config=bad)
    conv = Conv3d(2, 3, 3, config=FOD)
    with pytest.raises(TypeError, match=r"a conv config must be a ConvConfig"):
        conv.config = bad
    assert conv.config == PassConfigs.of(FOD)  # a rejected value leaves the old one
    x = small_input(gen, 2)
    with pytest.raises(TypeError, match=r"a conv config must be a ConvConfig"):
        conv3d(x, torch.randn(27, 2, 3), 3, config=bad)
    with pytest.raises(TypeError):
        set_default_config(bad)
    with pytest.raises(TypeError):
        with default_config(bad):
            pass
    assert get_default_config() == CPU_DEFAULT


def test_three_tuple_of_non_configs_raises_type_error(gen):
    x = small_input(gen, 2)
    for bad in [("gather_scatter",) * 3, (GS, FOD, {"dataflow": "implicit_gemm"})]:
        with pytest.raises(TypeError, match=r"must be a ConvConfig"):
            conv3d(x, torch.randn(27, 2, 3), 3, config=bad)
        with pytest.raises(TypeError, match=r"must be a ConvConfig"):
            Conv3d(2, 3, 3, config=bad)


@pytest.mark.parametrize("form", ["ConvConfig", "PassConfigs", "tuple"])
def test_conv3d_module_config_forms(form):
    value = {"ConvConfig": IG_SORTED2, "PassConfigs": MIXED, "tuple": (IG_SORTED2, FOD, GS_GROUPED)}[form]
    expected = PassConfigs.of(IG_SORTED2) if form == "ConvConfig" else MIXED
    conv = Conv3d(2, 3, 3, config=value)
    assert isinstance(conv.config, PassConfigs) and conv.config == expected
    other = Conv3d(2, 3, 3)
    assert other.config is None
    other.config = value
    assert isinstance(other.config, PassConfigs) and other.config == expected
    other.config = None
    assert other.config is None
    assert "config=" in repr(conv) and "config=" not in repr(other)


# --------------------------------------------------------------------------------------------
# Recording which dataflow serves which pass
# --------------------------------------------------------------------------------------------
def small_input(gen, channels=4) -> tsp.SparseTensor:
    coords = random_coords(gen, 120, batch=2, low=-3, high=4)
    return tsp.SparseTensor(torch.randn(len(coords), channels, generator=gen), coords)


@pytest.fixture
def calls(monkeypatch):
    """Wraps every DATAFLOW_MODULES entry's ``run`` (what the sparse_conv op calls for each pass);
    returns the list of (dataflow, pass, config, deterministic)."""
    log = []

    def wrap(name, module):
        def recorded(pass_name, a, b, tensors, num_src, num_dst, config, deterministic, allow_tf32):
            log.append((name, pass_name, config, deterministic))
            return module.run(pass_name, a, b, tensors, num_src, num_dst, config, deterministic, allow_tf32)
        return recorded

    for name, module in list(dataflows.DATAFLOW_MODULES.items()):
        wrapper = types.SimpleNamespace(operands=module.operands, run=wrap(name, module))
        monkeypatch.setitem(dataflows.DATAFLOW_MODULES, name, wrapper)
    return log


def forward_backward(gen, config=None, module=False, feats_grad=True, weight_grad=True, x=None):
    """One k3 submanifold conv (functional or Conv3d) with backward; returns the output."""
    x = small_input(gen) if x is None else x
    feats = x.F.detach().clone().requires_grad_(feats_grad)
    x = x.replace_feats(feats)
    if module:
        conv = Conv3d(4, 5, 3) if config == "unset" else Conv3d(4, 5, 3, config=config)
        conv.kernel.requires_grad_(weight_grad)
        y = conv(x)
    else:
        w = torch.randn(27, 4, 5, generator=gen).requires_grad_(weight_grad)
        y = conv3d(x, w, 3, config=config)
    if feats_grad or weight_grad:
        y.F.sum().backward()
    return y


def ran(calls) -> dict:
    """pass -> (dataflow, config) of each recorded call, checking each pass ran at most once and
    on the CPU's default backend (which resolution fills in; stripped so configs compare as given)."""
    passes = [c[1] for c in calls]
    assert len(passes) == len(set(passes)), f"a pass ran twice: {calls}"
    assert all(cfg.backend == "native" for _, _, cfg, _ in calls), calls
    return {p: (name, dataclasses.replace(cfg, backend=None)) for name, p, cfg, _ in calls}


@pytest.mark.parametrize("module", [False, True], ids=["conv3d", "Conv3d"])
@pytest.mark.parametrize("config", [GS, GS_GROUPED, FOD, IG, IG_SORTED2], ids=short)
def test_conv_runs_its_configured_dataflow(config, module, calls, gen):
    forward_backward(gen, config, module)
    assert ran(calls) == {p: (config.dataflow, config) for p in ("forward", "dgrad", "wgrad")}


@pytest.mark.parametrize("module", [False, True], ids=["conv3d", "Conv3d"])
@pytest.mark.parametrize("form", ["PassConfigs", "tuple"])
def test_mixed_per_pass_config_runs_each_pass_with_its_own_dataflow(form, module, calls, gen):
    config = MIXED if form == "PassConfigs" else (IG_SORTED2, FOD, GS_GROUPED)
    forward_backward(gen, config, module)
    assert ran(calls) == {"forward": ("implicit_gemm", IG_SORTED2), "dgrad": ("fetch_on_demand", FOD),
                          "wgrad": ("gather_scatter", GS_GROUPED)}


def test_every_pass_assignment_of_dataflows(calls, gen):
    """All 27 (forward, dgrad, wgrad) dataflow choices reach the right modules, and agree."""
    x = small_input(gen)
    w = torch.randn(27, 4, 5, generator=gen, dtype=torch.float64)
    x = x.double()
    grad = torch.randn(x.num_points, 5, generator=gen, dtype=torch.float64)
    reference = None
    for f in (GS_GROUPED, FOD, IG_SORTED2):
        for d in (GS, FOD, IG):
            for g in (GS_GROUPED, FOD, IG):
                calls.clear()
                feats = x.F.clone().requires_grad_(True)
                weight = w.clone().requires_grad_(True)
                y = conv3d(x.replace_feats(feats), weight, 3, config=(f, d, g))
                y.F.backward(grad)
                assert ran(calls) == {"forward": (f.dataflow, f), "dgrad": (d.dataflow, d), "wgrad": (g.dataflow, g)}
                result = (y.F.detach(), feats.grad, weight.grad)
                if reference is None:
                    reference = result
                for a, b in zip(result, reference):
                    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_only_needed_passes_run(calls, gen):
    forward_backward(gen, MIXED, feats_grad=False, weight_grad=True)
    assert set(ran(calls)) == {"forward", "wgrad"}
    calls.clear()
    forward_backward(gen, MIXED, feats_grad=True, weight_grad=False)
    assert set(ran(calls)) == {"forward", "dgrad"}
    calls.clear()
    with torch.no_grad():
        forward_backward(gen, MIXED, feats_grad=False, weight_grad=False)
    assert set(ran(calls)) == {"forward"}


@pytest.mark.parametrize("kind", ["transposed", "strided"])
def test_strided_and_transposed_convs_dispatch_per_pass(kind, calls, gen):
    x = small_input(gen)
    w_down = torch.randn(8, 4, 4, generator=gen)
    if kind == "strided":
        w = w_down.requires_grad_(True)
        feats = x.F.clone().requires_grad_(True)
        y = conv3d(x.replace_feats(feats), w, 2, stride=2, config=MIXED)
    else:
        coarse = conv3d(x, w_down, 2, stride=2, config=GS)
        calls.clear()
        feats = coarse.F.detach().clone().requires_grad_(True)
        w = torch.randn(8, 4, 4, generator=gen).requires_grad_(True)
        y = conv3d(coarse.replace_feats(feats), w, 2, stride=2, transposed=True, config=MIXED)
    y.F.sum().backward()
    assert ran(calls) == {"forward": ("implicit_gemm", IG_SORTED2), "dgrad": ("fetch_on_demand", FOD),
                          "wgrad": ("gather_scatter", GS_GROUPED)}


# --------------------------------------------------------------------------------------------
# The global default
# --------------------------------------------------------------------------------------------
def test_get_default_config_starts_at_the_device_defaults():
    assert get_default_config() == CPU_DEFAULT == get_default_config("cpu")
    assert CPU_DEFAULT == PassConfigs.of(ConvConfig("fetch_on_demand"))  # the CPU benchmarks' choice
    assert get_default_config("cuda") == config_module.DEVICE_DEFAULTS["cuda"]
    assert isinstance(get_default_config(), PassConfigs)


@pytest.mark.parametrize("form", ["ConvConfig", "PassConfigs", "tuple"])
def test_set_default_config_forms_and_reset(form):
    value = {"ConvConfig": FOD, "PassConfigs": MIXED, "tuple": (IG_SORTED2, FOD, GS_GROUPED)}[form]
    set_default_config(value)
    assert get_default_config() == PassConfigs.of(value)
    assert isinstance(get_default_config(), PassConfigs)
    set_default_config(None)
    assert get_default_config() == CPU_DEFAULT


def test_default_config_context_manager_restores_and_nests():
    set_default_config(FOD)
    with default_config(IG) as entered:
        assert entered is None
        assert get_default_config() == PassConfigs.of(IG)
        with default_config(MIXED):
            assert get_default_config() == MIXED
            with default_config((GS, GS, FOD)):
                assert get_default_config() == PassConfigs(GS, GS, FOD)
            assert get_default_config() == MIXED
        assert get_default_config() == PassConfigs.of(IG)
    assert get_default_config() == PassConfigs.of(FOD)


def test_default_config_context_manager_restores_on_exception():
    with pytest.raises(RuntimeError, match="boom"):
        with default_config(IG_SORTED2):
            with default_config(FOD):
                raise RuntimeError("boom")
    assert get_default_config() == CPU_DEFAULT
    with pytest.raises(KeyError):
        with default_config(MIXED):
            {}["missing"]
    assert get_default_config() == CPU_DEFAULT


@pytest.mark.parametrize("module", [False, True], ids=["conv3d", "Conv3d"])
def test_conv_without_config_follows_global_default(module, calls, gen):
    unset = "unset" if module else None
    forward_backward(gen, unset, module)
    assert {name for name, *_ in calls} == {"fetch_on_demand"}
    assert all(cfg == ConvConfig("fetch_on_demand", backend="native") for _, _, cfg, _ in calls)

    calls.clear()
    set_default_config(FOD)
    forward_backward(gen, unset, module)
    assert ran(calls) == {p: ("fetch_on_demand", FOD) for p in ("forward", "dgrad", "wgrad")}

    calls.clear()
    with default_config(MIXED):
        forward_backward(gen, unset, module)
    assert ran(calls) == {"forward": ("implicit_gemm", IG_SORTED2), "dgrad": ("fetch_on_demand", FOD),
                          "wgrad": ("gather_scatter", GS_GROUPED)}

    calls.clear()  # back to the value set before the block
    forward_backward(gen, unset, module)
    assert ran(calls) == {p: ("fetch_on_demand", FOD) for p in ("forward", "dgrad", "wgrad")}

    calls.clear()
    set_default_config(None)  # back to the device's default
    forward_backward(gen, unset, module)
    assert ran(calls) == {p: ("fetch_on_demand", FOD) for p in ("forward", "dgrad", "wgrad")}


@pytest.mark.parametrize("module", [False, True], ids=["conv3d", "Conv3d"])
def test_own_config_wins_over_global_default(module, calls, gen):
    with default_config(FOD):
        forward_backward(gen, IG_SORTED2, module)
        assert ran(calls) == {p: ("implicit_gemm", IG_SORTED2) for p in ("forward", "dgrad", "wgrad")}
        calls.clear()
        forward_backward(gen, MIXED, module)
        assert ran(calls)["forward"] == ("implicit_gemm", IG_SORTED2)
        assert ran(calls)["wgrad"] == ("gather_scatter", GS_GROUPED)
    # An explicit ConvConfig() is a config of its own too: it does not follow the default.
    calls.clear()
    with default_config(FOD):
        forward_backward(gen, ConvConfig(), module)
    assert {name for name, *_ in calls} == {"gather_scatter"}


def test_module_config_none_restores_the_default(calls, gen):
    x = small_input(gen)
    conv = Conv3d(4, 5, 3, config=IG)
    with default_config(GS):
        conv(x).F.sum().backward()
        assert {name for name, *_ in calls} == {"implicit_gemm"}
        calls.clear()
        conv.config = None
        conv(x).F.sum().backward()
        assert {name for name, *_ in calls} == {"gather_scatter"}
    calls.clear()
    conv(x).F.sum().backward()
    assert {name for name, *_ in calls} == {"fetch_on_demand"}  # the CPU's default


def test_backward_uses_configs_resolved_at_forward_time(calls, gen):
    """The passes of one conv call keep the configs resolved in its forward, even when the
    global default changes before backward runs."""
    x = small_input(gen)
    w = torch.randn(27, 4, 5, generator=gen).requires_grad_(True)
    feats = x.F.clone().requires_grad_(True)
    with default_config(MIXED):
        y = conv3d(x.replace_feats(feats), w, 3)
    set_default_config(IG)
    y.F.sum().backward()
    assert ran(calls) == {"forward": ("implicit_gemm", IG_SORTED2), "dgrad": ("fetch_on_demand", FOD),
                          "wgrad": ("gather_scatter", GS_GROUPED)}


def test_pointwise_conv_needs_no_dataflow(calls, gen):
    """A 1x1x1 stride-1 conv is one dense GEMM, whatever the config says."""
    x = small_input(gen)
    y = conv3d(x, torch.randn(1, 4, 5, generator=gen), 1, config=MIXED)
    assert calls == [] and y.F.shape == (x.num_points, 5)


# --------------------------------------------------------------------------------------------
# backends.deterministic
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [1, 0, "True", None, 1.0, torch.tensor(True)], ids=repr)
def test_deterministic_rejects_non_bool(bad):
    backends.deterministic = True
    with pytest.raises(TypeError, match=r"torchsparse_pp.backends.deterministic must be a bool"):
        backends.deterministic = bad
    assert backends.deterministic is True  # unchanged by the rejected value
    backends.deterministic = False
    assert backends.deterministic is False


def test_deterministic_default_is_false():
    import subprocess
    import sys
    code = "import torchsparse_pp.backends as b; print(b.deterministic)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("config", [GS_GROUPED, FOD, IG_SORTED2, MIXED], ids=short)
def test_deterministic_is_read_at_call_time(config, calls, gen):
    x = small_input(gen)
    for flag in (True, False, True):
        calls.clear()
        backends.deterministic = flag
        forward_backward(gen, config, x=x)
        assert [c[3] for c in calls] == [flag] * 3, calls
    # Backward keeps the value its forward saw, even if the flag changes in between.
    calls.clear()
    backends.deterministic = True
    w = torch.randn(27, 4, 5, generator=gen).requires_grad_(True)
    feats = x.F.clone().requires_grad_(True)
    y = conv3d(x.replace_feats(feats), w, 3, config=config)
    backends.deterministic = False
    y.F.sum().backward()
    assert [c[3] for c in calls] == [True] * 3


def test_deterministic_reaches_gather_scatter_kernels(monkeypatch, gen):
    """The flag reaches the compiled gather_scatter ops (it selects their code path)."""
    from torchsparse_pp import ops
    seen = []
    real_forward, real_wgrad = ops.gather_scatter_forward, ops.gather_scatter_wgrad

    def forward(*args):
        seen.append(("forward", args[-1]))
        return real_forward(*args)

    def wgrad(*args):
        seen.append(("wgrad", args[-1]))
        return real_wgrad(*args)

    monkeypatch.setattr(ops, "gather_scatter_forward", forward)
    monkeypatch.setattr(ops, "gather_scatter_wgrad", wgrad)
    for flag in (False, True):
        seen.clear()
        backends.deterministic = flag
        forward_backward(gen, GS_GROUPED)
        assert seen == [("forward", flag), ("forward", flag), ("wgrad", flag)]


# --------------------------------------------------------------------------------------------
# Resolution per device
# --------------------------------------------------------------------------------------------
def test_resolve_configs_on_cpu():
    resolve = config_module.resolve_configs
    assert resolve(FOD, "cpu") == native(PassConfigs.of(FOD))
    assert resolve(MIXED, "cpu") == native(MIXED)
    assert resolve(None, "cpu") == native(CPU_DEFAULT)
    with default_config(IG):
        assert resolve(None, "cpu") == native(PassConfigs.of(IG))
        assert resolve(FOD, "cpu") == native(PassConfigs.of(FOD))
    with pytest.raises(TypeError):
        resolve("gather_scatter", "cpu")


def on_native(cfg):
    if isinstance(cfg, PassConfigs):
        return PassConfigs(*(on_native(c) for c in cfg))
    return dataclasses.replace(cfg, backend="native")


@pytest.mark.parametrize("config", [GS, GS_GROUPED, FOD, IG, IG_SORTED2], ids=short)
def test_resolve_native_configs_on_cuda_without_cuda_build_raises(config, monkeypatch):
    monkeypatch.delitem(config_module.IMPLEMENTED, "cuda", raising=False)
    with pytest.raises(NotImplementedError, match=rf"dataflow '{config.dataflow}' \(forward pass\) is not "
                                                  r"implemented on cuda with the native backend"):
        config_module.resolve_configs(on_native(config), "cuda")


def test_resolve_native_configs_on_cuda_names_the_failing_pass(monkeypatch):
    monkeypatch.delitem(config_module.IMPLEMENTED, "cuda", raising=False)
    with pytest.raises(NotImplementedError, match=r"dataflow 'implicit_gemm' \(forward pass\).*cuda"):
        config_module.resolve_configs(on_native(MIXED), "cuda")
    with default_config(on_native(GS)):
        with pytest.raises(NotImplementedError, match=r"dataflow 'gather_scatter' \(forward pass\)"):
            config_module.resolve_configs(None, "cuda")  # the global default is checked too
    # With some dataflows available the message names the first pass that has none.
    monkeypatch.setitem(config_module.IMPLEMENTED, "cuda", ("implicit_gemm",))
    with pytest.raises(NotImplementedError,
                       match=r"dataflow 'fetch_on_demand' \(dgrad pass\) is not implemented on cuda with the "
                             r"native backend; available there: implicit_gemm"):
        config_module.resolve_configs(on_native(MIXED), "cuda")
    with pytest.raises(NotImplementedError, match=r"dataflow 'gather_scatter' \(wgrad pass\)"):
        config_module.resolve_configs(on_native(PassConfigs(IG, IG_SORTED2, GS)), "cuda")
    sorted2 = on_native(PassConfigs.of(IG_SORTED2))
    assert config_module.resolve_configs(sorted2, "cuda") == sorted2


def test_resolve_configs_on_unknown_device():
    with pytest.raises(NotImplementedError, match=r"has no native mps kernels in this build"):
        config_module.resolve_configs(GS, "mps")
