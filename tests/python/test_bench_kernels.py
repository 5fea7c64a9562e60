"""`ctorch bench kernels --json` (issue 12): every kernel family on every instruction set
the CPU has, beside scalar, with the machine's bounds and each case's error against the
double reference of tests/ref/ref_kernels.h; the instruction sets the CPU lacks are listed
as skipped. Timing decides nothing here: only the shape of the report and the errors."""
import json
import os
import subprocess

NAMES = ["scalar", "avx2", "avx512", "neon", "sve"]


from conftest import cli_path  # noqa: E402,F401  (the one definition)


def test_bench_kernels_json():
    r = subprocess.run([cli_path(), "bench", "kernels", "--json", "--repeats", "3"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["bench"] == "kernels" and j["bounds"]["copy_gbs"] > 0
    skipped = set(j["isa_skipped"])
    ran = {k["isa"] for k in j["kernels"]}
    assert "scalar" in ran and ran | skipped == set(NAMES) and not (ran & skipped)
    if ran != {"scalar"}:
        assert j["bounds"]["fma_gflops_1core"] > 0
    families = {k["family"] for k in j["kernels"]}
    assert families == {"rows", "softmax", "reductions", "activations", "norms", "rope", "conversions",
                        "attention"}
    checked = {k["kernel"] for k in j["kernels"] if "max_rel_err_vs_ref" in k or "mismatches_vs_ref" in k}
    assert {"softmax rows f32 (C=4096)", "argmax rows f32 (C=4096)"} <= checked
    kernels = {k["kernel"] for k in j["kernels"]}
    for name in kernels:
        isas = [k["isa"] for k in j["kernels"] if k["kernel"] == name]
        assert sorted(isas) == sorted(ran), name
    for k in j["kernels"]:
        assert k["rate"] > 0 and k["time"]["median_s"] > 0
        if k["isa"] == "scalar":
            assert k["vs_scalar"] == 1.0
        if "max_rel_err_vs_ref" in k:
            assert k["max_rel_err_vs_ref"] < 1e-4, k
        if "mismatches_vs_ref" in k:
            assert k["mismatches_vs_ref"] == 0, k


def test_bench_kernels_bad_option():
    r = subprocess.run([cli_path(), "bench", "kernels", "--bogus"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unknown option" in r.stderr
