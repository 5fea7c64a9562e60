"""The PyTorch 2.13 baselines of `ctorch bench gemm | lce | flex | train | fsdp | io` (bench/*.py,
run through the .venv's python or $CTORCH_PYTHON): at tiny shapes, each bench's --json output
holds its PyTorch baselines with status ok, the torch version (2.13), the mode and ctorch's thread
count (`bench compile`'s: tests/python/test_jit_train.py). No timing decides anything here.
torch.compile takes 30-60 s a graph on two cores, so these runs use each bench's switch to leave
the compiled baselines out (the real benches compile them; scripts/gap_table.sh runs them)."""
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, ctorch  # noqa: E402

BENCH = os.path.join(ROOT, "bench")
sys.path.insert(0, BENCH)
import torch_train  # noqa: E402


def python():
    """The python the CLI runs the baselines with."""
    return os.environ.get("CTORCH_PYTHON") or os.path.join(ROOT, ".venv", "bin", "python")

REPEATS = ("--repeats", 3)  # the CLI's minimum


def bench(*args, timeout=600):
    r = ctorch("bench", *args, *REPEATS, "--json", timeout=timeout)
    return json.loads(r.stdout)


def check_baseline(t, threads, mode=None):
    """A PyTorch baseline object: ran, on 2.13, at ctorch's thread count."""
    assert t is not None, "the PyTorch baseline is missing"
    assert t["status"] == "ok", t
    assert t["torch_version"].startswith("2.13"), t["torch_version"]
    assert t["threads"] == threads, (t["threads"], threads)
    if mode is not None:
        assert t["mode"] == mode, t


def test_gemm_beside_torch_matmul():
    j = bench("gemm", "--m", 24, "--n", 40, "--k", 33)
    t = j["torch_f32"]
    check_baseline(t, j["machine"]["threads"], "eager")
    assert t["op"] == "torch.matmul" and t["shape"] == {"m": 24, "n": 40, "k": 33}
    for dt in ("f32", "bf16"):
        assert t[dt]["gflops"] > 0 and t[dt]["repeats"] == 3, dt
    assert j["ratio_best_vs_torch"] > 0 and j["ratio_best_vs_torch_bf16"] > 0


def test_lce_beside_linear_cross_entropy():
    j = bench("lce", "--n", 64, "--d", 32, "--v", 512, "--no-torch-compile")
    threads = j["machine"]["threads"]
    assert set(j["torch"]) == {"chunked", "reference", "unfused"}
    for mode, t in j["torch"].items():
        check_baseline(t, threads, "eager")
        assert t["case"] == mode and t["shape"] == {"n": 64, "d": 32, "v": 512}
        assert t["median_s"] > 0 and t["peak_rss_bytes"] > 0
        # inputs + the gradients at least (h, W, y and dh, dW)
        assert t["peak_tracked_bytes"] >= t["input_bytes"] + 4 * (64 * 32 + 512 * 32), t
        assert j["vs_torch"][mode]["speedup_fused"] > 0
    chunked = j["torch"]["chunked"]
    assert chunked["op"] == "F.linear_cross_entropy(options=nn.LinearCrossEntropyOptions())"
    r = chunked["resolved"]  # what the "auto" defaults resolved to
    assert r["acc_policy"] in ("accurate", "balanced", "compact") and r["chunking_method"].startswith("aspect_ratio")
    assert 1 <= r["batch_chunk_size"] <= 64 and r["chunks"] == -(-64 // r["batch_chunk_size"])
    assert j["torch"]["reference"]["op"] == "F.linear_cross_entropy(options=None)"
    assert "resolved" not in j["torch"]["reference"]


def test_lce_label_smoothing_falls_back_and_says_so():
    """The chunked path refuses label smoothing: the baseline says it ran the reference path."""
    r = subprocess.run([python(), os.path.join(BENCH, "torch_baseline.py"), "lce", "--mode", "chunked", "--n", "16",
                        "--d", "8", "--v", "64", "--label-smoothing", "0.1", "--repeats", "1", "--threads", "1"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    t = json.loads(r.stdout)
    check_baseline(t, 1, "eager")
    assert t["resolved"].startswith("reference path"), t
    assert any("options`` ignored" in w for w in t["warnings"]), t


def test_flex_beside_flex_attention():
    j = bench("flex", "--seq", 256, "--heads", 2, "--window", 16, "--cases", "flex-sliding", "--torch-eager")
    threads = j["machine"]["threads"]
    assert set(j["torch"]) == {"flex-sliding"}
    for case in ("flex-sliding",):
        t = j["torch"][case]
        check_baseline(t, threads, "eager")
        assert t["case"] == case and t["shape"]["seq"] == 256 and t["shape"]["window"] == 16
        assert t["fwd"]["median_s"] > 0 and t["ctorch_speedup_fwd"] > 0
        # PyTorch 2.13 has no FlexAttention backward on CPU; if a later one does, it is timed
        b = t["backward"]
        assert b["status"].startswith("not supported: ") or b["fwd_bwd"]["median_s"] > 0, b


def test_train_beside_sdpa_model():
    j = bench("train", "--batch", 1, "--seq", 32, "--window", 8, "--layers", 1, "--d-model", 32, "--heads", 2,
              "--kv-heads", 1, "--ffn", 48, "--vocab", 256, "--torch-modes", "eager")
    t = j["pytorch_eager"]
    check_baseline(t, j["machine"]["threads"], "eager")
    assert "pytorch_compiled" not in j
    assert "scaled_dot_product_attention" in t["model"]
    assert "not applied" in t["attention"] and "window of 8" in t["attention"], t["attention"]
    assert t["step"]["median_s"] > 0 and t["tokens_per_s"] > 0 and t["peak_tracked_bytes"] >= t["state_bytes"] > 0
    assert j["ctorch_vs_pytorch_eager_tokens_per_s"] > 0


def cpu_has_bf16_dot():
    """What /proc/cpuinfo says of bf16 dot instructions (x86 avx512_bf16, AArch64 bf16)."""
    with open("/proc/cpuinfo") as f:
        words = set(f.read().split())
    return "avx512_bf16" in words or "bf16" in words


def test_train_bf16_rows_beside_autocast():
    """--dtype f32,bf16: a ctorch row and a PyTorch autocast row per dtype, from the same weights
    and batch. With the exact mask the f32 rows are the same maths (the first step's loss, at the
    initial weights, agrees); the bf16 rows round the GEMM operands (close to f32, not equal)."""
    j = bench("train", "--batch", 1, "--seq", 32, "--window", 8, "--layers", 1, "--d-model", 32, "--heads", 2,
              "--kv-heads", 1, "--ffn", 48, "--vocab", 256, "--torch-modes", "eager", "--cases", "fused-flex",
              "--dtype", "f32,bf16", "--torch-attention", "mask")
    m = j["machine"]
    threads = m["threads"]
    assert j["dtypes"] == ["f32", "bf16"] and j["preset"] is None
    assert m["bf16_dot"] == cpu_has_bf16_dot(), m
    assert m["cpu"] and m["isa"]
    for sfx, dt in (("", "f32"), ("_bf16", "bf16")):
        c = j["fused_flex" + sfx]
        assert c["case"] == "fused-flex" + ("-bf16" if dt == "bf16" else "") and c["dtype"] == dt, c
        assert c["threads"] == threads and c["step"]["repeats"] == 3 and c["tokens_per_s"] > 0, c
        assert len(c["losses"]) == 4 and c["step_cpu_s"] > 0, c  # the warm-up and 3 timed steps
        t = j["pytorch_eager" + sfx]
        check_baseline(t, threads, "eager")
        assert t["dtype"] == dt and len(t["losses"]) == 4 and t["step_cpu_s"] > 0, t
        assert t["autocast"] == ('torch.autocast("cpu", dtype=torch.bfloat16)' if dt == "bf16" else None), t
        assert t["attention"].startswith("the model's mask"), t["attention"]
        assert j["ctorch_vs_pytorch_eager%s_tokens_per_s" % sfx] > 0
        for k in ("unfused_flex", "fused_dense", "pytorch_compiled"):
            assert k + sfx not in j  # not asked for
    f32, bf16 = j["fused_flex"]["losses"][0], j["fused_flex_bf16"]["losses"][0]
    tf32, tbf16 = j["pytorch_eager"]["losses"][0], j["pytorch_eager_bf16"]["losses"][0]
    assert f32 == pytest.approx(tf32, rel=1e-4)
    assert bf16 == pytest.approx(tbf16, rel=2e-2) and bf16 == pytest.approx(f32, rel=2e-2)
    assert tbf16 != tf32, "autocast changed nothing: the PyTorch bf16 row ran in f32"
    assert j["fused_flex_bf16_vs_f32_tokens_per_s"] > 0
    for args, needle in ((["--dtype", "f16"], "unknown item 'f16'"), (["--dtype", ""], "at least one"),
                         (["--cases", "fused-flex,flash"], "unknown item 'flash'"),
                         (["--preset", "gpt3"], "--preset must be gpt2-small")):
        r = ctorch("bench", "train", *args, ok=False)
        assert r.returncode == 2 and needle in r.stderr, (args, r.stderr)


def test_train_gpt2_small_preset():
    """--preset gpt2-small sets GPT-2 small's shape (12 layers, d 768, 12 heads, ffn 2048, V 50304,
    B 4, T 1024, no window); flags refine it wherever they stand (here a tiny run: the shape is
    what is checked, with --layers 1 --seq 8 --batch 1 --vocab 512 to stay fast)."""
    j = bench("train", "--layers", 1, "--preset", "gpt2-small", "--seq", 8, "--batch", 1, "--vocab", 512,
              "--no-torch", "--cases", "fused-flex")
    assert j["preset"] == "gpt2-small" and j["dtypes"] == ["f32"]
    assert j["shape"] == {"batch": 1, "seq": 8, "window": 0, "vocab": 512, "layers": 1, "d_model": 768,
                          "heads": 12, "kv_heads": 12, "ffn": 2048}
    h = ctorch("bench", "train", "--help").stdout
    assert "12 layers" in h and "V 50304" in h and "B=4, T=1024" in h, h
    assert j["fused_flex"]["tokens_per_s"] > 0 and "pytorch_eager" not in j


def test_sdpa_model_is_the_reference_model(tiny_run):
    """bench/torch_train.py's SdpaGPT with the exact mask gives the loss of GPT (the tests'
    reference, which test_train compares with ctorch); with is_causal it drops the window."""
    path = str(tiny_run / "checkpoint.safetensors")
    ref, tokens, tr, _ = torch_train.load(path)
    if tokens is None:  # a checkpoint holds no batch: take one from its configuration's vocabulary
        g = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, ref.cfg["vocab_size"], (2, ref.cfg["context"] + 1), generator=g)
    eos = tr.get("eos_token", -1)
    exact, _, _, _ = torch_train.load_sdpa(path, "mask")
    causal, _, _, _ = torch_train.load_sdpa(path, "causal")
    with torch.no_grad():
        a, b, c = (float(m(tokens, eos)) for m in (ref, exact, causal))
    assert b == pytest.approx(a, rel=1e-5, abs=1e-6)
    assert c != pytest.approx(a, rel=1e-5, abs=1e-6)  # the window of 6 is not applied
    assert "window of 6" in torch_train.mask_note(causal.cfg, tokens, eos, "causal")
    r = ctorch("bench", "train", "--torch-modes", "jit", ok=False)
    assert r.returncode == 2 and "--torch-modes" in r.stderr


def test_fsdp_beside_ddp_and_fsdp2():
    j = bench("fsdp", "--layers", 1, "--d-model", 64, "--batch", 2, "--seq", 8, "--steps", 2, "--cases", "single",
              "--torch-modes", "single,fsdp2")
    assert [c["name"] for c in j["cases"]] == ["single"]
    t = j["torch"]
    check_baseline(t, 1, "eager")
    assert t["threads_per_rank"] == 1
    assert t["single"]["status"] == "ok" and t["single"]["tokens_per_s"] > 0
    assert "ddp" not in t  # DDP: the same spawn path as FSDP2 (the real bench runs both)
    # FSDP2 runs on CPU over gloo in 2.13 (were it refused, the status would say why)
    f = t["fsdp2"]
    assert f["status"] == "ok", f
    assert "fully_shard" in f["what"] and f["nproc"] == 2 and len(f["peak_rss_bytes_per_rank"]) == 2
    r = ctorch("bench", "fsdp", "--cases", "single,bogus", ok=False)
    assert r.returncode == 2 and "unknown case 'bogus'" in r.stderr


def test_io_beside_safetensors():
    j = bench("io", "--size-mib", 2, "--tensor-mib", 1)
    t = j["python_numpy_torch"]
    check_baseline(t, j["machine"]["threads"], "eager")
    assert t["safetensors_version"] and t["numpy_version"]
    for k in ("open", "read_checksum", "convert_bf16_f32", "save_no_fsync", "safetensors_load_file",
              "safetensors_save_file"):
        assert t[k]["median_s"] > 0, k


def test_bad_torch_options():
    for args, needle in ((["lce", "--torch-modes", "chunked,fast"], "unknown mode 'fast'"),
                         (["train", "--torch-attention", "flash"], "--torch-attention"),
                         (["fsdp", "--torch-modes", "zero3"], "unknown mode 'zero3'")):
        r = ctorch("bench", *args, ok=False)
        assert r.returncode == 2 and needle in r.stderr, (args, r.stderr)


def test_lce_interleaved():
    """--interleaved: fused and unfused alternated in one process (no PyTorch, no children):
    both medians and their ratio, for f32 and bf16; timing decides nothing."""
    for dt in ("f32", "bf16"):
        j = bench("lce", "--interleaved", "--n", 48, "--d", 16, "--v", 300, "--dtype", dt)
        assert j["mode"] == "interleaved" and j["shape"] == {"n": 48, "d": 16, "v": 300, "dtype": dt,
                                                             "label_smoothing": 0.0}
        for k in ("fused", "unfused"):
            assert j[k]["repeats"] == 3 and 0 < j[k]["min_s"] <= j[k]["median_s"] <= j[k]["max_s"], j[k]
        assert j["fused_over_unfused"] == pytest.approx(j["fused"]["median_s"] / j["unfused"]["median_s"], rel=1e-3)
        assert "torch" not in j
