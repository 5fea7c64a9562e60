"""Sliding-window attention of Hugging Face configs (Mistral's integer "sliding_window", Qwen2's
"use_sliding_window" / "max_window_layers" / "layer_types") against transformers 5.25 holding
the same weights: transformers' sliding_window = S lets a query at q see the keys q - S < kv <= q
(masking_utils), ctorch's window W the keys q - W <= kv <= q, so a directory reads as W = S - 1.
Checked over sequences longer than the window: logits and gradients of transformers' loss,
greedy generation through the KV cache (transformers' generate with its sliding-window cache),
ctorch's HF save read back by transformers (and the off-by-one windows shown to differ, so the
oracle can fail); configurations ctorch cannot express refused by name."""
import json
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reference as ref  # noqa: E402

from ctorch import models  # noqa: E402
from ctorch._lib import CtorchError  # noqa: E402

S = 6  # transformers' sliding_window: each token sees itself and the 5 before it
T = 23  # sequence length, well past the window

MISTRAL = ref.mistral_config(sliding_window=S)
# Qwen2 windows layers max_window_layers and up when use_sliding_window is true: 0 = all
QWEN2 = ref.qwen2_config(use_sliding_window=True, sliding_window=S, max_window_layers=0)


def rel_close(ours, want, tol=1e-4):
    scale = want.abs().max().item()
    assert scale > 0
    err = (ours - want).abs().max().item()
    return err <= tol * scale, err / scale


def tokens(cfg, B, n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, cfg["vocab_size"], (B, n), generator=g)


def saved(tmp_path, cfg, seed=4, name="hf"):
    """A directory save_pretrained wrote for cfg with random weights, and the model transformers
    reads back from it."""
    d = tmp_path / name
    w = ref.random_weights(cfg, seed=seed)
    ref.save_hf(d, cfg, w)
    hm = ref.load(d)
    return d, w, hm


@pytest.mark.parametrize("cfg", [MISTRAL, QWEN2], ids=["mistral", "qwen2"])
def test_window_logits_gradients_and_generation(tmp_path, cfg):
    d, w, hm = saved(tmp_path, cfg)
    assert hm.config.sliding_window == S
    if cfg is QWEN2:
        assert hm.config.layer_types == ["sliding_attention"] * cfg["num_hidden_layers"]
    ids = tokens(cfg, 2, T, 1)
    want = ref.logits(hm, ids)
    # the window changes transformers' logits (the sequence is longer than it) ...
    full = ref.hf_model(dict(cfg, sliding_window=None, use_sliding_window=False)
                        if cfg is QWEN2 else dict(cfg, sliding_window=None), w)
    assert not rel_close(ref.logits(full, ids), want)[0]
    # ... ctorch reads it as window S - 1, in place and into its own weights
    for mmap in (True, False):
        m = models.load(d, mmap=mmap)
        assert m.config["window"] == S - 1
        ok, err = rel_close(m.forward(ids), want)
        assert ok, f"mmap={mmap}: logits relative error {err:.2e}"
    # every gradient of transformers' own loss (the windowed backward)
    tok = tokens(cfg, 2, T + 1, 2)
    loss = ref.loss(hm, tok)
    loss.backward()
    ours_loss, grads = m.loss_and_grads(tok)
    assert abs(ours_loss - loss.item()) <= 1e-5 * abs(loss.item())
    hg, want_g = ref.grads_to_hf(cfg, grads), ref.grads(hm)
    assert set(hg) == set(want_g)
    for k, g in want_g.items():
        ok, err = rel_close(hg[k], g)
        assert ok, f"{k}: relative error {err:.2e}"
    # greedy generation through the KV cache, the prompt and the continuation past the window
    m = models.load(d)
    m.eos_token_id = None
    prompt = tokens(cfg, 2, 9, 3)
    got = m.generate(prompt, 14)
    assert torch.equal(got, ref.greedy(hm, prompt, 14))


def test_window_is_sliding_window_minus_one():
    """The mapping is exact: ctorch models with windows S - 2 and S (one off either way), or no
    window, give other logits than transformers' sliding_window = S; S - 1 the same."""
    cfg = MISTRAL
    w = ref.random_weights(cfg, seed=7, std=0.4)
    want = ref.logits(ref.hf_model(cfg, w), tokens(cfg, 1, T, 5))
    errs = {}
    for win in (0, S - 2, S - 1, S):
        m = models.Model(dict(ref.ctorch_config(cfg), window=win))
        m.set_weights(ref.to_ctorch(cfg, w))
        errs[win] = rel_close(m.forward(tokens(cfg, 1, T, 5)), want)
    assert errs[S - 1][0], errs
    assert not any(errs[k][0] for k in (0, S - 2, S)), errs


@pytest.mark.parametrize("cfg", [MISTRAL, QWEN2], ids=["mistral", "qwen2"])
def test_save_round_trip(tmp_path, cfg):
    """ctorch's HF save of a windowed directory: config.json says sliding_window = S on every
    layer, and transformers reads the model ctorch runs."""
    d, _, _ = saved(tmp_path, cfg)
    m = models.load(d)
    out = tmp_path / "out"
    m.save_hf(out)
    c = ref.config_dict(out)
    assert c["sliding_window"] == S
    if cfg is QWEN2:
        assert c["use_sliding_window"] is True and c["max_window_layers"] == 0
    hm = ref.load(out)
    assert hm.config.sliding_window == S
    ids = tokens(cfg, 2, T, 6)
    ok, err = rel_close(m.forward(ids), ref.logits(hm, ids))
    assert ok, err
    assert models.load(out).config["window"] == S - 1


def test_ctorch_window_model_saves_as_mistral_or_qwen2(tmp_path):
    """A ctorch model with a window and no HF source: saved as MistralForCausalLM (no biases)
    or Qwen2ForCausalLM (q/k/v biases, every layer windowed); LlamaForCausalLM has no window
    and is refused by name; a Mistral save without a window writes sliding_window null (not
    MistralConfig's default 4096)."""
    W = 4
    plain = dict(ref.ctorch_config(ref.mistral_config()), window=W)
    m = models.Model(plain)
    m.set_weights(ref.to_ctorch(ref.mistral_config(), ref.random_weights(ref.mistral_config(), 2)))
    m.save_hf(tmp_path / "m")
    c = ref.config_dict(tmp_path / "m")
    assert c["architectures"] == ["MistralForCausalLM"] and c["sliding_window"] == W + 1
    ids = tokens(ref.mistral_config(), 2, T, 8)
    ok, err = rel_close(m.forward(ids), ref.logits(ref.load(tmp_path / "m"), ids))
    assert ok, err
    with pytest.raises(CtorchError, match=r'"window" = 4 .*LlamaForCausalLM'):
        m.save_hf(tmp_path / "l", arch="llama")
    assert not os.path.exists(tmp_path / "l")
    q = ref.qwen2_config()
    mq = models.Model(dict(ref.ctorch_config(q), window=W))
    mq.set_weights(ref.to_ctorch(q, ref.random_weights(q, 3)))
    mq.save_hf(tmp_path / "q")
    c = ref.config_dict(tmp_path / "q")
    assert c["architectures"] == ["Qwen2ForCausalLM"] and c["sliding_window"] == W + 1
    hq = ref.load(tmp_path / "q")
    assert hq.config.layer_types == ["sliding_attention"] * q["num_hidden_layers"]
    ok, err = rel_close(mq.forward(ids % q["vocab_size"]), ref.logits(hq, ids % q["vocab_size"]))
    assert ok, err
    nw = models.Model(ref.ctorch_config(ref.mistral_config()))
    nw.save_hf(tmp_path / "n", arch="mistral")
    assert ref.config_dict(tmp_path / "n")["sliding_window"] is None
    assert ref.load(tmp_path / "n").config.sliding_window is None


def test_qwen2_window_on_no_layer_is_full_attention(tmp_path):
    """use_sliding_window true with max_window_layers >= num_hidden_layers windows no layer in
    transformers: ctorch reads no window, with the same logits."""
    cfg = ref.qwen2_config(use_sliding_window=True, sliding_window=S, max_window_layers=2)
    d, _, hm = saved(tmp_path, cfg)
    assert hm.config.layer_types == ["full_attention"] * 2
    m = models.load(d)
    assert m.config["window"] == 0
    ids = tokens(cfg, 1, T, 9)
    ok, err = rel_close(m.forward(ids), ref.logits(hm, ids))
    assert ok, err


def _refused(tmp_path, cfg, mutate, needle):
    d = tmp_path / "bad"
    if not d.exists():
        ref.save_hf(d, cfg, ref.random_weights(cfg, seed=1))
        json.dump(ref.config_dict(d), open(d / "orig.json", "w"))
    c = json.load(open(d / "orig.json"))
    mutate(c)
    json.dump(c, open(d / "config.json", "w"))
    with pytest.raises(CtorchError, match=needle):
        models.load(d)


def test_windows_ctorch_cannot_express_are_refused_by_name(tmp_path):
    def drop_layer_types(c, **kw):
        c.pop("layer_types", None)
        c.update(kw)

    cases = [
        (MISTRAL, lambda c: c.update(sliding_window=1), r'"sliding_window" = 1 \(each token sees itself'),
        (MISTRAL, lambda c: c.update(sliding_window=0), r'"sliding_window" must be >= 1'),
        (MISTRAL, lambda c: c.update(sliding_window=-3), r'"sliding_window" must be >= 1'),
        (MISTRAL, lambda c: c.update(sliding_window="6"), r'"sliding_window" must be an integer'),
        (MISTRAL, lambda c: c.update(sliding_window=6.5), r'"sliding_window" must be an integer'),
        (MISTRAL, lambda c: c.update(layer_types=["full_attention", "sliding_attention"]),
         r'"layer_types" has 1 "sliding_attention" layers of 2, but MistralForCausalLM'),
        (QWEN2, lambda c: c.update(max_window_layers=1, layer_types=["full_attention", "sliding_attention"]),
         r'windows 1 of the 2 layers \("layer_types"\)'),
        (QWEN2, lambda c: drop_layer_types(c, max_window_layers=1),
         r'windows 1 of the 2 layers \(layers from "max_window_layers" on\)'),
        (QWEN2, lambda c: drop_layer_types(c, max_window_layers="1"), r'"max_window_layers" must be an integer'),
        (QWEN2, lambda c: c.update(use_sliding_window=False), r'"layer_types" has "sliding_attention" layers'),
        (QWEN2, lambda c: c.update(use_sliding_window="yes"), r'"use_sliding_window" must be true or false'),
        (QWEN2, lambda c: c.update(sliding_window=1), r'"sliding_window" = 1'),
    ]
    for i, (cfg, mutate, needle) in enumerate(cases):
        sub = tmp_path / str(i if cfg is MISTRAL else 100 + i)
        os.makedirs(sub, exist_ok=True)
        _refused(sub, cfg, mutate, needle)


def test_qwen2_without_window_ignores_sliding_keys(tmp_path):
    """Qwen2.5's own config.json: use_sliding_window false with sliding_window 131072 and
    max_window_layers 28 (transformers drops the window): no window, transformers' logits."""
    cfg = ref.qwen2_config()
    d, _, hm = saved(tmp_path, cfg)
    c = ref.config_dict(d)
    c.pop("layer_types", None)
    c.update(use_sliding_window=False, sliding_window=131072, max_window_layers=28)
    json.dump(c, open(d / "config.json", "w"))
    hm = ref.load(d)
    assert hm.config.sliding_window is None
    m = models.load(d)
    assert m.config["window"] == 0
    ids = tokens(cfg, 1, T, 10)
    ok, err = rel_close(m.forward(ids), ref.logits(hm, ids))
    assert ok, err
