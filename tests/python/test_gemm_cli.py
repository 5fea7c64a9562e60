"""The GEMM choice seen from the CLI: `ctorch version` names the GEMM in use beside the
instruction set; CT_GEMM=ctorch|openblas forces one; an unknown CT_GEMM is refused naming the
value; `ctorch bench gemm --json` reports OpenBLAS and ctorch's GEMM side by side (a smoke
test of its JSON, no timing decides anything)."""
import json
import os
import subprocess

from conftest import cli_path  # noqa: E402  (the one definition)


def run(args, **env):
    e = {k: v for k, v in os.environ.items() if k != "CT_GEMM"}
    e.update(env)
    return subprocess.run([cli_path()] + args, env=e, capture_output=True, text=True, timeout=300)


def test_version_names_the_gemm():
    r = run(["version"])
    assert r.returncode == 0, r.stderr
    # OpenBLAS is a dependency here, so the automatic rule names both: OpenBLAS with ctorch's
    # GEMM for small shapes (AVX2), or ctorch's with OpenBLAS for skinny ones (AVX-512)
    isa = r.stdout.split("(")[1].split(",")[0]
    if isa == "avx512":
        assert "gemm: ctorch avx512 12x32 (openblas where a side < 32)" in r.stdout, r.stdout
    else:
        assert "gemm: openblas (ctorch " in r.stdout, r.stdout
    # bf16 operands: vdpbf16ps in ctorch's GEMM where the CPU has AVX512_BF16 (with the
    # AVX-512 kernels), else widened to f32 while packing
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    dot = isa == "avx512" and "avx512_bf16" in flags
    assert ("bf16: vdpbf16ps" if dot else "bf16: widened to f32") in r.stdout, r.stdout
    r = run(["version"], CT_GEMM="ctorch")
    assert r.returncode == 0 and "gemm: ctorch " in r.stdout and "(forced)" in r.stdout, r.stdout
    r = run(["version"], CT_GEMM="openblas")
    assert r.returncode == 0 and "gemm: openblas (forced)" in r.stdout, r.stdout


def test_unknown_ct_gemm_is_refused():
    r = run(["version"], CT_GEMM="mkl")
    assert r.returncode == 1 and r.stdout == ""
    assert "CT_EINVAL" in r.stderr and "CT_GEMM=mkl" in r.stderr and "openblas or ctorch" in r.stderr, r.stderr


def test_bench_gemm_json_smoke():
    r = run(["bench", "gemm", "--m", "24", "--n", "40", "--k", "33", "--repeats", "3", "--json"])
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["bench"] == "gemm" and "gemm_default" in j and j["fma_bound"]["gflops"] >= 0
    (row,) = j["shapes"]
    assert (row["m"], row["n"], row["k"]) == (24, 40, 33) and row["default"] in ("ctorch", "openblas")
    for v in ("openblas_f32", "ctorch_f32", "openblas_bf16", "ctorch_bf16"):
        assert row[v]["gflops"] > 0 and row[v]["time"]["repeats"] == 3, v
    assert row["ratio_ctorch_vs_openblas_f32"] > 0
    r = run(["bench", "gemm", "--bogus"])
    assert r.returncode == 2 and "unknown option" in r.stderr
