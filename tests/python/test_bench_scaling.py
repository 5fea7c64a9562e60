"""`ctorch bench scaling` (cli/bench_scaling.c + bench/torch_scaling.py): at --tiny shapes on
threads "1 2", the --json output holds every case with its ctorch and PyTorch 2.13 figures at both
counts and the machine; bad --threads values and a missing PyTorch are refused with a message.
No timing decides anything here: the figures are checked for presence, sign and their arithmetic
(speedup and efficiency from the seconds), never for speed."""
import json
import os
import subprocess

import pytest

from conftest import ctorch  # noqa: E402

CASES = ["gemm_f32", "gemm_bf16", "lce", "flex_fwd", "flex_bwd", "rmsnorm", "swiglu", "adamw", "add", "train_step"]
LISTS = ["threads", "seconds", "speedup", "efficiency", "torch_seconds", "torch_speedup"]


@pytest.fixture(scope="module")
def tiny():
    r = ctorch("bench", "scaling", "--tiny", "--threads", "1 2", "--repeats", 3, "--json", timeout=600)
    return json.loads(r.stdout)


def test_every_case_at_every_count(tiny):
    assert tiny["bench"] == "scaling" and tiny["tiny"] is True and tiny["repeats"] == 3
    assert list(tiny["cases"]) == CASES
    for name, c in tiny["cases"].items():
        for k in LISTS:
            assert isinstance(c[k], list) and len(c[k]) == 2, (name, k, c.get(k))
        assert c["threads"] == [1, 2], name
        assert all(isinstance(s, float) and s > 0 for s in c["seconds"]), (name, c["seconds"])
        # speedup t1 / tn and efficiency t1 / (n tn), from the seconds printed
        t1, t2 = c["seconds"]
        assert c["speedup"][0] == pytest.approx(1.0) and c["efficiency"][0] == pytest.approx(1.0), name
        assert c["speedup"][1] == pytest.approx(t1 / t2, rel=1e-4), name
        assert c["efficiency"][1] == pytest.approx(t1 / (2 * t2), rel=1e-4), name
        assert c["what"] and c["torch_op"] and c["torch_mode"] == ("best" if name == "lce" else "eager"), name


def test_torch_beside_each_case(tiny):
    assert tiny["torch_version"].startswith("2.13"), tiny["torch_version"]
    assert tiny["torch_compile"] is False  # --tiny: eager PyTorch
    for name, c in tiny["cases"].items():
        if name == "flex_bwd":
            # PyTorch 2.13 has no FlexAttention backward on CPU: the row says so instead of a time
            assert c["torch_status"].startswith("not supported"), c["torch_status"]
            assert "backward on CPU" in c["torch_status"], c["torch_status"]
            assert c["torch_seconds"] == [None, None] and c["torch_speedup"] == [None, None]
            continue
        assert c["torch_status"] == "ok", (name, c["torch_status"])
        assert c["torch_threads"] == [1, 2], (name, c["torch_threads"])  # torch.set_num_threads took
        # the median of --repeats calls, or one call where a call takes over 20 s (not at --tiny)
        assert all(r in (1, 3) for r in c["torch_repeats"]), (name, c["torch_repeats"])
        ts = c["torch_seconds"]
        assert all(isinstance(s, float) and s > 0 for s in ts), (name, ts)
        assert c["torch_speedup"][0] == pytest.approx(1.0)
        assert c["torch_speedup"][1] == pytest.approx(ts[0] / ts[1], rel=1e-4), name
        assert c["torch_vs_ctorch"][1] == pytest.approx(ts[1] / c["seconds"][1], rel=1e-4), name
    lce = tiny["cases"]["lce"]
    assert set(lce["torch_variants"]) == {"chunked", "unfused"}
    for i, best in enumerate(lce["torch_best"]):  # the faster variant at each count
        assert lce["torch_seconds"][i] == min(v["seconds"][i] for v in lce["torch_variants"].values())
        assert lce["torch_variants"][best]["seconds"][i] == lce["torch_seconds"][i]
    assert tiny["cases"]["train_step"]["tokens_per_s"][0] > 0
    add = tiny["cases"]["add"]  # the memory reference row: 12 bytes a value over its time
    n = int(add["what"].split("over ")[1].split()[0])
    assert add["gbytes_per_s"] == pytest.approx([12 * n / s * 1e-9 for s in add["seconds"]], rel=1e-6)


def test_machine(tiny):
    m = tiny["machine"]
    assert isinstance(m["cpu"], str) and m["cpu"]
    assert m["cores"] == os.cpu_count()
    assert m["isa"] in ("scalar", "avx2", "avx512", "neon", "sve")
    assert isinstance(m["kernels"], str) and m["kernels"]
    # the 1-core FMA loop of the gemm bench: measured on x86 SIMD, 0 where there is none
    assert m["fma_gflops_1core"] > 0 if m["isa"] in ("avx2", "avx512") else m["fma_gflops_1core"] >= 0
    assert m["fma_bound_gflops"] == pytest.approx([m["fma_gflops_1core"], 2 * m["fma_gflops_1core"]], rel=1e-4)
    for name in ("gemm_f32", "gemm_bf16", "lce", "flex_fwd", "flex_bwd"):
        assert all(g > 0 for g in tiny["cases"][name]["gflops"]), name


@pytest.mark.parametrize("bad", ["0", "x", "", "1000", "1 x", "-1", "1,,1000"])
def test_bad_threads_refused(bad):
    r = ctorch("bench", "scaling", "--tiny", "--threads", bad, ok=False, timeout=60)
    assert r.returncode == 2, (bad, r.returncode, r.stderr)
    assert "--threads" in r.stderr, (bad, r.stderr)
    assert r.stdout == "", bad


def test_unknown_case_refused():
    r = ctorch("bench", "scaling", "--tiny", "--cases", "gemm_f32,nope", ok=False, timeout=60)
    assert r.returncode == 2 and "--cases" in r.stderr and "nope" in r.stderr, r.stderr


def test_missing_torch_fails_with_the_fix(tmp_path):
    """PyTorch is the oracle of every row: without it the bench fails and says how to get it."""
    from conftest import cli_path

    env = dict(os.environ, CTORCH_PYTHON=str(tmp_path / "no-python"))
    r = subprocess.run([cli_path(), "bench", "scaling", "--tiny", "--threads", "1", "--cases", "gemm_f32",
                        "--json"], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "not installed" in r.stderr and "setup.sh --python" in r.stderr, r.stderr
    assert r.stdout == ""
