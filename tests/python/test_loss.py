"""Fused linear cross-entropy and cross-entropy against PyTorch 1.13 (F.linear +
F.cross_entropy), forward and every gradient, for every option and combination. z-loss
and softcap have no PyTorch argument: their reference is written in torch maths."""
import itertools

import pytest
import torch
import torch.nn.functional as F

import ctorch
import ctorch.torch as ct

torch.manual_seed(0)


def reference(h, w, y, b=None, weight=None, reduction="mean", ignore_index=-100, label_smoothing=0.0,
              z_loss=0.0, softcap=None):
    logits = F.linear(h.double(), w.double(), None if b is None else b.double())
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    loss = F.cross_entropy(logits, y, weight=None if weight is None else weight.double(), reduction=reduction,
                           ignore_index=ignore_index, label_smoothing=label_smoothing)
    if z_loss:
        valid = y != ignore_index
        z = z_loss * torch.logsumexp(logits, -1) ** 2 * valid
        if reduction == "none":
            loss = loss + z
        else:
            den = valid.sum() if weight is None else weight.double()[y[valid]].sum()
            loss = loss + (z.sum() / den if reduction == "mean" else z.sum())
    return loss


def make(N=29, D=17, V=61, bias=False, dtype=torch.float32):
    h = torch.randn(N, D, dtype=dtype, requires_grad=True)
    w = (torch.randn(V, D) * 0.4).to(dtype).requires_grad_()
    b = (torch.randn(V) * 0.3).requires_grad_() if bias else None
    y = torch.randint(0, V, (N,))
    y[::7] = -100
    return h, w, b, y


def grads(loss, params, upstream):
    loss.backward(upstream)
    out = [p.grad.clone() if p is not None and p.grad is not None else None for p in params]
    for p in params:
        if p is not None:
            p.grad = None
    return out


CASES = list(itertools.product(["mean", "sum", "none"], [0.0, 0.1], [False, True], [False, True],
                               [0.0, 1e-2], [None, 3.0]))


@pytest.mark.parametrize("reduction,smoothing,weighted,bias,z,cap", CASES)
def test_matches_torch(reduction, smoothing, weighted, bias, z, cap):
    h, w, b, y = make(bias=bias)
    cw = torch.rand(w.shape[0]) + 0.5 if weighted else None
    kw = dict(weight=cw, reduction=reduction, label_smoothing=smoothing, z_loss=z, softcap=cap)
    got = ct.linear_cross_entropy(h, w, y, linear_bias=b, **kw)
    want = reference(h, w, y, b, **kw)
    assert got.shape == want.shape
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    up = torch.rand(want.shape) + 0.5
    g1 = grads(got, [h, w, b], up)
    g2 = grads(want, [h, w, b], up.double())
    for a, r in zip(g1, g2):
        if r is not None:
            torch.testing.assert_close(a.double(), r.double(), rtol=1e-4, atol=1e-6)


def test_small_scratch_budget_same_result():
    h, w, b, y = make(N=40, D=8, V=300, bias=True)
    a = ct.linear_cross_entropy(h, w, y, linear_bias=b, label_smoothing=0.1)
    ga = grads(a, [h, w, b], None)
    c = ct.linear_cross_entropy(h, w, y, linear_bias=b, label_smoothing=0.1, scratch_bytes=8192)
    gc = grads(c, [h, w, b], None)
    torch.testing.assert_close(a, c, rtol=1e-6, atol=1e-6)
    for x, z in zip(ga, gc):
        torch.testing.assert_close(x, z, rtol=1e-5, atol=1e-7)


def test_drop_in_for_pytorch_names_and_module():
    h, w, _, y = make()
    want = F.cross_entropy(F.linear(h, w), y, label_smoothing=0.05)
    loss_fn = ct.LinearCrossEntropyLoss(label_smoothing=0.05)
    torch.testing.assert_close(loss_fn(h, w, y), want, rtol=1e-5, atol=1e-6)
    # batched input [B, T, D] with target [B, T]
    h3 = torch.randn(2, 5, 17, requires_grad=True)
    y3 = torch.randint(0, 61, (2, 5))
    got = ct.linear_cross_entropy(h3, w, y3)
    torch.testing.assert_close(got, F.cross_entropy(F.linear(h3, w).reshape(-1, 61), y3.reshape(-1)),
                               rtol=1e-5, atol=1e-6)
    got.backward()
    assert h3.grad.shape == h3.shape


def test_bf16_inputs():
    h, w, _, y = make(dtype=torch.bfloat16)
    got = ct.linear_cross_entropy(h, w, y)
    want = F.cross_entropy(F.linear(h.float(), w.float()), y)
    assert got.dtype == torch.bfloat16  # returned in the input's dtype, like PyTorch
    torch.testing.assert_close(got.float(), want, rtol=8e-3, atol=1e-4)
    gh, gw = torch.autograd.grad(got, [h, w])
    rh, rw = torch.autograd.grad(want, [h, w])
    assert gh.dtype == torch.bfloat16 and gw.dtype == torch.bfloat16
    torch.testing.assert_close(gh.float(), rh.float(), rtol=2e-2, atol=1e-3)
    torch.testing.assert_close(gw.float(), rw.float(), rtol=2e-2, atol=1e-3)


def test_int32_targets_and_ignore_index():
    h, w, _, y = make()
    y2 = y.clone()
    y2[y2 == -100] = 5
    got = ct.linear_cross_entropy(h, w, y2.int(), ignore_index=5)
    torch.testing.assert_close(got, F.cross_entropy(F.linear(h, w), y2, ignore_index=5), rtol=1e-5, atol=1e-6)


def test_all_ignored_mean_is_nan_and_grad_zero():
    h, w, _, y = make()
    y[:] = -100
    got = ct.linear_cross_entropy(h, w, y)
    assert torch.isnan(got) and torch.isnan(F.cross_entropy(F.linear(h, w), y))
    s = ct.linear_cross_entropy(h, w, y, reduction="sum")
    s.backward()
    assert s.item() == 0 and not h.grad.any() and not w.grad.any()


def test_z_loss_is_reported_separately():
    h, w, _, y = make()
    loss, z = ct.linear_cross_entropy(h, w, y, z_loss=1e-3, return_z_loss=True)
    plain = ct.linear_cross_entropy(h, w, y)
    torch.testing.assert_close(loss - z, plain, rtol=1e-5, atol=1e-6)
    assert z.item() > 0


def test_weight_tying_accumulates():
    emb = torch.nn.Embedding(61, 17)
    ids = torch.randint(0, 61, (29,))
    y = torch.randint(0, 61, (29,))
    h = emb(ids)
    loss = ct.linear_cross_entropy(h, emb.weight, y)
    loss.backward()
    g = emb.weight.grad.clone()
    emb.weight.grad = None
    ref = F.cross_entropy(F.linear(emb(ids), emb.weight), y)
    ref.backward()
    torch.testing.assert_close(g, emb.weight.grad, rtol=1e-4, atol=1e-6)


def test_cross_entropy_on_logits():
    x = torch.randn(13, 9, requires_grad=True)
    y = torch.randint(0, 9, (13,))
    y[3] = -100
    for red in ["mean", "sum", "none"]:
        got = ct.cross_entropy(x, y, reduction=red, label_smoothing=0.2)
        want = F.cross_entropy(x, y, reduction=red, label_smoothing=0.2)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        up = torch.rand(want.shape)
        torch.testing.assert_close(torch.autograd.grad(got, x, up)[0], torch.autograd.grad(want, x, up)[0],
                                   rtol=1e-4, atol=1e-6)


def test_bad_target_raises_with_message():
    h, w, _, y = make()
    y[4] = 61
    with pytest.raises(ctorch.CtorchError, match=r"target\[4\] = 61"):
        ct.linear_cross_entropy(h, w, y)
    with pytest.raises(ctorch.CtorchError, match="label_smoothing"):
        ct.linear_cross_entropy(h, w, torch.zeros(29, dtype=torch.long), label_smoothing=2.0)
    with pytest.raises(ValueError):
        ct.linear_cross_entropy(h, w, y, reduction="avg")


def test_deterministic_across_threads():
    h, w, b, y = make(N=70, D=33, V=500, bias=True)
    outs = []
    for t in (1, 2, 1):
        ctorch.set_num_threads(t)
        loss = ct.linear_cross_entropy(h, w, y, linear_bias=b, label_smoothing=0.1)
        outs.append([loss.detach()] + grads(loss, [h, w, b], None))
    ctorch.set_num_threads(2)
    for other in outs[1:]:
        for a, c in zip(outs[0], other):
            assert torch.equal(a, c)
