"""tools/ptxas_report.py, the resource check of `make cuda-check`, on ptxas reports written here
(the real ones come from nvcc -Xptxas -v in scripts/cuda_compile_check.sh)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import ptxas_report  # noqa: E402

FORWARD = ("_ZN14torchsparse_pp5igemm14forward_kernelINS0_13ForwardConfigI6__halfNS_4gemm7MmaHalfIS3_Li128ELi128E"
           "Li32ELi2ELi2ELb0EEELi128ELi128ELi32ELb1ES3_EEEEvNS0_13ForwardParamsE")
FORWARD_NARROW = FORWARD.replace("Li32ELb1ES3_", "Li32ELb0ES3_")
GATHER = "_ZN14torchsparse_pp22gather_scatter_kernels12_GLOBAL__N_118gather_rows_kernelI5uint4jEEvPKT_PKiT0_SA_SA_PS4_"


def entry(name, arch, regs, smem=0, stack=0, stores=0, loads=0):
    used = f"ptxas info    : Used {regs} registers, used 1 barriers" + (f", {smem} bytes smem" if smem else "")
    return (f"ptxas info    : Compiling entry function '{name}' for '{arch}'\n"
            f"ptxas info    : Function properties for {name}\n"
            f"    {stack} bytes stack frame, {stores} bytes spill stores, {loads} bytes spill loads\n"
            f"{used}, 464 bytes cmem[0]\nptxas info    : Compile time = 12.5 ms\n")


def write(tmp_path, name, text):
    path = tmp_path / f"{name}.ptxas"
    path.write_text("ptxas info    : 0 bytes gmem\n" + text)
    return str(path)


def test_parse_reads_every_entry_per_architecture():
    text = (entry(FORWARD, "sm_80", 242, 38672) + entry(FORWARD, "sm_90", 246, 38672) +
            entry(GATHER, "sm_80", 18))
    records = ptxas_report.parse_report(text, "x")
    got = {(r.mangled, r.arch): (r.registers, r.shared, r.spills, r.stack) for r in records}
    assert got == {(FORWARD, "sm_80"): (242, 38672, 0, 0), (FORWARD, "sm_90"): (246, 38672, 0, 0),
                   (GATHER, "sm_80"): (18, 0, 0, 0)}
    assert all(r.entry for r in records)


def test_labels_name_the_kernel_tile_and_variant():
    names = ptxas_report.demangle([FORWARD, FORWARD_NARROW])
    if names[FORWARD] == FORWARD:
        pytest.skip("no c++filt to demangle with")
    assert ptxas_report.label_of(names[FORWARD]) == ("igemm::forward_kernel", "f16_mma_m128n128k32",
                                                     "vector loads, out f16")
    assert ptxas_report.label_of(names[FORWARD_NARROW])[2] == "element loads, out f16"


def run(paths, *extra):
    return subprocess.run([sys.executable, os.path.join(ROOT, "tools", "ptxas_report.py"), *paths, *extra],
                          capture_output=True, text=True)


def test_clean_reports_pass_and_give_the_table(tmp_path):
    a = write(tmp_path, "implicit_gemm.f16", entry(FORWARD, "sm_80", 242, 38672) + entry(FORWARD, "sm_90", 246, 38672)
              + entry(FORWARD_NARROW, "sm_80", 240, 38672) + entry(FORWARD_NARROW, "sm_90", 250, 38672))
    b = write(tmp_path, "gather_scatter", entry(GATHER, "sm_80", 18) + entry(GATHER, "sm_90", 18))
    markdown = tmp_path / "table.md"
    result = run([a, b], "--markdown", str(markdown))
    assert result.returncode == 0, result.stderr
    assert "4 problems" not in result.stdout and "0 problems" in result.stdout
    table = markdown.read_text()
    assert table.startswith("| kernel | variant | count | sm_80 | sm_90 |")
    # One row per kernel and tile: the worst case of its two instantiations.
    assert "242 / 37.8 / 0 | 250 / 37.8 / 0" in table


@pytest.mark.parametrize("figures, problem", [
    (dict(stores=8, loads=8, stack=8), "spills 8 bytes stored / 8 loaded"),
    (dict(stack=16), "keeps a 16-byte stack frame"),
    (dict(smem=48 * 1024 + 16), "static shared memory"),
])
def test_spills_stack_frames_and_shared_memory_fail(tmp_path, figures, problem):
    path = write(tmp_path, "fetch_on_demand.f64", entry(FORWARD, "sm_80", 100) + entry(FORWARD, "sm_90", 80, **figures))
    result = run([path])
    assert result.returncode == 1
    assert "FAIL sm_90" in result.stderr and problem in result.stderr


def test_a_report_without_kernels_fails(tmp_path):
    path = write(tmp_path, "empty", "")
    result = run([path])
    assert result.returncode == 1 and "lists no kernel" in result.stderr
