"""`ctorch bench cuda` where there is no GPU (this suite's machines): it says SKIPPED with the
reason and exits 0, and its --json output parses and carries the reason. Where a GPU is
present the same calls must give a result instead (checked for its shape, not its figures).
bench/torch_cuda.py, PyTorch's side, reports the absence of CUDA instead of inventing figures;
its training-step rows (bench/torch_train.py's SdpaGPT from a ctorch weights file, fused AdamW,
autocast for bf16) run here through --train-on-cpu, so that the GPU run meets no Python error."""
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
        rows = j["train_step"]["rows"]
        # --quick: the default model B=8 and GPT-2-124M B=4, f32 and bf16
        assert [(r["model"], r["batch"], r["dtype"]) for r in rows] == [
            ("default", 8, "f32"), ("default", 8, "bf16"), ("gpt2-124M", 4, "f32"), ("gpt2-124M", 4, "bf16")], rows
        for r in rows:
            assert "tokens_per_s" in r["ctorch"] or "error" in r["ctorch"], r
            if j["torch"]["status"] == "ok":
                assert "torch_eager" in r, r
        assert "torch_compiled" in rows[3], rows[3]


def test_bench_cuda_rejects_bad_options():
    r = ctorch("bench", "cuda", "--frobnicate", ok=False)
    assert r.returncode == 2 and "--frobnicate" in r.stderr
    r = ctorch("bench", "cuda", "--device", "cpu", ok=False)
    assert r.returncode != 0 and "--device" in r.stderr
    r = ctorch("bench", "cuda", "--device", "cuda:x", ok=False)
    assert r.returncode != 0 and "cuda:x" in r.stderr


def test_torch_cuda_baseline_reports_missing_cuda():
    script = os.path.join(ROOT, "bench", "torch_cuda.py")
    r = subprocess.run([sys.executable, script, "--quick", "--n", "8", "--repeats", "1", "--train",
                        "default:nowhere.safetensors:2:f32:eager"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    if torch.cuda.is_available():
        assert j["status"] == "ok" and j["gemm"], j
    else:
        assert j["status"] == "no cuda", j
        assert torch.__version__ in j["reason"], j
        assert "gemm" not in j and "loss" not in j and "train" not in j, j  # no figures without a GPU


def test_torch_cuda_train_rows_run_on_cpu(tmp_path):
    """The training-step rows of bench/torch_cuda.py on the CPU (--train-on-cpu): a tiny ctorch
    checkpoint read by torch_train.SdpaGPT, f32 and bf16 autocast, fused AdamW, clip; each row
    has its figures, and bad specs or files are rows with an error, never a crash."""
    from conftest import TINY

    out = tmp_path / "run"
    ctorch("train", *TINY, "--steps", 1, "--quiet", "--out", out)
    ck = out / "checkpoint.safetensors"
    script = os.path.join(ROOT, "bench", "torch_cuda.py")
    specs = [f"tiny:{ck}:2:f32:eager", f"tiny:{ck}:3:bf16:eager", "tiny:x:2", f"tiny:{ck}:2:f16:eager",
             f"tiny:{ck}:2:f32:fast", f"tiny:{tmp_path}/none.safetensors:2:f32:eager"]
    args = [sys.executable, script, "--train-on-cpu", "--repeats", "2"]
    for sp in specs:
        args += ["--train", sp]
    r = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["status"] == "cpu check", j
    rows = j["train"]
    assert len(rows) == 6, rows
    for row, (b, dt) in zip(rows[:2], ((2, "f32"), (3, "bf16"))):
        assert row["model"] == "tiny" and row["batch"] == b and row["dtype"] == dt and row["mode"] == "eager", row
        assert "error" not in row, row
        assert row["seq"] == 32 and row["repeats"] == 2 and row["tokens_per_s"] > 0, row
        # the same initial weights as ctorch's checkpoint, trained a few steps: a finite loss
        # near ln(V) at first (V = 512 here) that went down
        assert 5.0 < row["loss_first"] < 8.0 and row["loss_last"] < row["loss_first"], row
        assert "max_memory_allocated" not in row, row  # no CUDA figures off a GPU
    for row in rows[2:5]:
        assert "expected MODEL:WEIGHTS:B" in row["error"], row
    assert "none.safetensors" in rows[5]["error"], rows[5]
