"""ctorch's model with the Hugging Face Llama-family features (head_dim != d_model / n_head,
Qwen2's q/k/v biases, Llama's attention_bias, llama3 and linear rope_scaling, GQA, tied and
untied heads) against the reference maths of tests/python/hf_reference.py in PyTorch 1.13:
logits and every gradient within 1e-4."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reference as ref  # noqa: E402

from ctorch import models  # noqa: E402

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}

CONFIGS = {
    "llama": ref.llama_config(),
    "llama-llama3-rope": ref.llama_config(rope_scaling=LLAMA3, rope_theta=500000.0, head_dim=16),
    "llama-linear-rope-bias": ref.llama_config(rope_scaling={"type": "linear", "factor": 2.0},
                                               attention_bias=True, tie_word_embeddings=True),
    "llama-mha-headdim": ref.llama_config(num_key_value_heads=4, head_dim=12),
    "qwen2": ref.qwen2_config(),
}


def rel_close(ours, want, tol=1e-4):
    scale = want.abs().max().item()
    assert scale > 0
    err = (ours - want).abs().max().item()
    return err <= tol * scale, err / scale


def tokens(cfg, B, T, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg["vocab_size"], (B, T), generator=g)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_and_gradients_match_reference(name):
    cfg = CONFIGS[name]
    w = {k: v.requires_grad_() for k, v in ref.random_weights(cfg, seed=3).items()}
    m = models.Model(ref.ctorch_config(cfg))
    m.set_weights({k: v.detach() for k, v in ref.to_ctorch(cfg, w).items()})
    # logits: [B, T] -> [B, T, V]; the llama3 frequencies fall in all three regions
    ids = tokens(cfg, 3, 24, 1)
    want = ref.forward(cfg, w, ids).detach()
    got = m.forward(ids)
    assert got.shape == want.shape and got.dtype == torch.float32
    ok, err = rel_close(got, want)
    assert ok, f"logits: relative error {err:.2e}"
    # every gradient of the mean next-token loss
    tok = tokens(cfg, 2, 21, 2)
    loss = ref.loss(cfg, w, tok)
    loss.backward()
    ours_loss, grads = m.loss_and_grads(tok)
    assert abs(ours_loss - loss.item()) <= 1e-5 * abs(loss.item())
    hg = ref.grads_to_hf(cfg, grads)
    assert set(hg) == set(w)
    for k, p in w.items():
        ok, err = rel_close(hg[k], p.grad)
        assert ok, f"{k}: relative error {err:.2e}"


def test_scaling_changes_the_logits():
    """The oracle can fail: without the llama3 scaling the logits differ beyond tolerance."""
    cfg = CONFIGS["llama-llama3-rope"]
    w = ref.random_weights(cfg, seed=3)
    plain = dict(cfg, rope_scaling=None)
    m = models.Model(ref.ctorch_config(plain))
    m.set_weights(ref.to_ctorch(plain, w))
    ids = tokens(cfg, 1, 24, 1)
    ok, _ = rel_close(m.forward(ids), ref.forward(cfg, w, ids))
    assert not ok


def test_bad_input():
    cfg = CONFIGS["qwen2"]
    m = models.Model(ref.ctorch_config(cfg))
    with pytest.raises(Exception, match="outside the vocabulary"):
        m.forward(torch.tensor([[0, cfg["vocab_size"]]]))
    with pytest.raises(ValueError, match="context"):
        m.forward(torch.zeros(1, cfg["max_position_embeddings"] + 1, dtype=torch.int64))
    with pytest.raises(Exception, match="head_dim"):
        models.Model(dict(ref.ctorch_config(cfg), head_dim=7))
    with pytest.raises(Exception, match="rope_scaling"):
        models.Model(dict(ref.ctorch_config(cfg), rope_scaling="yarn"))
