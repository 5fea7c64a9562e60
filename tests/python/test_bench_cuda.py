"""`ctorch bench cuda` where there is no GPU (this suite's machines): it says SKIPPED with the
reason and exits 0, and its --json output parses and carries the reason. Where a GPU is
present the same calls must give a result instead (checked for its shape, not its figures).
bench/torch_cuda.py, PyTorch's side, reports the absence of CUDA instead of inventing figures."""
import json
import os
import subprocess
import sys

import torch

from conftest import ROOT, ctorch


def test_bench_cuda_text_without_gpu_says_skipped():
    r = ctorch("bench", "cuda", "--quick", timeout=600)
    if "SKIPPED" in r.stdout:
        line = next(l for l in r.stdout.splitlines() if "SKIPPED" in l)
        reason = line.split("SKIPPED:", 1)[1].strip()
        assert reason, r.stdout
        assert "cuda" in reason.lower() or "gpu" in reason.lower(), reason
    else:
        assert "GEMM" in r.stdout and "Fused loss" in r.stdout, r.stdout


def test_bench_cuda_json_parses_with_reason():
    r = ctorch("bench", "cuda", "--quick", "--json", timeout=600)
    j = json.loads(r.stdout)
    assert j["bench"] == "cuda"
    if j["status"] == "skipped":
        assert isinstance(j["reason"], str) and j["reason"].strip(), j
        assert j["backend"].startswith("cuda: "), j
    else:
        assert j["status"] == "ok", j
        assert j["gemm"] and all("tflops" in g or "error" in g for g in j["gemm"]), j
        assert {c["case"] for c in j["loss"]["cases"]} == {"fused", "unfused"}, j
        assert "status" in j["torch"], j


def test_bench_cuda_rejects_bad_options():
    r = ctorch("bench", "cuda", "--frobnicate", ok=False)
    assert r.returncode == 2 and "--frobnicate" in r.stderr
    r = ctorch("bench", "cuda", "--device", "cpu", ok=False)
    assert r.returncode != 0 and "--device" in r.stderr
    r = ctorch("bench", "cuda", "--device", "cuda:x", ok=False)
    assert r.returncode != 0 and "cuda:x" in r.stderr


def test_torch_cuda_baseline_reports_missing_cuda():
    script = os.path.join(ROOT, "bench", "torch_cuda.py")
    r = subprocess.run([sys.executable, script, "--quick", "--n", "8", "--repeats", "1"], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    if torch.cuda.is_available():
        assert j["status"] == "ok" and j["gemm"], j
    else:
        assert j["status"] == "no cuda", j
        assert torch.__version__ in j["reason"], j
        assert "gemm" not in j and "loss" not in j, j  # no figures without a GPU
