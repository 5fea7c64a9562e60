"""ctorch train / generate / tokenizer through the CLI: the loss and every parameter gradient
against the same model in PyTorch (built from ctorch's weights), bit-exact resume, the same
bits at 1 and 2 threads, text data with a BPE tokenizer, and errors on bad input."""
import ctypes
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


# ---- --dtype bf16 (mixed precision: bf16 GEMM operands, f32 everything else) ---------------------

BF16_EPS = 2.0 ** -8  # bf16's relative spacing (8 significant bits): one rounding is within half of it


def _r(x):
    """x rounded to bf16 (PyTorch's round-to-nearest-even) and widened back to f32."""
    return x.to(torch.bfloat16).to(torch.float32)


class _Bf16Matmul(torch.autograd.Function):
    """ctorch's --dtype bf16 policy for one linear layer, in PyTorch's ops: both operands rounded
    to bf16, their products summed in f32 (a product of two bf16 values is exact in f32); in the
    backward the output gradient is rounded too and both gradient GEMMs take bf16 operands."""

    @staticmethod
    def forward(ctx, a, w, round_grad):
        ctx.save_for_backward(a, w)
        ctx.round_grad = round_grad
        return _r(a) @ _r(w)

    @staticmethod
    def backward(ctx, g):
        a, w = ctx.saved_tensors
        if ctx.round_grad:
            g = _r(g)
        return (g @ _r(w).transpose(-1, -2),
                _r(a).reshape(-1, a.shape[-1]).t() @ g.reshape(-1, g.shape[-1]), None)


class _Bf16Policy(torch.overrides.TorchFunctionMode):
    """Every `activation @ weight.t()` of torch_train.GPT (the right operand 2-D: the linear
    layers and the head) through _Bf16Matmul; attention's batched matmuls stay f32. The fused
    loss never forms the logits' gradient, so the head's is not rounded there (fused_vocab: the
    vocabulary size of a fused head; None: the unfused head, whose dlogits are rounded)."""

    def __init__(self, fused_vocab=None):
        super().__init__()
        self.fused_vocab = fused_vocab

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") in ("__matmul__", "matmul") and len(args) == 2 and args[1].dim() == 2:
            head = self.fused_vocab is not None and args[1].shape[1] == self.fused_vocab
            return _Bf16Matmul.apply(args[0], args[1], not head)
        return func(*args, **kwargs)


def _grads(model, tokens, tr, ctx=None):
    for p in model.parameters():
        p.grad = None
    if ctx is None:
        loss = model(tokens, tr["eos_token"], tr["z_loss"], tr["label_smoothing"])
    else:
        with ctx:
            loss = model(tokens, tr["eos_token"], tr["z_loss"], tr["label_smoothing"])
    loss.float().backward()
    return loss.item(), {k: p.grad.clone().numpy() for k, p in model.named().items()}


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("extra", [
    ["--window", 6, "--z-loss", 1e-3],                                        # fused head, flex, tied
    ["--untied", "--unfused-head", "--dense-attention", "--no-doc-mask"],     # the baselines
])
def test_bf16_loss_and_gradients_match_pytorch(tmp_path, extra):
    """The first micro-batch's loss and every gradient of `--dtype bf16` against PyTorch 2.13 on
    the same weights: (1) the policy in PyTorch's ops (_Bf16Policy: operands rounded as ctorch
    rounds them) within f32 summation-order noise, and (2) torch.autocast("cpu", bfloat16), which
    also rounds each linear's output and attention's operands to bf16, within the distance bf16
    rounding puts between autocast and f32."""
    dump = tmp_path / "bf16.safetensors"
    ctorch("train", *TINY, *extra, "--dtype", "bf16", "--out", tmp_path, "--dump-grads", dump)
    model, tokens, tr, meta = torch_train.load(str(dump))
    assert tr["dtype"] == "bf16"
    tensors, _ = torch_train.read_safetensors(str(dump))
    ours = {k[5:]: v for k, v in tensors.items() if k.startswith("grad.")}
    loss = float(meta["loss"])
    f32_loss, f32 = _grads(model, tokens, tr)
    fused = tr["fused_head"]
    pol_loss, pol = _grads(model, tokens, tr, _Bf16Policy(model.cfg["vocab_size"] if fused else None))
    auto_loss, auto = _grads(model, tokens, tr, torch.autocast("cpu", dtype=torch.bfloat16))
    assert ours.keys() == f32.keys()
    # (1) the same roundings as ctorch's. What is left starts as f32 summation order (1e-7), but
    # rounding is discontinuous: an operand that lands on the other side of a bf16 boundary
    # moves what follows by 2^-9, and later roundings cascade from it (measured: ours is
    # 0.04-0.14 of the policy's distance from f32, loss within 5e-6). A different policy (an
    # operand left f32, an output rounded) is as far as the policy is from f32.
    assert abs(loss - pol_loss) <= 2e-5 * abs(pol_loss)
    for k in f32:
        assert _rel(ours[k], pol[k]) <= 0.3 * _rel(pol[k], f32[k]), \
            f"{k}: {_rel(ours[k], pol[k]):.2e} from the bf16 policy, which is {_rel(pol[k], f32[k]):.2e} from f32"
    # bf16 is in effect: ours is as far from f32 as the policy is, not at f32's noise
    assert abs(loss - f32_loss) > 1e-6 * f32_loss or any(_rel(ours[k], f32[k]) > 1e-3 for k in f32)
    # (2) autocast: each of ours and autocast's is a bf16 perturbation of the f32 result; ours
    # rounds less (f32 GEMM outputs and attention), so ours is within autocast's distance from
    # f32 (x 1.5 for the sampling of roundings), and the two within the sum of both distances
    assert abs(loss - auto_loss) <= 2 * BF16_EPS * abs(auto_loss)
    for k in f32:
        d_auto = _rel(auto[k], f32[k])
        assert _rel(ours[k], f32[k]) <= 1.5 * d_auto + 1e-4, k
        assert _rel(ours[k], auto[k]) <= 2.5 * d_auto + 1e-4, k


def _bf16_run(tmp_path, name, *args):
    ctorch("train", *TINY, "--steps", 6, "--eval-every", 3, "--quiet", "--dtype", "bf16",
           "--out", tmp_path / name, *args)
    return losses(tmp_path / name / "metrics.jsonl"), params(tmp_path / name / "checkpoint.safetensors")


def test_bf16_same_bits_threads_runs_checkpoint_f32_resume(tmp_path):
    l1, p1 = _bf16_run(tmp_path, "t1", "--threads", 1)
    l2, p2 = _bf16_run(tmp_path, "t2", "--threads", 2)
    l3, p3 = _bf16_run(tmp_path, "t2b", "--threads", 2)
    assert len(l1) == 8 and l1 == l2 == l3  # 6 steps + 2 evaluations, bit for bit
    for k in p1:
        assert p1[k].dtype == np.float32, k  # weights and AdamW moments stay f32 in the checkpoint
        assert np.array_equal(p1[k], p2[k]) and np.array_equal(p1[k], p3[k]), k
    meta = torch_train.read_safetensors(str(tmp_path / "t1" / "checkpoint.safetensors"))[1]
    assert json.loads(meta["train"])["dtype"] == "bf16"
    # resume keeps the checkpoint's dtype: stopped at 3 and resumed, the same bits as straight
    # through (an f32 continuation would differ)
    ctorch("train", *TINY, "--steps", 6, "--eval-every", 3, "--quiet", "--dtype", "bf16",
           "--out", tmp_path / "r", "--stop-at", 3)
    ctorch("train", "--resume", "--out", tmp_path / "r", "--quiet", "--eval-every", 3)
    assert losses(tmp_path / "r" / "metrics.jsonl") == l1
    lf, _ = _bf16_run(tmp_path, "f32", "--dtype", "f32")  # the last --dtype wins: an f32 run
    assert lf != l1
    # --dtype is a training setting: --resume takes it from the checkpoint and refuses the flag
    r = ctorch("train", "--resume", "--out", tmp_path / "r", "--dtype", "f32", ok=False)
    assert r.returncode == 2 and "--dtype" in r.stderr


def test_bf16_bad_dtype_and_cpu_note(tmp_path):
    for bad in ("f16", "bfloat16x", ""):
        r = ctorch("train", *TINY, "--dtype", bad, "--out", tmp_path, ok=False)
        assert r.returncode == 2 and "--dtype must be f32 or bf16" in r.stderr, r.stderr
    from ctorch._lib import lib
    lib.ct_cpu_has_bf16.restype = ctypes.c_bool
    r = ctorch("train", *TINY, "--steps", 2, "--quiet", "--dtype", "bf16", "--out", tmp_path / "n")
    note = r.stderr.count("no bf16 dot-product instructions")
    assert note == (0 if lib.ct_cpu_has_bf16() else 1), r.stderr  # said once, even with --quiet
    assert "bf16" not in ctorch("train", *TINY, "--steps", 2, "--quiet", "--out", tmp_path / "f").stderr


def test_bf16_loss_curve_within_noise_of_f32(tmp_path):
    """40 steps of the built-in corpus: bf16 beside f32 with the same seed (same data, same
    initial weights) against the noise of the run itself, f32 with another seed. Per step the
    bf16 curve must stay closer to its f32 twin than two f32 seeds are to each other, and the
    final held-out loss within that seed-to-seed spread (at least 1% of the loss)."""
    run = [*TINY, "--d-model", 48, "--heads", 4, "--ffn", 96, "--steps", 40, "--eval-every", 40,
           "--quiet", "--window", 8]
    curves = {}
    for name, extra in (("f32", []), ("bf16", ["--dtype", "bf16"]), ("f32s2", ["--seed", 2])):
        ctorch("train", *run, *extra, "--out", tmp_path / name)
        curves[name] = {k: float(v) for k, v in losses(tmp_path / name / "metrics.jsonl").items()}
    steps = [k for k in curves["f32"] if isinstance(k, int)]
    assert len(steps) == 40
    f, b, s = (np.array([curves[n][k] for k in steps]) for n in ("f32", "bf16", "f32s2"))
    assert f[-5:].mean() < f[:5].mean() - 0.5  # it learns: the comparison is about a real curve
    noise = np.abs(f - s).mean()
    assert np.abs(b - f).mean() < 0.5 * noise, (np.abs(b - f).mean(), noise)
    ev = {n: curves[n][("eval", 40)] for n in curves}
    spread = max(abs(ev["f32"] - ev["f32s2"]), 0.01 * ev["f32"])
    assert abs(ev["bf16"] - ev["f32"]) <= spread, (ev, spread)


def test_bf16_python_binding():
    """ctorch.models.Model(dtype=torch.bfloat16): the loss and gradients of the bf16 policy
    (_Bf16Policy over torch_train.GPT on the same weights, dense causal attention), logits near
    f32's and not equal to them, weights set between calls seen, and a bad dtype refused."""
    from ctorch import models
    cfg = {"vocab_size": 64, "context": 16, "n_layer": 2, "d_model": 32, "n_head": 4, "n_kv_head": 2,
           "d_ff": 48, "init_std": 0.2}
    m32, m16 = models.Model(cfg, seed=5), models.Model(cfg, seed=5, dtype=torch.bfloat16)
    tokens = torch.randint(0, 64, (2, 13), generator=torch.Generator().manual_seed(0))
    l32, l16 = m32(tokens[:, :-1]), m16(tokens[:, :-1])
    assert not torch.equal(l32, l16) and (l32 - l16).abs().max() < 0.05 * l32.abs().max()
    w = m16.state_dict()
    w["norm.weight"] = w["norm.weight"] * 2
    m16.set_weights(w)
    assert not torch.equal(m16(tokens[:, :-1]), l16)  # the bf16 copy follows the f32 weights
    loss, grads = m16.loss_and_grads(tokens)
    ref = torch_train.GPT(dict(m16.config), {k: v.numpy() for k, v in w.items()})
    tr = {"eos_token": -1, "z_loss": 0.0, "label_smoothing": 0.0}
    f32_loss, f32 = _grads(ref, tokens, tr)
    pol_loss, pol = _grads(ref, tokens, tr, _Bf16Policy(64))
    assert abs(loss - pol_loss) <= 2e-5 * pol_loss and abs(loss - f32_loss) > 1e-6 * f32_loss
    for k in pol:
        assert _rel(grads[k].numpy(), pol[k]) <= 0.3 * _rel(pol[k], f32[k]), k
    with pytest.raises(ValueError, match="dtype"):
        models.Model(cfg, dtype=torch.float16)
