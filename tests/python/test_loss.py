"""Fused linear cross-entropy and cross-entropy against PyTorch 2.13's own ops
(F.linear_cross_entropy, with and without nn.LinearCrossEntropyOptions (chunked),
nn.LinearCrossEntropyLoss, F.cross_entropy), forward and every gradient, for every option and
combination. z-loss and softcap have no PyTorch argument: with them the reference is
F.cross_entropy on the capped logits plus the z term in torch maths."""
import inspect
import itertools

import pytest
import torch
import torch.nn.functional as F

import ctorch
import ctorch.torch as ct

torch.manual_seed(0)


def reference(h, w, y, b=None, weight=None, reduction="mean", ignore_index=-100, label_smoothing=0.0,
              z_loss=0.0, softcap=None):
    """PyTorch's F.linear_cross_entropy in float64; with softcap or z_loss (no PyTorch op), the
    logits, F.cross_entropy and the z term."""
    h64, w64 = h.double(), w.double()
    b64 = None if b is None else b.double()
    cw = None if weight is None else weight.double()
    if not softcap and not z_loss:
        return F.linear_cross_entropy(h64, w64, y, linear_bias=b64, weight=cw, reduction=reduction,
                                      ignore_index=ignore_index, label_smoothing=label_smoothing)
    logits = F.linear(h64, w64, b64)
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    loss = F.cross_entropy(logits, y, weight=cw, reduction=reduction, ignore_index=ignore_index,
                           label_smoothing=label_smoothing)
    if z_loss:
        valid = y != ignore_index
        z = z_loss * torch.logsumexp(logits, -1) ** 2 * valid
        if reduction == "none":
            loss = loss + z
        else:
            den = valid.sum() if weight is None else cw[y[valid]].sum()
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


# Budgets for N=300, D=24, V=3000 that select each tiling of the fused loss (the comment in
# src/loss/linear_cross_entropy.c): all rows of full vocabulary at once (default, 64 MiB);
# vocabulary tiles over one block of all 300 tokens, the weight gradient written once
# (320 KiB: ~26 full rows, under the 32-row minimum of full-row blocks); vocabulary tiles over
# several token blocks (40 KiB); blocks of full rows, three GEMMs each (1.5 MiB: ~125 rows,
# over the minimum on a machine of up to 8 CPUs, else tiles again).
TILINGS = [None, 320 << 10, 40 << 10, 1536 << 10]


@pytest.mark.parametrize("scratch", TILINGS)
@pytest.mark.parametrize("cap", [None, 3.0])
def test_tilings_match_torch(scratch, cap):
    """Every tiling against PyTorch 2.13 (F.linear_cross_entropy in float64, or the capped
    logits' cross_entropy plus the z term): loss, lse-based backward and every gradient, with a
    bias, class weights, smoothing, z-loss and ignored rows; the same bits at 1 and 2 threads."""
    torch.manual_seed(5)
    h, w, b, y = make(N=300, D=24, V=3000, bias=True)
    cw = torch.rand(3000) + 0.5
    kw = dict(weight=cw, label_smoothing=0.1, z_loss=1e-3, softcap=cap)
    want = reference(h, w, y, b, **kw)
    up = torch.tensor(0.75)
    ref_grads = grads(want, [h, w, b], up.double())
    runs = []
    for t in (1, 2):
        ctorch.set_num_threads(t)
        got = ct.linear_cross_entropy(h, w, y, linear_bias=b, scratch_bytes=scratch, **kw)
        runs.append([got.detach()] + grads(got, [h, w, b], up))
    ctorch.set_num_threads(2)
    torch.testing.assert_close(runs[0][0].double(), want.detach(), rtol=1e-5, atol=1e-5)
    for a, r in zip(runs[0][1:], ref_grads):
        torch.testing.assert_close(a.double(), r.double(), rtol=1e-4, atol=1e-6)
    for a, c in zip(runs[0], runs[1]):
        assert torch.equal(a, c)


def test_signature_is_pytorchs():
    """Every parameter of F.linear_cross_entropy and nn.LinearCrossEntropyLoss is accepted by
    name, with the same kind and default (ctorch's extras come after them)."""
    for theirs, ours in ((F.linear_cross_entropy, ct.linear_cross_entropy),
                         (torch.nn.LinearCrossEntropyLoss.__init__, ct.LinearCrossEntropyLoss.__init__),
                         (torch.nn.LinearCrossEntropyLoss.forward, ct.LinearCrossEntropyLoss.forward)):
        tp, op = inspect.signature(theirs).parameters, inspect.signature(ours).parameters
        assert list(op)[:len(tp)] == list(tp), (list(op), list(tp))
        for name, p in tp.items():
            assert op[name].kind == p.kind and op[name].default == p.default, name


@pytest.mark.parametrize("options", [None, "default", "chunk5", "aspect"])
def test_drop_in_with_options(options):
    """F.linear_cross_entropy with LinearCrossEntropyOptions (PyTorch's chunked path) and without:
    ctorch takes the same call and gives the same loss and gradients."""
    opts = {None: None, "default": torch.nn.LinearCrossEntropyOptions(),
            "chunk5": torch.nn.LinearCrossEntropyOptions(batch_chunk_size=5, chunking_method=None),
            "aspect": torch.nn.LinearCrossEntropyOptions(chunking_method="aspect_ratio:2",
                                                         acc_policy="accurate")}[options]
    h, w, b, y = make(N=40, D=16, V=300, bias=True)
    cw = torch.rand(300) + 0.5
    y5 = torch.where(y == -100, 5, y)
    # (label smoothing makes PyTorch leave its chunked path, with a warning: test_matches_torch has it)
    for t, kw in ((y, dict()), (y, dict(weight=cw, reduction="sum")),
                  (y5, dict(ignore_index=5, reduction="none"))):
        args = dict(linear_bias=b, options=opts, **kw)
        want = F.linear_cross_entropy(h, w, t, **args)
        got = ct.linear_cross_entropy(h, w, t, **args)
        assert got.shape == want.shape and got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        up = torch.rand(want.shape) + 0.5
        for a, r in zip(grads(got, [h, w, b], up), grads(want, [h, w, b], up)):
            torch.testing.assert_close(a, r, rtol=1e-4, atol=1e-6)


def test_module_is_nn_linear_cross_entropy_loss():
    """ct.LinearCrossEntropyLoss: nn.LinearCrossEntropyLoss's constructor, parameters,
    state_dict and forward(input, target); the same loss and gradients after loading torch's
    weights."""
    torch.manual_seed(3)
    cw = torch.rand(61) + 0.5
    for kw in (dict(), dict(bias=True, label_smoothing=0.05, weight=cw, ignore_index=7),
               dict(bias=True, reduction="none", options=torch.nn.LinearCrossEntropyOptions(batch_chunk_size=4))):
        theirs = torch.nn.LinearCrossEntropyLoss(17, 61, **kw)
        ours = ct.LinearCrossEntropyLoss(17, 61, **kw)
        assert list(ours.state_dict()) == list(theirs.state_dict())
        ours.load_state_dict(theirs.state_dict())
        h = torch.randn(2, 5, 17, requires_grad=True)  # batched input [B, T, D], target [B, T]
        y = torch.randint(0, 61, (2, 5))
        y[0, 1] = 7
        want, got = theirs(h.reshape(-1, 17), y.reshape(-1)), ours(h, y)
        torch.testing.assert_close(got.reshape(want.shape), want, rtol=1e-5, atol=1e-6)
        up = torch.rand(want.shape)
        gw = torch.autograd.grad(want, [h] + list(theirs.parameters()), up)
        go = torch.autograd.grad(got, [h] + list(ours.parameters()), up.reshape(got.shape))
        for a, r in zip(go, gw):
            torch.testing.assert_close(a, r, rtol=1e-4, atol=1e-6)
    with pytest.raises(RuntimeError):
        ct.LinearCrossEntropyLoss(17, 61, weight=torch.ones(3))


def test_bf16_inputs():
    h, w, _, y = make(dtype=torch.bfloat16)
    got = ct.linear_cross_entropy(h, w, y)
    want = F.linear_cross_entropy(h.float(), w.float(), y)
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
    torch.testing.assert_close(got, F.linear_cross_entropy(h, w, y2, ignore_index=5), rtol=1e-5, atol=1e-6)


def test_all_ignored_mean_is_nan_and_grad_zero():
    h, w, _, y = make()
    y[:] = -100
    got = ct.linear_cross_entropy(h, w, y)
    assert torch.isnan(got) and torch.isnan(F.linear_cross_entropy(h, w, y))
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
    ref = F.linear_cross_entropy(emb(ids), emb.weight, y)
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


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_k_dimensional_loss(reduction):
    """linear_weight [C, d1, d2, D] (PyTorch 2.13's K-dimensional loss): the same loss and
    gradients as F.linear_cross_entropy, with a bias, class weights, ignored targets and label
    smoothing; and nn.LinearCrossEntropyLoss(out_features=...) with torch's weights loaded."""
    torch.manual_seed(11)
    N, D, Cn, outf = 7, 9, 13, (3, 2)
    h = torch.randn(N, D, requires_grad=True)
    w = (torch.randn(Cn, *outf, D) * 0.4).requires_grad_()
    b = (torch.randn(Cn, *outf) * 0.3).requires_grad_()
    y = torch.randint(0, Cn, (N, *outf))
    y[0, 1, 1] = y[3, 0, 0] = -100
    cw = torch.rand(Cn) + 0.5
    for kw in (dict(), dict(weight=cw, label_smoothing=0.1)):
        want = F.linear_cross_entropy(h, w, y, linear_bias=b, reduction=reduction, **kw)
        got = ct.linear_cross_entropy(h, w, y, linear_bias=b, reduction=reduction, **kw)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        up = torch.rand(want.shape) + 0.5
        for a, r in zip(grads(got, [h, w, b], up), grads(want, [h, w, b], up)):
            torch.testing.assert_close(a, r, rtol=1e-4, atol=1e-6)
    theirs = torch.nn.LinearCrossEntropyLoss(D, Cn, out_features=outf, bias=True, reduction=reduction)
    ours = ct.LinearCrossEntropyLoss(D, Cn, out_features=outf, bias=True, reduction=reduction)
    ours.load_state_dict(theirs.state_dict())
    torch.testing.assert_close(ours(h, y), theirs(h, y), rtol=1e-5, atol=1e-5)
