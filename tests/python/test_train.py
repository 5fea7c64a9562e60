"""ctorch train / generate / tokenizer through the CLI: the loss and every parameter gradient
against the same model in PyTorch (built from ctorch's weights), bit-exact resume, the same
bits at 1 and 2 threads, text data with a BPE tokenizer, and errors on bad input."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import torch_train  # noqa: E402  (the PyTorch model of bench/torch_train.py)
from conftest import TINY, cli_path, ctorch  # noqa: E402


@pytest.mark.parametrize("extra", [
    ["--window", 6, "--z-loss", 1e-3, "--label-smoothing", 0.1],             # fused loss, flex, GQA, documents
    ["--untied", "--unfused-head", "--dense-attention", "--no-doc-mask"],   # the baselines, untied head
    ["--window", 4, "--kv-heads", 1, "--untied", "--z-loss", 1e-2],
])
def test_loss_and_gradients_match_pytorch(tmp_path, extra):
    dump = tmp_path / "grads.safetensors"
    ctorch("train", *TINY, *extra, "--out", tmp_path, "--dump-grads", dump)
    model, tokens, tr, meta = torch_train.load(str(dump))
    tensors, _ = torch_train.read_safetensors(str(dump))
    loss = model(tokens, tr["eos_token"], tr["z_loss"], tr["label_smoothing"])
    loss.backward()
    assert abs(float(meta["loss"]) - loss.item()) <= 1e-5 * abs(loss.item())
    names = model.named()
    assert len(names) == sum(1 for k in tensors if k.startswith("grad."))
    for name, p in names.items():
        ours, ref = tensors["grad." + name], p.grad.numpy()
        scale = np.abs(ref).max()
        assert scale > 0, name
        rel = np.linalg.norm(ours - ref) / np.linalg.norm(ref)
        assert rel < 1e-4, f"{name}: relative error {rel:.2e}"
        assert np.abs(ours - ref).max() <= 1e-4 * scale, name


def test_gradients_match_pytorch_after_training(tmp_path):
    """The same check at trained weights, read by PyTorch from a training checkpoint."""
    ctorch("train", *TINY, "--window", 6, "--steps", 5, "--lr", 1e-2, "--quiet", "--out", tmp_path)
    dump = tmp_path / "grads.safetensors"
    ctorch("train", "--resume", "--out", tmp_path, "--dump-grads", dump)
    model, _, tr, _ = torch_train.load(str(tmp_path / "checkpoint.safetensors"))
    tensors, meta = torch_train.read_safetensors(str(dump))
    loss = model(torch.from_numpy(tensors["tokens"].astype(np.int64)), tr["eos_token"])
    loss.backward()
    assert abs(float(meta["loss"]) - loss.item()) <= 1e-5 * loss.item()
    for name, p in model.named().items():
        assert np.array_equal(p.detach().numpy(), tensors[name]), name  # the checkpoint's weights
        ours, ref = tensors["grad." + name], p.grad.numpy()
        assert np.linalg.norm(ours - ref) / np.linalg.norm(ref) < 1e-4, name


def losses(metrics):
    """Step -> loss text (9 significant digits: the exact f32) of a metrics.jsonl."""
    out = {}
    for line in open(metrics):
        j = json.loads(line)
        if "loss" in j:
            out[j["step"]] = repr(j["loss"])
        if "eval_loss" in j and "loss" in j:
            out[("eval", j["step"])] = repr(j["eval_loss"])
    return out


def params(path):
    t, _ = torch_train.read_safetensors(str(path))
    return {k: v for k, v in t.items()}


def test_resume_is_bit_exact(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    run = [*TINY, "--steps", 8, "--warmup", 2, "--eval-every", 2, "--quiet"]
    ctorch("train", *run, "--out", a)
    ctorch("train", *run, "--out", b, "--stop-at", 3)
    ctorch("train", "--resume", "--out", b, "--quiet", "--eval-every", 2)
    la, lb = losses(a / "metrics.jsonl"), losses(b / "metrics.jsonl")
    assert len([k for k in la if isinstance(k, int)]) == 8 and len(la) == 12
    assert lb.pop(("eval", 3)) and la == lb  # the interrupted run also evaluated where it stopped
    pa, pb = params(a / "checkpoint.safetensors"), params(b / "checkpoint.safetensors")
    assert pa.keys() == pb.keys()
    for k in pa:
        assert np.array_equal(pa[k], pb[k]), k
    assert (b / "loss.svg").read_text().startswith("<svg")
    # resume refuses settings that must come from the checkpoint
    r = ctorch("train", "--resume", "--out", b, "--layers", 3, ok=False)
    assert r.returncode == 2 and "--layers" in r.stderr


def test_same_bits_at_1_and_2_threads(tmp_path):
    run = [*TINY, "--steps", 4, "--eval-every", 2, "--quiet", "--window", 5]
    ctorch("train", *run, "--out", tmp_path / "t1", "--threads", 1)
    ctorch("train", *run, "--out", tmp_path / "t2", "--threads", 2)
    l1, l2 = losses(tmp_path / "t1" / "metrics.jsonl"), losses(tmp_path / "t2" / "metrics.jsonl")
    assert len(l1) == 6 and l1 == l2


TEXT = ("It was the best of times, it was the worst of times, it was the age of wisdom, it was the age "
        "of foolishness, it was the epoch of belief, it was the epoch of incredulity.\n") * 30 + \
       "<|endoftext|>Caf\u00e9 cr\u00e8me \u00e0 la carte, \u65e5\u672c\u8a9e.\n" * 10


def test_text_data_tokenizer_and_generate(tmp_path):
    data = tmp_path / "book.txt"
    data.write_text(TEXT, encoding="utf-8")
    tok = tmp_path / "tok.json"
    r = ctorch("tokenizer", "train", "--data", data, "--out", tok, "--vocab", 300)
    assert "merges" in r.stdout
    sample = "it was the age of caf\u00e9s<|endoftext|>\u65e5\u672c"
    ids = ctorch("tokenizer", "encode", "--tokenizer", tok, "--text", sample).stdout.split()
    back = ctorch("tokenizer", "decode", "--tokenizer", tok, "--ids", " ".join(ids)).stdout
    assert back == sample + "\n"
    run = ["--data", data, "--tokenizer", tok, "--layers", 1, "--d-model", 32, "--heads", 2, "--kv-heads", 1,
           "--ffn", 32, "--context", 32, "--batch", 2, "--steps", 6, "--quiet"]
    ctorch("train", *run, "--out", tmp_path / "run")
    ck = tmp_path / "run" / "checkpoint.safetensors"
    gen = [cli_path(), "generate", "--checkpoint", ck, "--prompt", "it was", "--tokens", "8", "--seed", "3"]
    g = subprocess.run(gen, capture_output=True, timeout=60)  # bytes: samples need not be UTF-8
    assert g.returncode == 0 and g.stdout.startswith(b"it was")
    assert subprocess.run(gen, capture_output=True, timeout=60).stdout == g.stdout
    # the checkpoint carries the tokenizer and the data's identity: resume re-reads the text
    ctorch("train", "--resume", "--out", tmp_path / "run", "--quiet")
    data.write_text(TEXT + "more", encoding="utf-8")
    r = ctorch("train", "--resume", ck, "--out", tmp_path / "run", "--quiet", ok=False)
    assert r.returncode == 1 and "not the text" in r.stderr
    # a tokenizer trained by train itself is saved beside the checkpoint
    run2 = [a for a in run if a not in ("--tokenizer", tok)]
    data.write_text(TEXT, encoding="utf-8")
    ctorch("train", *run2, "--vocab", 280, "--out", tmp_path / "run2")
    assert json.loads((tmp_path / "run2" / "tokenizer.json").read_text())["format"] == "ctorch-bpe"


def test_builtin_generate(tmp_path):
    ctorch("train", *TINY, "--steps", 2, "--quiet", "--out", tmp_path)
    ck = tmp_path / "checkpoint.safetensors"
    g = ctorch("generate", "--checkpoint", ck, "--tokens", 5, "--temperature", 0)
    assert len(g.stdout.split()) >= 1
    r = ctorch("generate", "--checkpoint", ck, "--prompt", "notaword", ok=False)
    assert r.returncode == 1 and "notaword" in r.stderr


def test_bad_input(tmp_path):
    cases = [
        (["train", "--layers", "0"], 2, "--layers"),
        (["train", "--bogus"], 2, "--bogus"),
        (["train", *TINY, "--heads", 3, "--out", tmp_path], 1, "d_model"),
        (["train", *TINY, "--kv-heads", 3, "--out", tmp_path], 1, "n_kv_head"),
        (["train", "--data", tmp_path / "missing.txt", "--out", tmp_path], 1, "cannot open"),
        (["train", "--resume", tmp_path / "missing.safetensors", "--out", tmp_path], 1, "missing.safetensors"),
        (["generate", "--checkpoint", tmp_path / "missing.safetensors"], 1, "missing.safetensors"),
        (["generate"], 2, "--checkpoint"),
        (["tokenizer", "train", "--data", tmp_path / "missing.txt", "--out", tmp_path / "t.json"], 1,
         "cannot open"),
        (["tokenizer", "frobnicate"], 2, "frobnicate"),
    ]
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"hello \xff\xfe world")
    cases.append((["train", "--data", binary, "--out", tmp_path], 1, "not UTF-8"))
    corrupt = tmp_path / "corrupt.safetensors"
    ctorch("train", *TINY, "--steps", 1, "--quiet", "--out", tmp_path / "ok")
    good = (tmp_path / "ok" / "checkpoint.safetensors").read_bytes()
    corrupt.write_bytes(good[: len(good) // 2])
    cases.append((["train", "--resume", corrupt, "--out", tmp_path], 1, "safetensors"))
    cases.append((["generate", "--checkpoint", corrupt], 1, "safetensors"))
    config = tmp_path / "bad.json"
    config.write_text('{"n_layers": 2}')
    cases.append((["train", "--config", config, "--out", tmp_path], 1, "n_layers"))
    for args, code, needle in cases:
        r = ctorch(*args, ok=False)
        assert r.returncode == code, (args, r.returncode, r.stderr)
        assert needle in r.stderr, (args, r.stderr)


def test_help():
    for cmd in (["train"], ["generate"], ["tokenizer"], ["bench", "train"]):
        r = ctorch(*cmd, "--help")
        assert r.stdout.startswith("usage: ctorch"), cmd
