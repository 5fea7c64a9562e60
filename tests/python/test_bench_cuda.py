"""`ctorch bench cuda` where there is no GPU (this suite's machines): it says SKIPPED with the
reason and exits 0, and its --json output parses and carries the reason. Where a GPU is
present the same calls must give a result instead (checked for its shape, not its figures).
bench/torch_cuda.py, PyTorch's side, reports the absence of CUDA instead of inventing figures;
its training-step rows (bench/torch_train.py's SdpaGPT from a ctorch weights file, fused AdamW,
autocast for bf16) run here through --train-on-cpu, so that the GPU run meets no Python error.

On the emulated CUDA device (libctorch_cuda_emu.so, docs/cuda.md) `ctorch bench cuda --tiny` runs
every section at small shapes: its figures are no GPU's, but its rows must be whole. The flex
rows' block masks are checked against PyTorch's own create_block_mask of the same mask_mod
(blocks kept, full blocks) and the kept pairs against the dense mask; ctorch's forward +
backward run twice must give the same bytes. bench/torch_cuda.py's flex rows (flex_attention
with the same block mask, SDPA with a boolean mask, causal flash SDPA; deterministic algorithms
off and on) run on the CPU through --flex-on-cpu. With a stand-in for PyTorch's python (canned
figures as on a GPU, one row failed) the merge is checked: the specs passed, the ratios PyTorch
time over ctorch time, PyTorch's rate on the same kept blocks, the failed row, the text table."""
import json
import os
import re
import subprocess
import sys

import torch

from conftest import ROOT, cli_path, ctorch


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
        assert {c["case"] for c in j["loss"]["cases"]} == {"fused", "fused-64MiB", "fused-f32-grads", "unfused"}, j
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
        flex = j["flex"]["rows"]  # --quick: the window at L=8192, causal at L=2048
        assert [(r["case"], r["L"]) for r in flex] == [("sliding window 256", 8192), ("causal", 2048)], flex
        for r in flex:
            assert "fwd_kept_block_tflops" in r["ctorch_flex"] or "error" in r["ctorch_flex"], r
            assert "status" in r["torch"] or "flex_compiled" in r["torch"], r


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


def emu_lib():
    """libctorch_cuda_emu.so of the build under test (beside the CLI): built with the tests."""
    path = os.path.join(os.path.dirname(os.path.abspath(cli_path())), "libctorch_cuda_emu.so")
    assert os.path.isfile(path), f"{path} is missing: build the ctorch_cuda_emu target (CTORCH_CUDA_EMU=ON)"
    return path


def emu_bench(*args, python=None):
    env = dict(os.environ, CTORCH_CUDA_LIB=emu_lib())
    if python:
        env["CTORCH_PYTHON"] = str(python)
    env.pop("CTORCH_CUDA_EMU_REVERSE", None)
    r = subprocess.run([cli_path(), "bench", "cuda", *args], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, f"bench cuda {' '.join(args)}: exit {r.returncode}\n{r.stderr}"
    return r


def torch_block_counts(L, W, bs):
    """PyTorch's BlockMask of the bench's mask_mod (kv <= q, and q - kv <= W for a window): its
    partial and full blocks, and the pairs the dense mask keeps."""
    from torch.nn.attention.flex_attention import create_block_mask

    def mask_mod(b, h, q, kv):
        keep = q >= kv
        return keep & (q - kv <= W) if W else keep

    bm = create_block_mask(mask_mod, None, None, L, L, device="cpu", BLOCK_SIZE=bs)
    i = torch.arange(L)
    pairs = int(mask_mod(None, None, i[:, None], i[None, :]).sum())
    return int(bm.kv_num_blocks.sum()), int(bm.full_kv_num_blocks.sum()), pairs


def check_flex_rows(j):
    f = j["flex"]
    assert f["gemm_bf16"]["dtype"] == "bf16" and f["gemm_bf16"]["tflops"] > 0, f["gemm_bf16"]
    rows = f["rows"]
    assert [(r["case"], r["B"], r["H"], r["L"], r["E"], r["window"], r["block_size"]) for r in rows] == [
        ("sliding window 32", 1, 2, 256, 32, 32, 64), ("causal", 1, 2, 192, 64, 0, 64)], rows
    for r in rows:
        B, H, L, E, W, bs = (r[k] for k in ("B", "H", "L", "E", "window", "block_size"))
        partial, full, pairs = torch_block_counts(L, W, bs)  # per (b, h): the mask broadcasts
        bm = r["block_mask"]
        assert bm["partial_blocks"] == B * H * partial and bm["full_blocks"] == B * H * full, (bm, partial, full)
        assert bm["blocks"] == B * H * (L // bs) ** 2 and bm["device_bytes"] > 0, bm
        assert r["kept_pairs"] == B * H * pairs, (r, pairs)
        assert r["kept_pair_flops_fwd"] == 4 * E * B * H * pairs, r
        assert r["kept_block_flops_fwd"] == 4 * bs * bs * E * B * H * (partial + full), r
        assert r["kept_block_flops_fwd_bwd"] == 3.5 * r["kept_block_flops_fwd"], r
        methods = ["ctorch_flex"] + (["ctorch_sdpa_causal"] if W == 0 else [])
        assert ("ctorch_sdpa_causal" in r) == (W == 0), r
        for m in methods:
            x = r[m]
            assert "error" not in x, x
            for p in ("fwd", "fwd_bwd"):
                assert x[p]["median_s"] > 0 and x[p]["repeats"] == j["repeats"], x
                # the peak holds at least the inputs, outputs and gradients (9 tensors' worth)
                assert x[p]["peak_bytes"] >= 5 * B * L * H * E * 2, x
            assert x["bitwise_repeatable"] is True and len(x["hash"]) == 16, x
            assert x["fwd_kept_block_tflops"] > 0 and x["fwd_vs_gemm_bf16"] > 0, x
        # no CUDA for PyTorch here: the row says so, with no figures
        assert r["torch"]["status"].startswith("no cuda"), r["torch"]
        assert r["torch_over_ctorch"] == {m: {} for m in methods}, r
        assert "goals" not in r, r  # the goals belong to the full shapes


def test_bench_cuda_tiny_on_the_emulated_device():
    """Every section of bench cuda at --tiny shapes on the emulated GPU: whole rows, PyTorch's
    side saying it has no CUDA; the flex rows as check_flex_rows says."""
    j = json.loads(emu_bench("--tiny", "--json").stdout)
    assert j["status"] == "ok" and j["tiny"] is True and j["quick"] is False, j
    assert "emulated" in j["device"], j["device"]
    assert [(g["case"], g["dtype"]) for g in j["gemm"]] == [
        (c, dt) for c in ("tiny square 96", "tiny nt", "tiny tn") for dt in ("f32", "bf16")], j["gemm"]
    assert all(g["tflops"] > 0 for g in j["gemm"]), j["gemm"]
    assert (j["loss"]["N"], j["loss"]["D"], j["loss"]["V"]) == (64, 64, 1000), j["loss"]
    assert all("time" in c for c in j["loss"]["cases"]), j["loss"]
    rows = j["train_step"]["rows"]
    assert [(r["model"], r["batch"], r["seq"], r["dtype"]) for r in rows] == [
        ("tiny", 2, 32, "f32"), ("tiny", 2, 32, "bf16")], rows
    for r in rows:
        assert r["ctorch"]["tokens_per_s"] > 0, r
        assert 5.0 < r["ctorch"]["loss_first"] < 8.0, r  # near ln(512) at the start
    assert j["torch"]["status"] == "no cuda" and torch.__version__ in j["torch"]["reason"], j["torch"]
    check_flex_rows(j)


def fake_pytorch(tmp_path, flex):
    """A stand-in for the python that runs bench/torch_cuda.py: it records its arguments and
    answers as the script would on a GPU (status ok) with the given flex rows."""
    canned = tmp_path / "torch.json"
    canned.write_text(json.dumps({"status": "ok", "torch_version": "fake", "device": "fake GPU", "flex": flex}))
    exe = tmp_path / "python"
    exe.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > '{tmp_path}/args'\ncat '{canned}'\n")
    exe.chmod(0o755)
    return exe


def test_bench_cuda_flex_rows_merge_pytorch_figures(tmp_path):
    """--only flex on the emulated device with a stand-in for PyTorch's side: the specs it gets,
    its figures in the rows, the ratios PyTorch time over ctorch time, PyTorch's flex rate on the
    same kept blocks, a row PyTorch failed as a whole, and the text table of all that."""
    def m(f, b, d):
        return {"op": "x", "fwd": {"median_s": f}, "fwd_bwd": {"median_s": b}, "fwd_bwd_deterministic": d}
    flex = [{"case": "sliding window 32", "L": 256,
             "flex_compiled": m(0.001, 0.004, {"median_s": 0.005}),
             "sdpa_bool_mask": m(0.002, 0.006, {"error": "RuntimeError: no deterministic kernel"}),
             "sdpa_causal_flash": m(0.0005, 0.002, {"median_s": 0.003})},
            {"case": "causal", "L": 192, "error": "OutOfMemoryError: fake"}]
    py = fake_pytorch(tmp_path, flex)
    j = json.loads(emu_bench("--tiny", "--only", "flex", "--json", python=py).stdout)
    args = (tmp_path / "args").read_text().splitlines()
    assert args[0].endswith("torch_cuda.py"), args
    specs = [args[i + 1] for i, a in enumerate(args) if a == "--flex"]
    assert specs == ["sliding window 32:1:2:256:32:32:64", "causal:1:2:192:64:0:64"], args
    assert "--tiny" in args and args[args.index("--sections") + 1] == "none" and "--train" not in args, args
    w, c = j["flex"]["rows"]
    assert w["torch"]["sdpa_causal_flash"]["fwd"]["median_s"] == 0.0005, w["torch"]
    ours = {p: w["ctorch_flex"][p]["median_s"] for p in ("fwd", "fwd_bwd")}
    r = w["torch_over_ctorch"]["ctorch_flex"]
    want = {"flex_compiled_fwd": 0.001 / ours["fwd"], "flex_compiled_fwd_bwd": 0.004 / ours["fwd_bwd"],
            "flex_compiled_fwd_bwd_deterministic": 0.005 / ours["fwd_bwd"],
            "sdpa_bool_mask_fwd": 0.002 / ours["fwd"], "sdpa_bool_mask_fwd_bwd": 0.006 / ours["fwd_bwd"],
            "sdpa_causal_flash_fwd": 0.0005 / ours["fwd"], "sdpa_causal_flash_fwd_bwd": 0.002 / ours["fwd_bwd"],
            "sdpa_causal_flash_fwd_bwd_deterministic": 0.003 / ours["fwd_bwd"]}
    assert set(r) == set(want), r  # no ratio where PyTorch has no figure
    for k, v in want.items():
        assert abs(r[k] - v) <= 1e-5 * v, (k, r[k], v)
    tf = w["torch"]["flex_compiled"]
    assert abs(tf["fwd_kept_block_tflops"] - w["kept_block_flops_fwd"] / 0.001 / 1e12) <= 1e-5 * tf["fwd_kept_block_tflops"]
    gemm = j["flex"]["gemm_bf16"]["tflops"]
    assert abs(tf["fwd_vs_gemm_bf16"] - tf["fwd_kept_block_tflops"] / gemm) <= 1e-5 * tf["fwd_vs_gemm_bf16"], tf
    assert c["torch"] == flex[1] and c["torch_over_ctorch"] == {"ctorch_flex": {}, "ctorch_sdpa_causal": {}}, c
    assert "flex" not in j["torch"], j["torch"]  # moved into the rows

    out = emu_bench("--tiny", "--only", "flex", python=py).stdout
    assert "FlexAttention bf16" in out and "GEMM (median" not in out and "Training step" not in out, out
    assert "Fused loss" not in out, out
    assert "sliding window 32: B=1 H=2 L=256 E=32, block 64: 14 of 32 blocks kept (0 full)" in out, out
    assert out.count("forward + backward run twice: identical bytes") == 3, out  # flex x 2, sdpa causal
    line = next(l for l in out.splitlines() if "torch flex (compiled)" in l)
    assert line.split()[3:6] == ["1.000", "4.000", "5.000"], line
    line = next(l for l in out.splitlines() if "torch sdpa bool mask" in l)
    assert line.split()[4:7] == ["2.000", "6.000", "failed"], line
    assert "fwd_bwd_deterministic failed: RuntimeError: no deterministic kernel" in out, out
    assert "torch sdpa causal flash (*)" in out and "PyTorch failed: OutOfMemoryError: fake" in out, out
    line = next(l for l in out.splitlines() if "PyTorch flex time over ctorch flex time" in l)
    assert re.search(r"fwd [0-9.]+, fwd\+bwd [0-9.]+, fwd\+bwd deterministic [0-9.]+$", line), line


def test_bench_cuda_rejects_bad_sections():
    r = ctorch("bench", "cuda", "--only", "gemm,frob", ok=False)
    assert r.returncode == 2 and "'frob' is not a section" in r.stderr, r.stderr
    r = ctorch("bench", "cuda", "--only", "", ok=False)
    assert r.returncode == 2 and "--only" in r.stderr, r.stderr
    r = ctorch("bench", "cuda", "--quick", "--tiny", ok=False)
    assert r.returncode == 2 and "--tiny" in r.stderr, r.stderr


def test_torch_cuda_flex_rows_run_on_cpu():
    """bench/torch_cuda.py's flex rows on the CPU (--flex-on-cpu, flex_attention uncompiled):
    each method's forward has figures; every pass has figures or PyTorch's own refusal (2.13
    refuses the flex backward on the CPU); SDPA's backward runs with deterministic algorithms
    off and on; a bad spec is a row with an error."""
    script = os.path.join(ROOT, "bench", "torch_cuda.py")
    r = subprocess.run([sys.executable, script, "--flex-on-cpu", "--repeats", "2", "--flex",
                        "sliding window 8:1:2:64:16:8:16", "--flex", "causal:2:1:48:8:0:16", "--flex", "bad:1:2",
                        "--flex", "zero:0:1:16:8:0:16"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["status"] == "cpu check", j
    rows = j["flex"]
    assert len(rows) == 4, rows
    for row, (name, B, H, L, E, W) in zip(rows, (("sliding window 8", 1, 2, 64, 16, 8), ("causal", 2, 1, 48, 8, 0))):
        assert (row["case"], row["B"], row["H"], row["L"], row["E"], row["window"], row["block_size"]) == \
            (name, B, H, L, E, W, 16), row
        assert "error" not in row, row
        for m in ("flex_compiled", "sdpa_bool_mask", "sdpa_causal_flash"):
            x = row[m]
            assert x["fwd"]["median_s"] > 0 and x["fwd"]["repeats"] == 2, (m, x)
            for p in ("fwd_bwd", "fwd_bwd_deterministic"):
                assert x[p].get("median_s", 0) > 0 or x[p]["error"], (m, p, x)
            assert "peak_bytes" not in x["fwd"], x  # no CUDA figures off a GPU
        assert row["flex_compiled"]["op"] == "flex_attention (eager)", row
        for m in ("sdpa_bool_mask", "sdpa_causal_flash"):
            assert "error" not in row[m]["fwd_bwd"] and "error" not in row[m]["fwd_bwd_deterministic"], row[m]
        assert ("not the window" in row["sdpa_causal_flash"]["op"]) == (W > 0), row
    for row in rows[2:]:
        assert "expected NAME:B:H:L:E:WINDOW:BLOCK" in row["error"], row


def test_torch_cuda_deadline_records_entries_as_not_run():
    """Past $CTORCH_BENCH_DEADLINE bench/torch_cuda.py starts no flex pass and says so (the JSON
    still comes back); a value that is not a number is named."""
    script = os.path.join(ROOT, "bench", "torch_cuda.py")
    for value, want in (("1", "not run: past CTORCH_BENCH_DEADLINE (1,"), ("soon", "'soon' is not a number")):
        r = subprocess.run([sys.executable, script, "--flex-on-cpu", "--repeats", "2", "--flex", "causal:1:1:32:8:0:16"],
                           capture_output=True, text=True, timeout=600,
                           env=dict(os.environ, CTORCH_BENCH_DEADLINE=value))
        assert r.returncode == 0, r.stderr
        row = json.loads(r.stdout)["flex"][0]
        for m in ("flex_compiled", "sdpa_bool_mask", "sdpa_causal_flash"):
            for p in ("fwd", "fwd_bwd", "fwd_bwd_deterministic"):
                assert want in row[m][p]["error"] and "median_s" not in row[m][p], (m, p, row[m][p])
