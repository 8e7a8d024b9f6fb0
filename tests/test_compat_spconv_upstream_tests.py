"""spconv's own test/test_conv.py (unmodified, from ../shared/upstream) under
``alias("spconv")``, with only its device changed to the CPU: every case of each of its test
functions (sparse conv, transposed conv and max pool against torch's dense layers, forward and
gradients, atol 1e-4 as spconv sets it) must pass. The counts are in docs/migrating.md."""
import json

import pytest

from spconv_upstream import run_here, upstream_file

pytestmark = pytest.mark.spconv

# Cases each test function runs (what docs/migrating.md reports): its parameter grid less the
# combinations it skips itself (stride > 1 with dilation > 1, which spconv does not support).
CASES = {"test_spconv3d": 540, "test_spdeconv3d": 216, "test_spmaxpool3d": 120, "test_spglobalmaxpool3d": 4}


@pytest.mark.parametrize("name", sorted(CASES))
def test_spconv_test_conv_passes_under_the_alias(name, tmp_path):
    upstream_file("spconv", "test", "test_conv.py")
    out = tmp_path / "result.json"
    run_here("spconv-test", name, str(out))
    result = json.loads(out.read_text())
    print(f"{name}: {result['passed']} of {result['ran']} cases passed ({result['cases']} in its grid)")
    assert result["ran"] == CASES[name]
    assert result["passed"] == result["ran"], f"failed cases: {json.dumps(result['failed'], indent=1)[:4000]}"
