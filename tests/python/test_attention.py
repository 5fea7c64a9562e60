"""ctorch.torch.flex_attention / create_block_mask against PyTorch 2.13's own
torch.nn.attention.flex_attention (eager, float64: output and lse) and create_block_mask (the
block structure), for every built-in mask and score mod, GQA, cross lengths, odd lengths, bf16,
a Python mask_mod, ctorch train's masks at its block sizes (the trimmed partial tiles), and
determinism across runs and thread counts.

Gradients: 2.13's flex_attention has no backward on the CPU (NotImplementedError, eager or
compiled), so they come from F.scaled_dot_product_attention's autograd over the dense mask
where there is no score_mod and every query row has a key, else from explicit softmax attention
in float64 whose forward is first checked against flex_attention. Eager flex_attention is the
oracle (compiling it on the CPU takes ~40 s a call shape; its results are the same maths)."""
import pytest
import torch
import torch.nn.attention.flex_attention as TF
import torch.nn.functional as F

import ctorch
from ctorch.torch import (and_masks, create_block_mask, create_mask, flex_attention, mask_mods, not_mask,
                          or_masks, score_mods)

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def torch_flex(q, k, v, score_mod=None, mask_mod=None, B=None, H=None, block=128):
    """PyTorch 2.13's flex_attention (eager, CPU) with its own block mask of the same mask_mod:
    (out, lse). ctorch's mask and score mods are PyTorch-style callables, so they go in as is."""
    L, S = q.shape[2], k.shape[2]
    bm = TF.create_block_mask(mask_mod, B, H, L, S, device="cpu", BLOCK_SIZE=block) if mask_mod is not None else None
    with torch.no_grad():
        out, aux = TF.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm, enable_gqa=q.shape[1] != k.shape[1],
                                     return_aux=TF.AuxRequest(lse=True))
    return out, aux.lse


def ref_attention(q, k, v, score_mod=None, mask_mod=None, scale=None):
    """Explicit attention (for gradients where PyTorch has no CPU backward); fully masked rows
    give 0 (and lse -inf), as flex_attention."""
    B, Hq, L, E = q.shape
    S, G = k.shape[2], Hq // k.shape[1]
    k = k.repeat_interleave(G, dim=1)
    v = v.repeat_interleave(G, dim=1)
    scale = 1.0 / E ** 0.5 if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * scale
    b = torch.arange(B).view(B, 1, 1, 1)
    h = torch.arange(Hq).view(1, Hq, 1, 1)
    qi = torch.arange(L).view(1, 1, L, 1)
    kv = torch.arange(S).view(1, 1, 1, S)
    if score_mod is not None:
        s = score_mod(s, b, h, qi, kv)
    m = create_mask(mask_mod, B, Hq, L, S) if mask_mod is not None else torch.ones(B, Hq, L, S, dtype=torch.bool)
    any_ = m.any(-1, keepdim=True)
    s = s.masked_fill(~(m | ~any_), float("-inf"))
    p = torch.softmax(s, -1) * any_
    lse = torch.where(any_.squeeze(-1), torch.logsumexp(s, -1), torch.full((), float("-inf")))
    return p @ v, lse


def inputs(B, Hq, Hkv, L, S, E, Ev, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g).to(dtype).requires_grad_()  # noqa: E731
    return mk(B, Hq, L, E), mk(B, Hkv, S, E), mk(B, Hkv, S, Ev), torch.randn(B, Hq, L, Ev, generator=g)


def compare(q, k, v, dout, mask_mod=None, score_mod=None, block=16, B=None, H=None, tol=1e-4, extra=()):
    L, S = q.shape[2], k.shape[2]
    bm = create_block_mask(mask_mod, B, H, L, S, BLOCK_SIZE=block) if mask_mod is not None else None
    gqa = q.shape[1] != k.shape[1]
    out, aux = flex_attention(q, k, v, score_mod=score_mod, block_mask=bm, enable_gqa=gqa,
                              return_aux=TF.AuxRequest(lse=True))  # PyTorch 2.13's keyword
    lse = aux.lse
    grads = torch.autograd.grad(out, (q, k, v) + tuple(extra), dout)
    qr, kr, vr = (x.detach().double().requires_grad_() for x in (q, k, v))
    ex = tuple(e.detach().double().requires_grad_() for e in extra)
    sm = score_mod
    if extra:  # the relative-bias table: the reference differentiates its own copy
        sm = score_mods.relative_bias(ex[0])
    # forward: PyTorch's flex_attention
    to, tl = torch_flex(qr.detach(), kr.detach(), vr.detach(), sm, mask_mod, B, H)
    torch.testing.assert_close(out.double(), to, atol=tol, rtol=tol)
    torch.testing.assert_close(lse.double(), tl, atol=tol, rtol=tol)
    # gradients: SDPA's autograd where it applies, else the explicit attention (checked first)
    dense = create_mask(mask_mod, B or 1, H or 1, L, S) if mask_mod is not None else None
    if sm is None and (dense is None or bool(dense.any(-1).all())):
        ro = F.scaled_dot_product_attention(qr, kr, vr, attn_mask=dense, enable_gqa=gqa)
    else:
        ro, rl = ref_attention(qr, kr, vr, sm, mask_mod)
        torch.testing.assert_close(ro.detach(), to, atol=1e-10, rtol=1e-10)
    rgrads = torch.autograd.grad(ro, (qr, kr, vr) + ex, dout.double())
    for a, r, n in zip(grads, rgrads, ("dq", "dk", "dv", "dtable")):
        torch.testing.assert_close(a.double(), r, atol=tol, rtol=tol, msg=lambda m: f"{n}: {m}")
    return bm


DOCS = torch.tensor([0] * 11 + [1] * 29 + [2] + [3] * 39)

MASKS = {
    "causal": lambda: mask_mods.causal(),
    "sliding": lambda: mask_mods.sliding_window(20),
    "sliding_two_sided": lambda: mask_mods.sliding_window(7, causal=False),
    "prefix_lm": lambda: mask_mods.prefix_lm(13),
    "document": lambda: mask_mods.document(DOCS),
    "document_causal": lambda: and_masks(mask_mods.document(DOCS), mask_mods.causal()),
    "or": lambda: or_masks(mask_mods.sliding_window(5, causal=False), mask_mods.prefix_lm(9)),
    "not_causal": lambda: not_mask(mask_mods.causal()),
    "noop": lambda: mask_mods.noop(),
}


@pytest.mark.parametrize("name", sorted(MASKS))
def test_builtin_masks(name):
    q, k, v, do = inputs(1, 2, 2, 80, 80, 16, 16)
    compare(q, k, v, do, MASKS[name]())


@pytest.mark.parametrize("mod", ["softcap", "alibi"])
def test_score_mods(mod):
    q, k, v, do = inputs(1, 4, 2, 61, 61, 16, 16)
    sm = score_mods.softcap(1.5) if mod == "softcap" else score_mods.alibi(4)
    compare(q * 3, k, v, do, mask_mods.causal(), sm)


@pytest.mark.parametrize("shared", [False, True])
def test_relative_bias_table_grad(shared):
    q, k, v, do = inputs(1, 2, 2, 70, 70, 16, 16)
    table = torch.randn(15 if shared else (2, 15)).requires_grad_()
    compare(q, k, v, do, mask_mods.sliding_window(11), score_mods.relative_bias(table), extra=(table,))


def test_dense_no_mask_and_gqa_cross():
    q, k, v, do = inputs(2, 6, 2, 41, 75, 24, 40)
    compare(q, k, v, do)
    compare(q, k, v, do, mask_mods.prefix_lm(30), block=32)
    with pytest.raises(ValueError):
        flex_attention(q, k, v)  # GQA without enable_gqa


def test_odd_lengths_and_blocks():
    q, k, v, do = inputs(1, 2, 1, 133, 133, 8, 12)
    for block in (128, 200, 3):
        compare(q, k, v, do, mask_mods.sliding_window(40), block=block)


def test_bf16():
    q, k, v, do = inputs(1, 4, 2, 90, 90, 32, 32, dtype=torch.bfloat16)
    bm = create_block_mask(mask_mods.causal(), None, None, 90, 90, BLOCK_SIZE=32)
    out = flex_attention(q, k, v, block_mask=bm, enable_gqa=True)
    assert out.dtype == torch.bfloat16
    gq, gk, gv = torch.autograd.grad(out, (q, k, v), do.bfloat16())
    # PyTorch's flex_attention on the same bf16 inputs, computed in f32 (and in bf16 itself)
    qf, kf, vf = (x.detach().float().requires_grad_() for x in (q, k, v))
    want, _ = torch_flex(qf.detach(), kf.detach(), vf.detach(), None, mask_mods.causal())
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)
    own, _ = torch_flex(q.detach(), k.detach(), v.detach(), None, mask_mods.causal())
    assert own.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), own.float(), atol=3e-2, rtol=3e-2)
    dense = create_mask(mask_mods.causal(), 1, 1, 90, 90)
    ro = F.scaled_dot_product_attention(qf, kf, vf, attn_mask=dense, enable_gqa=True)
    rg = torch.autograd.grad(ro, (qf, kf, vf), do.bfloat16().float())
    for a, r in zip((gq, gk, gv), rg):
        assert a.dtype == torch.bfloat16
        torch.testing.assert_close(a.float(), r, atol=5e-2, rtol=5e-2)


def test_python_mask_mod():
    """A PyTorch-style mask_mod (depends on h, captures a tensor), evaluated block by block."""
    shift = torch.tensor([0, 3, 7])

    def checker(b, h, q, kv):
        return ((q // 7 + kv // 5 + shift[h]) % 3 != 0) & (kv <= q + 4)

    q, k, v, do = inputs(1, 3, 3, 57, 57, 16, 16)
    bm = compare(q, k, v, do, checker, H=3)
    assert bm.shape == (1, 3, 57, 57)
    # the block structure is PyTorch's create_block_mask's for the same mask_mod
    tb = TF.create_block_mask(checker, 1, 3, 57, 57, device="cpu", BLOCK_SIZE=16)
    same_structure(bm, tb)
    assert torch.equal(bm.to_dense() != 0, tb.to_dense() != 0)


def same_structure(ours, theirs):
    """ctorch's BlockMask and PyTorch's hold the same partial and full blocks per row and column
    (the index lists compared over their first num entries: the rest is padding)."""
    for num, idx in (("kv_num_blocks", "kv_indices"), ("full_kv_num_blocks", "full_kv_indices"),
                     ("q_num_blocks", "q_indices"), ("full_q_num_blocks", "full_q_indices")):
        n, t = getattr(ours, num), getattr(theirs, num)
        assert torch.equal(n, t.to(n.dtype).expand_as(n)), num
        oi, ti = getattr(ours, idx), getattr(theirs, idx).expand(*n.shape, -1)
        for pos in torch.cartesian_prod(*(torch.arange(d) for d in n.shape)).view(-1, n.dim()):
            c = int(n[tuple(pos)])
            assert sorted(oi[tuple(pos)][:c].tolist()) == sorted(ti[tuple(pos)][:c].tolist()), (idx, pos)


def test_python_mask_error_is_raised():
    def bad(b, h, q, kv):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        create_block_mask(bad, None, None, 32, 32, BLOCK_SIZE=16)


def test_block_mask_broadcast_and_names():
    bm = create_block_mask("causal", 4, 8, 1024, 1024)
    assert bm.shape == (1, 1, 1024, 1024) and bm.BLOCK_SIZE == (128, 128)
    tb = TF.create_block_mask(lambda b, h, q, kv: q >= kv, None, None, 1024, 1024, device="cpu")
    assert tb.BLOCK_SIZE == bm.BLOCK_SIZE and bm.sparsity() == tb.sparsity()
    same_structure(bm, tb)
    docs = torch.stack([torch.arange(100) // 30, torch.arange(100) // 7])
    bm = create_block_mask(mask_mods.document(docs), 2, 4, 100, 100, BLOCK_SIZE=16)
    assert bm.shape[:2] == (2, 1)
    big = create_block_mask(mask_mods.sliding_window(256), None, None, 131072, 131072)
    assert big.nbytes < 1 << 20 and big.sparsity() > 99
    with pytest.raises(ValueError):
        create_block_mask("nope", None, None, 8, 8)


def test_document_per_batch_flex():
    docs = torch.stack([torch.arange(50) // 9, torch.arange(50) // 20])
    q, k, v, do = inputs(2, 2, 2, 50, 50, 8, 8)
    compare(q, k, v, do, and_masks(mask_mods.document(docs), mask_mods.causal()), B=2)


@pytest.mark.parametrize("block", [128, 64])
def test_trainer_masks_large_blocks(block):
    """ctorch train's masks (causal or a causal window, AND per-batch documents) at its block
    sizes: sub-tiles of 64 and 128 rows whose partial tiles are trimmed to the rectangles the
    mask keeps (queries in chunks of 16 over their keys, keys in chunks of 16 over their
    queries), against PyTorch's flex_attention and SDPA's autograd."""
    L = 256
    docs = torch.stack([torch.arange(L) // 64, torch.cumsum(torch.tensor([1 if t in (37, 101, 102, 200) else 0
                                                                           for t in range(L)]), 0)])
    q, k, v, do = inputs(2, 2, 1, L, L, 32, 32)
    compare(q, k, v, do, and_masks(mask_mods.causal(), mask_mods.document(docs)), block=block, B=2)
    compare(q, k, v, do, and_masks(mask_mods.sliding_window(40), mask_mods.document(docs)), block=block, B=2)


def test_determinism_threads():
    q, k, v, do = inputs(1, 4, 2, 300, 300, 32, 32)
    table = torch.randn(4, 31).requires_grad_()
    bm = create_block_mask(and_masks(mask_mods.document(torch.arange(300) // 70), mask_mods.causal()),
                           None, None, 300, 300, BLOCK_SIZE=64)
    before = ctorch.num_threads()
    runs = []
    try:
        for t in (2, 2, 1):
            ctorch.set_num_threads(t)
            out = flex_attention(q, k, v, score_mod=score_mods.relative_bias(table), block_mask=bm, enable_gqa=True)
            runs.append((out,) + torch.autograd.grad(out, (q, k, v, table), do))
    finally:
        ctorch.set_num_threads(before)
    for r in runs[1:]:
        for a, b in zip(runs[0], r):
            assert torch.equal(a, b)


@pytest.mark.parametrize("case", ["plain", "causal", "bool_mask", "float_mask", "scale", "masked_rows", "bf16",
                                  "three_dim"])
def test_scaled_dot_product_attention_is_pytorchs(case):
    """ct.scaled_dot_product_attention (ct_sdpa_forward / _backward) against PyTorch 2.13's
    F.scaled_dot_product_attention: output and every gradient, GQA and cross lengths; misuse
    raises PyTorch's classes."""
    from ctorch.torch import scaled_dot_product_attention as sdpa
    g = torch.Generator().manual_seed(5)
    dt = torch.bfloat16 if case == "bf16" else torch.float32
    q, k, v = (torch.randn(*s, generator=g).to(dt).requires_grad_() for s in ((2, 4, 37, 16), (2, 2, 45, 16),
                                                                              (2, 2, 45, 8)))
    kw = dict(enable_gqa=True)
    if case == "causal":
        kw["is_causal"] = True
    elif case == "bool_mask":
        kw["attn_mask"] = torch.rand(37, 45, generator=g) > 0.3
    elif case == "float_mask":
        kw["attn_mask"] = torch.randn(2, 1, 37, 45, generator=g)
    elif case == "scale":
        kw["scale"] = 0.3
    elif case == "masked_rows":  # rows with no key give 0, in PyTorch 2.13 too
        m = torch.rand(2, 4, 37, 45, generator=g) > 0.5
        m[:, :, 3] = False
        kw["attn_mask"] = m
    elif case == "three_dim":
        q, k, v = (x.detach()[0].requires_grad_() for x in (q, k, v))
    got = sdpa(q, k, v, **kw)
    want = F.scaled_dot_product_attention(q, k, v, **kw)
    assert got.dtype == want.dtype and got.shape == want.shape
    tol = 3e-2 if dt == torch.bfloat16 else 1e-5
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    do = torch.randn(want.shape, generator=g).to(dt)
    for a, r in zip(torch.autograd.grad(got, (q, k, v), do), torch.autograd.grad(want, (q, k, v), do)):
        torch.testing.assert_close(a, r, atol=tol * 3, rtol=tol * 3)
    if case == "plain":
        qq, kk = q.detach(), k.detach()
        for ours, theirs in (
                (lambda: sdpa(qq, kk, kk), lambda: F.scaled_dot_product_attention(qq, kk, kk)),  # no enable_gqa
                (lambda: sdpa(qq, qq, qq, attn_mask=torch.ones(37, 37, dtype=torch.long)),
                 lambda: F.scaled_dot_product_attention(qq, qq, qq, attn_mask=torch.ones(37, 37, dtype=torch.long))),
                (lambda: sdpa(qq, qq, qq, attn_mask=torch.ones(36, 37, dtype=torch.bool)),
                 lambda: F.scaled_dot_product_attention(qq, qq, qq, attn_mask=torch.ones(36, 37, dtype=torch.bool))),
                (lambda: sdpa(qq.long(), qq.long(), qq.long()),
                 lambda: F.scaled_dot_product_attention(qq.long(), qq.long(), qq.long()))):
            with pytest.raises(RuntimeError) as t:
                theirs()
            with pytest.raises(type(t.value)):
                ours()
        # attn_mask and is_causal both: PyTorch documents an error; 2.13 raises it on some paths
        # (its math kernel, used with GQA and gradients) and ANDs the two on others: refused here
        with pytest.raises(RuntimeError, match="is_causal"):
            sdpa(q, q, q, attn_mask=torch.ones(37, 37, dtype=torch.bool), is_causal=True)
        with pytest.raises(NotImplementedError, match="dropout"):
            sdpa(qq, qq, qq, dropout_p=0.1)


def test_flex_attention_signature_is_pytorchs():
    """flex_attention takes every parameter of PyTorch 2.13's, by the same name, kind and
    default (return_aux with lse included; max_scores refused)."""
    import inspect
    tp = inspect.signature(TF.flex_attention).parameters
    op = inspect.signature(flex_attention).parameters
    assert list(op) == list(tp)
    for name, p in tp.items():
        assert op[name].kind == p.kind and op[name].default == p.default, name
    q, k, v, _ = inputs(1, 2, 2, 20, 20, 8, 8)
    out, aux = flex_attention(q, k, v, return_aux=TF.AuxRequest())
    assert aux.lse is None and aux.max_scores is None
    with pytest.raises(NotImplementedError):
        flex_attention(q, k, v, return_aux=TF.AuxRequest(max_scores=True))
