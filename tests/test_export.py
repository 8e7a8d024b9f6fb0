"""torch.export of an eval MinkUNet (inputs: feats, coords): the program equals eager, before
and after torch.export.save / torch.export.load in a fresh Python process; docs/compile.md's
examples run as written."""
import copy
import os
import re
import subprocess
import sys
import textwrap

import torch

import torchsparse_pp as tsp
from torchsparse_pp.models import MinkUNet
from conftest import fresh_seed, random_coords
from model_helpers import randomise_norms
from precision import assert_as_accurate_as_plain

DOCS = os.path.join(os.path.dirname(__file__), os.pardir, "docs", "compile.md")
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))


class OnTensors(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, feats, coords):
        return self.model(tsp.SparseTensor(feats, coords))


def scan(gen, points):
    coords = random_coords(gen, points, batch=2, low=-8, high=8)
    return torch.randn(len(coords), 4, generator=gen), coords


def fresh_python(code: str, cwd) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_exported_minkunet_equals_eager_and_loads_in_a_fresh_process(tmp_path):
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = MinkUNet(in_channels=4, num_classes=5, cr=0.125).eval()
    randomise_norms(model, gen)
    feats, coords = scan(gen, 500)
    points = torch.export.Dim("points", min=2)
    program = torch.export.export(OnTensors(model), (feats, coords),
                                  dynamic_shapes={"feats": {0: points}, "coords": {0: points}})
    # The program is one graph of aten and torchsparse_pp ops: no Python of ours runs in it.
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert any(t.startswith("torchsparse_pp.sparse_conv") for t in targets), targets
    assert any(re.match(r"torchsparse_pp\.(torch_)?kmap_downsample", t) for t in targets), targets

    other = scan(gen, 350)  # another scan: other sizes, other maps, same program
    assert len(other[1]) != len(coords)
    exact_model = copy.deepcopy(model).double()
    with torch.no_grad():
        expected = [model(tsp.SparseTensor(f, c)) for f, c in ((feats, coords), other)]
        got = [program.module()(f, c) for f, c in ((feats, coords), other)]
        exact = [exact_model(tsp.SparseTensor(f.double(), c)) for f, c in ((feats, coords), other)]
    for g, e, x in zip(got, expected, exact):
        assert g.shape == e.shape
        assert_as_accurate_as_plain(g, e, x, what="exported MinkUNet")

    torch.export.save(program, tmp_path / "minkunet.pt2")
    torch.save({"inputs": [(feats, coords), other]}, tmp_path / "inputs.pt")
    code = textwrap.dedent("""
        import sys, torch
        import torchsparse_pp  # registers the ops
        assert "torchsparse_pp.models" not in sys.modules
        program = torch.export.load("minkunet.pt2")
        inputs = torch.load("inputs.pt")["inputs"]
        with torch.no_grad():
            torch.save([program.module()(f, c) for f, c in inputs], "outputs.pt")
    """)
    done = fresh_python(code, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = torch.load(tmp_path / "outputs.pt")
    for g, e, x in zip(loaded, expected, exact):
        assert g.shape == e.shape
        assert_as_accurate_as_plain(g, e, x, what="exported MinkUNet, loaded in a new process")


def test_export_with_a_sparse_tensor_argument():
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = MinkUNet(in_channels=4, num_classes=3, cr=0.125).eval()
    randomise_norms(model, gen)
    feats, coords = scan(gen, 400)
    program = torch.export.export(model, (tsp.SparseTensor(feats, coords),))
    # The SparseTensor's leaves (features, coordinates) are the program's two inputs.
    user_inputs = [spec for spec in program.graph_signature.input_specs
                   if spec.kind == torch.export.graph_signature.InputKind.USER_INPUT]
    assert len(user_inputs) == 2
    with torch.no_grad():
        exact = copy.deepcopy(model).double()(tsp.SparseTensor(feats.double(), coords))
        assert_as_accurate_as_plain(program.module()(tsp.SparseTensor(feats, coords)),
                                    model(tsp.SparseTensor(feats, coords)), exact, what="exported MinkUNet")


def test_docs_compile_examples_run(tmp_path, monkeypatch):
    """docs/compile.md's blocks in order in one namespace (cwd: a temp dir); the "fresh process"
    block in a new Python process. torch.compile calls without a backend run here with
    "aot_eager" (same capture, fullgraph included, without inductor's C++ build time; inductor
    is covered by tests/test_compile.py)."""
    with open(DOCS) as f:
        blocks = re.findall(r"```python(?: long| continued)?\n(.*?)```", f.read(), flags=re.S)
    assert len(blocks) >= 5, "docs/compile.md lost its examples"
    compile_ = torch.compile

    def quick_compile(*args, **kwargs):
        kwargs.setdefault("backend", "aot_eager")
        return compile_(*args, **kwargs)

    monkeypatch.setattr(torch, "compile", quick_compile)
    monkeypatch.chdir(tmp_path)
    torch._dynamo.reset()
    namespace = {}
    fresh = [b for b in blocks if b.startswith("# fresh process")]
    assert len(fresh) == 1
    for block in blocks:
        if block in fresh:
            done = fresh_python(block, tmp_path)
            assert done.returncode == 0, done.stderr[-3000:]
            assert done.stdout.strip() == str((len(namespace["coords"]), 19))
        else:
            exec(compile(block, "docs/compile.md", "exec"), namespace)
    torch._dynamo.reset()
    assert namespace["logits_bf16"].dtype == torch.bfloat16
