"""Compiled score_mod / mask_mod (ctorch.torch._trace + src/jit): Python functions written as
PyTorch documents them are traced, compiled to native kernels and checked against PyTorch
2.13's own flex_attention (eager, float64, its create_block_mask of the same function) for the
output, and for every gradient (q, k, v and captured tensors that require grad: 2.13 has no CPU
backward for flex_attention) against explicit attention with the same functions applied to the
full score matrix, whose forward is itself checked against flex_attention, for the attention-gym
variants, odd and cross lengths, GQA and B/H broadcast; the tracer's errors; range checks; and
the compile cache across processes (a hit runs no compiler, two processes at once, a damaged
entry, no compiler). Every cache lives in a temp dir."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.attention.flex_attention as TF

from ctorch._lib import CtorchError
from ctorch.torch import create_block_mask, create_mask, flex_attention
from ctorch.torch import _trace

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def torch_flex(q, k, v, score_mod=None, mask_mod=None, B=None, H=None):
    """PyTorch 2.13's flex_attention (eager, CPU, no grad) with its own block mask of mask_mod."""
    L, S = q.shape[2], k.shape[2]
    bm = TF.create_block_mask(mask_mod, B, H, L, S, device="cpu") if mask_mod is not None else None
    with torch.no_grad():
        return TF.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm, enable_gqa=q.shape[1] != k.shape[1])


def ref_attention(q, k, v, score_mod=None, mask_mod=None, scale=None):
    """Explicit attention over the full score matrix (for the gradients, where PyTorch has no
    CPU backward); fully masked rows give 0, as flex_attention."""
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
        s = score_mod(s, b, h, qi, kv).to(s.dtype)
    m = create_mask(mask_mod, B, Hq, L, S) if mask_mod is not None else torch.ones(B, Hq, L, S, dtype=torch.bool)
    any_ = m.any(-1, keepdim=True)
    s = s.masked_fill(~(m | ~any_), float("-inf"))
    return (torch.softmax(s, -1) * any_) @ v


def inputs(B, Hq, Hkv, L, S, E=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g).requires_grad_()  # noqa: E731
    return mk(B, Hq, L, E), mk(B, Hkv, S, E), mk(B, Hkv, S, E), torch.randn(B, Hq, L, E, generator=g)


def run_case(mask=None, score=None, params=(), B=1, Hq=2, Hkv=2, L=37, S=37, block=16, mB=None, mH=None,
             tol=1e-4):
    """mask / score are factories: f(*params) -> the mod, so the reference differentiates its own
    double copies of the captured parameters."""
    q, k, v, do = inputs(B, Hq, Hkv, L, S)
    ps = [p.clone().requires_grad_(p.requires_grad) for p in params]
    mm = mask(*ps) if mask else None
    sm = score(*ps) if score else None
    bm = create_block_mask(mm, mB, mH, L, S, BLOCK_SIZE=block) if mm else None
    out = flex_attention(q, k, v, score_mod=sm, block_mask=bm, enable_gqa=Hq != Hkv)
    want = [q, k, v] + [p for p in ps if p.requires_grad]
    got = torch.autograd.grad(out, want, do)
    rq, rk, rv = (x.detach().double().requires_grad_() for x in (q, k, v))
    rp = [p.detach().double().requires_grad_(p.requires_grad) if p.is_floating_point() else p for p in params]
    ro = ref_attention(rq, rk, rv, score(*rp) if score else None, mask(*rp) if mask else None)
    rwant = [rq, rk, rv] + [p for p in rp if p.requires_grad]
    rgot = torch.autograd.grad(ro, rwant, do.double())
    dp = [p.detach() for p in rp]
    to = torch_flex(rq.detach(), rk.detach(), rv.detach(), score(*dp) if score else None,
                    mask(*dp) if mask else None, mB, mH)
    torch.testing.assert_close(out.double(), to, atol=tol, rtol=tol)  # the oracle
    torch.testing.assert_close(ro.detach(), to, atol=1e-10, rtol=1e-10)  # the gradients' reference
    for i, (a, r) in enumerate(zip(got, rgot)):
        torch.testing.assert_close(a.double(), r, atol=tol, rtol=tol, msg=lambda m: f"grad {i}: {m}")
    return bm


DOC = torch.tensor([0] * 9 + [1] * 14 + [2] * 3 + [3] * 11 + [4] * 16)  # 53 tokens


def causal():
    return lambda b, h, q, kv: q >= kv


def sliding(w):
    return lambda b, h, q, kv: (q >= kv) & (q - kv <= w)


def test_causal_and_sliding_window_blocks_exact():
    bm = run_case(causal)
    dense = bm.to_dense()
    n = dense.shape[-1]
    qb, kb = torch.arange(n).view(n, 1), torch.arange(n).view(1, n)
    assert torch.equal(dense[0, 0], torch.where(qb > kb, 2, torch.where(qb == kb, 1, 0)).to(torch.uint8))
    run_case(lambda: sliding(13), L=61, S=61)


def test_prefix_lm_cross_lengths():
    run_case(lambda: (lambda b, h, q, kv: (kv < 9) | (q >= kv)), L=37, S=53)


def test_document_causal():
    run_case(lambda d: (lambda b, h, q, kv: (d[q] == d[kv]) & (q >= kv)), params=(DOC,), L=53, S=53)


def test_dilated_window_modulo_floor():
    run_case(lambda: (lambda b, h, q, kv: ((q - kv) % 2 == 0) & ((q - kv).abs() <= 10) | (q // 8 == kv // 8)),
             L=45, S=45)


def test_head_dependent_window_h_broadcast():
    bm = run_case(lambda: (lambda b, h, q, kv: (q - kv <= 4 * (h + 1)) & (kv <= q)), Hq=3, Hkv=3, mH=3)
    assert bm.shape[1] == 3
    bm2 = create_block_mask(causal(), 4, 8, 64, 64, BLOCK_SIZE=16)
    assert bm2.shape[:2] == (1, 1)  # does not read b or h: broadcast


def test_captured_random_boolean_matrix():
    g = torch.Generator().manual_seed(3)
    rm = torch.rand(37, 41, generator=g) < 0.3
    run_case(lambda m: (lambda b, h, q, kv: m[q, kv] | (q == kv)), params=(rm,), L=37, S=41)


def test_alibi_learnable_slopes_gqa():
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], requires_grad=True)
    run_case(lambda s: causal(), lambda s: (lambda sc, b, h, q, kv: sc + s[h] * (kv - q)), params=(slopes,),
             Hq=4, Hkv=2)


def test_tanh_softcap():
    run_case(lambda: causal(), lambda: (lambda s, b, h, q, kv: 2.0 * torch.tanh(s / 2.0)), L=29, S=29)


def test_relative_bias_grad_and_two_params_packed():
    L = 37
    g = torch.Generator().manual_seed(5)
    bias = (0.3 * torch.randn(2, 2 * L, generator=g)).requires_grad_()
    temp = torch.tensor(1.3, requires_grad=True)
    run_case(lambda *_: causal(),
             lambda bb, t: (lambda s, b, h, q, kv: s * t + bb[h, q - kv + L]), params=(bias, temp), L=L, S=L)


def test_captured_gradients_are_bitwise_across_runs_and_threads():
    """The parameter gradients of captured tensors are summed in a fixed order: identical bits
    for repeated runs and for 1, 2 and 3 threads."""
    from ctorch._lib import lib, set_num_threads
    was = lib.ct_num_threads()
    L = 45
    g = torch.Generator().manual_seed(9)
    bias0 = 0.3 * torch.randn(2, 2 * L, generator=g)
    q, k, v, do = inputs(2, 2, 2, L, L, seed=3)
    grads = []
    try:
        for threads in (1, 2, 3, 2):
            set_num_threads(threads)
            bias = bias0.clone().requires_grad_()
            qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
            sm = lambda s, b, h, qi, kv: s + bias[h, qi - kv + L]  # noqa: E731
            bm = create_block_mask(causal(), None, None, L, L, BLOCK_SIZE=16)
            out = flex_attention(qq, kk, vv, score_mod=sm, block_mask=bm)
            out.backward(do)
            grads.append(bias.grad.clone())
    finally:
        set_num_threads(was)
    assert grads[0].abs().sum() > 0
    for gr in grads[1:]:
        assert torch.equal(gr, grads[0])


def test_many_ops_where_clamp_minimum_batch_doc():
    docs = torch.stack([DOC[:40], torch.arange(40) // 7])  # per batch
    def score(s, b, h, q, kv):
        x = torch.where(q >= kv, s, s * 0.5) + torch.sigmoid(s).clamp(0.2, 0.8)
        return x + torch.minimum(torch.exp(s / 4), torch.sqrt(s * s + 1.0)) - torch.log(s.abs() + 2.0) / 3
    run_case(lambda d: (lambda b, h, q, kv: d[b, q] == d[b, kv]), lambda d: score, params=(docs,),
             B=2, L=40, S=40, mB=2)


def test_operators_floor_semantics_bitwise_not_maximum():
    """`~`, torch.maximum / torch.clamp as functions, `//` and `%` on negative operands and
    divisors (Python's floor semantics, as torch 2.13 computes them), on ints and floats."""
    def mask(b, h, q, kv):
        d = q - kv
        return ~((d // 3) % 4 == 1) & ~(d % -5 == -2) | (q == kv) | ((kv - q) // -4 == 2)

    def score(s, b, h, q, kv):
        x = torch.maximum(s, torch.clamp(s * 0.5, min=-1.0)) + torch.clamp(s, -2.0, 2.0) * 0.1
        return (x + ((q - kv) // 7) * 0.01 + ((kv - q) % -6) * 0.02 + (((q - kv) * 0.7) // -1.3) * 0.03
                + (s % 1.5) * 0.2 + (((kv - q) * 0.5) % -1.75) * 0.1)

    run_case(lambda: mask, lambda: score, L=43, S=43)
    expr, _ = _trace.trace(mask, True)
    assert "~" in expr and "/" in expr and "%" in expr


def test_floor_division_values_match_python():
    """The compiled mask gives Python's // and % for every sign combination (the reference is
    Python's own integer arithmetic, element by element)."""
    L = 23
    for c in (-5, -3, 4, 7):
        fn = lambda b, h, q, kv, c=c: ((q - kv) // c + (kv - q) % c) % 3 == 1  # noqa: E731
        bm = create_block_mask(fn, None, None, L, L, BLOCK_SIZE=8)
        want = torch.tensor([[((q - kv) // c + (kv - q) % c) % 3 == 1 for kv in range(L)] for q in range(L)])
        assert torch.equal(create_mask(fn, 1, 1, L, L)[0, 0], want)  # torch agrees with Python
        q, k, v, _ = inputs(1, 1, 1, L, L)
        out = flex_attention(q, k, v, block_mask=bm)
        ref = ref_attention(q.double(), k.double(), v.double(), None, lambda b, h, qq, kk: want[qq, kk])
        torch.testing.assert_close(out.double(), ref, atol=1e-4, rtol=1e-4)


VARIANTS = {
    "causal": (lambda *p: causal(), None, ()),
    "sliding": (lambda *p: sliding(7), None, ()),
    "prefix_lm": (lambda *p: (lambda b, h, q, kv: (kv < 9) | (q >= kv)), None, ()),
    "document": (lambda d: (lambda b, h, q, kv: (d[q] == d[kv]) & (q >= kv)), None, (DOC[:37],)),
    "alibi": (lambda s: causal(), lambda s: (lambda sc, b, h, q, kv: sc + s[h] * (kv - q)),
              (torch.tensor([0.5, 0.25, 0.125, 0.0625], requires_grad=True),)),
    "softcap": (lambda *p: causal(), lambda *p: (lambda s, b, h, q, kv: 3.0 * torch.tanh(s / 3.0)), ()),
    "rel_bias": (lambda bb: causal(), lambda bb: (lambda s, b, h, q, kv: s + bb[h, q - kv + 37]),
                 ((0.3 * torch.randn(4, 2 * 37, generator=torch.Generator().manual_seed(9))).requires_grad_(),)),
    "dilated": (lambda *p: (lambda b, h, q, kv: ((q - kv) % 3 == 0) & (q >= kv)), None, ()),
    "random_bool": (lambda m: (lambda b, h, q, kv: m[q, kv] | (q == kv)), None,
                    (torch.rand(37, 37, generator=torch.Generator().manual_seed(4)) < 0.4,)),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variants_gqa_batch_broadcast(name):
    """Every attention-gym variant with B=2, GQA (4 query heads over 2 kv heads) and the block
    mask broadcast over B and H (None): forward and every gradient against the reference."""
    mask, score, params = VARIANTS[name]
    run_case(mask, score, params=params, B=2, Hq=4, Hkv=2, L=37, S=37, block=16)


def test_head_dependent_window_gqa_batch_broadcast():
    run_case(lambda: (lambda b, h, q, kv: (q - kv <= 3 * (h + 1)) & (kv <= q)), B=2, Hq=4, Hkv=2, L=37, S=37,
             mH=4)


def test_three_captured_grads_packed_in_capture_order():
    """Three learnable captured tensors (first used in the order temp, bias, slopes) and a
    non-grad one between them: each .grad equals the reference's."""
    L = 29
    g = torch.Generator().manual_seed(11)
    bias = (0.2 * torch.randn(2, 2 * L, generator=g)).requires_grad_()
    temp = torch.tensor(0.9, requires_grad=True)
    doc = torch.arange(L) // 10
    slopes = torch.tensor([0.3, -0.2], requires_grad=True)
    sm = lambda t, d, bb, sl: (lambda s, b, h, q, kv:  # noqa: E731
                               s * t + torch.where(d[q] == d[kv], bb[h, q - kv + L], 0.0) + sl[h] * (kv - q))
    run_case(lambda *_: causal(), sm, params=(temp, doc, bias, slopes), L=L, S=L)
    _, caps = _trace.trace(sm(temp, doc, bias, slopes), False)
    assert [c.tensor is x for c, x in zip(caps, (temp, doc, bias, slopes))] == [True] * 4
    assert [c.grad for c in caps] == [True, False, True, True]


@pytest.mark.parametrize("fn, construct", [
    (lambda b, h, q, kv: (q >= kv) if b == 0 else (q < kv), "Python `if`"),
    (lambda b, h, q, kv: torch.erf(q.float()) > 0, "'erf'"),
    (lambda b, h, q, kv: (q + 0).add_(1) > kv, "in-place"),
    (lambda b, h, q, kv: torch.ones(3, dtype=torch.float64)[q] > 0, "torch.float64"),
])
def test_untraceable_mask_mod_warning_names_the_construct(fn, construct):
    with pytest.warns(UserWarning, match="cannot be traced.*" + construct.replace("(", r"\(")):
        bm = create_block_mask(fn, None, None, 3, 3, BLOCK_SIZE=16)
    assert bm is not None


def test_scale_with_compiled_mods():
    """scale= applies before the compiled score_mod, as in PyTorch; forward and gradients."""
    q, k, v, do = inputs(1, 2, 1, 21, 27)
    sm = lambda s, b, h, qi, kv: 2.0 * torch.tanh(s / 2.0) - 0.05 * (qi - kv).abs()  # noqa: E731
    mm = lambda b, h, qi, kv: (kv <= qi + 6) & (kv % 4 != 3)  # noqa: E731
    bm = create_block_mask(mm, None, None, 21, 27, BLOCK_SIZE=16)
    out = flex_attention(q, k, v, score_mod=sm, block_mask=bm, scale=0.7, enable_gqa=True)
    got = torch.autograd.grad(out, (q, k, v), do)
    rq, rk, rv = (x.detach().double().requires_grad_() for x in (q, k, v))
    ro = ref_attention(rq, rk, rv, sm, mm, scale=0.7)
    rgot = torch.autograd.grad(ro, (rq, rk, rv), do.double())
    torch.testing.assert_close(out.double(), ro, atol=1e-4, rtol=1e-4)
    for a, r in zip(got, rgot):
        torch.testing.assert_close(a.double(), r, atol=1e-4, rtol=1e-4)


def test_one_kernel_serves_every_length():
    sm = lambda s, b, h, q, kv: s + 0.01 * (kv - q)  # noqa: E731
    for L in (17, 18, 33):
        q, k, v, _ = inputs(1, 1, 1, L, L)
        flex_attention(q, k, v, score_mod=sm)
    before = _trace.stats()
    for L in (5, 64, 100):
        q, k, v, _ = inputs(1, 1, 1, L, L)
        out = flex_attention(q, k, v, score_mod=sm)
        torch.testing.assert_close(out.double(), ref_attention(q.double(), k.double(), v.double(), sm),
                                   atol=1e-4, rtol=1e-4)
    after = _trace.stats()
    assert after["compiles"] == before["compiles"] and after["processes"] == before["processes"]
    assert after["table_hits"] >= before["table_hits"] + 3


def test_python_constants_are_part_of_the_kernel():
    """Two closures of one function over different constants are two kernels: each result is
    its own constant's (a stale kernel from the key missing the constant would give the
    first's)."""
    def make(w):
        return lambda s, b, h, q, kv: s + w * (kv - q)
    q, k, v, _ = inputs(1, 1, 1, 21, 21)
    for w in (0.25, -0.5, 0.75):
        sm = make(w)
        before = _trace.stats()
        out = flex_attention(q, k, v, score_mod=sm)
        torch.testing.assert_close(out.double(), ref_attention(q.double(), k.double(), v.double(), sm),
                                   atol=1e-4, rtol=1e-4)
        after = _trace.stats()
        # a new kernel: built now or found on disk under its own key, not the table's old one
        assert after["compiles"] + after["cache_hits"] > before["compiles"] + before["cache_hits"], w


def test_index_out_of_range_is_index_error():
    bias = torch.zeros(10)
    sm = lambda s, b, h, q, kv: s + bias[q - kv + 4]  # noqa: E731
    q, k, v, _ = inputs(1, 1, 1, 5, 5)
    flex_attention(q, k, v, score_mod=sm)  # q - kv + 4 in [0, 8]
    q, k, v, _ = inputs(1, 1, 1, 7, 7)
    with pytest.raises(IndexError, match="t0"):
        flex_attention(q, k, v, score_mod=sm)
    doc = torch.zeros(20, dtype=torch.long)
    with pytest.raises(IndexError):
        create_block_mask(lambda b, h, q, kv: doc[q] == doc[kv], None, None, 21, 21, BLOCK_SIZE=16)


@pytest.mark.parametrize("fn, construct", [
    (lambda s, b, h, q, kv: s if q > kv else -s, "Python `if`"),
    (lambda s, b, h, q, kv: torch.erf(s), "'erf'"),
    (lambda s, b, h, q, kv: s.add_(1), "in-place"),
    (lambda s, b, h, q, kv: s + torch.ones(3, dtype=torch.float64)[q], "torch.float64"),
    (lambda s, b, h, q, kv: s + torch.ones(3, device="meta")[q], "device meta"),
    (lambda s, b, h, q, kv: s + torch.ones(3, 3)[q, 0:2], "slicing"),
    (lambda s, b, h, q, kv: s + torch.ones(3), "without indexing"),
    (lambda s, b, h, q, kv: s + [1.0, 2.0][q], "Python int"),
])
def test_untraceable_score_mod_raises_naming_the_construct(fn, construct):
    q, k, v, _ = inputs(1, 1, 1, 8, 8)
    with pytest.raises(_trace.TraceError, match=construct.replace("(", r"\(")):
        flex_attention(q, k, v, score_mod=fn)


def test_untraceable_mask_mod_falls_back_with_warning():
    def mask(b, h, q, kv):
        if int(q.max()) >= 0:  # data-dependent Python control flow
            return q >= kv
        return q < kv
    with pytest.warns(UserWarning, match="cannot be traced"):
        bm = create_block_mask(mask, None, None, 40, 40, BLOCK_SIZE=16)
    q, k, v, _ = inputs(1, 1, 1, 40, 40)
    out = flex_attention(q, k, v, block_mask=bm)
    torch.testing.assert_close(out.double(), ref_attention(q.double(), k.double(), v.double(), None,
                                                           causal()), atol=1e-4, rtol=1e-4)


# ---- the cache across processes -------------------------------------------------------------

CHILD = textwrap.dedent("""
    import json, sys, torch
    from ctorch.torch import flex_attention, create_block_mask
    from ctorch.torch import _trace
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 33, 8, generator=g) for _ in range(3))
    off = float(sys.argv[1])
    bm = create_block_mask(lambda b, h, qi, kv: (qi >= kv) & ((qi - kv) % 5 != 3), None, None, 33, 33,
                           BLOCK_SIZE=16)
    out = flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: s * off + 0.1 * h, block_mask=bm)
    print(json.dumps({"stats": _trace.stats(), "sum": float(out.double().sum())}))
""")


def child(cache, arg="1.25", cc=None, check=True):
    env = dict(os.environ, CT_CACHE_DIR=str(cache), PYTHONPATH=os.path.join(ROOT, "python"))
    if cc:
        env["CC"] = cc
    p = subprocess.run([sys.executable, "-c", CHILD, arg], env=env, capture_output=True, text=True, timeout=300)
    if check:
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout.strip().splitlines()[-1])
    return p


def wrapper_cc(tmp_path):
    log = tmp_path / "cc.log"
    cc = tmp_path / "wrapcc"
    cc.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\nexec cc \"$@\"\n")
    cc.chmod(0o755)
    return str(cc), log


def test_cache_hit_runs_no_compiler(tmp_path):
    cc, log = wrapper_cc(tmp_path)
    first = child(tmp_path / "c", cc=cc)
    assert first["stats"]["compiles"] == 2 and log.read_text().count(".c") == 2
    n = len(log.read_text().splitlines())
    second = child(tmp_path / "c", cc=cc)
    assert second["stats"]["cache_hits"] == 2 and second["stats"]["processes"] == 0
    assert len(log.read_text().splitlines()) == n  # not even --version
    assert second["sum"] == first["sum"]


def test_two_processes_compile_one_mod_at_once(tmp_path):
    env = dict(os.environ, CT_CACHE_DIR=str(tmp_path / "c"), PYTHONPATH=os.path.join(ROOT, "python"))
    ps = [subprocess.Popen([sys.executable, "-c", CHILD, "0.75"], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True) for _ in range(2)]
    res = [p.communicate(timeout=300) for p in ps]
    for p, (out, err) in zip(ps, res):
        assert p.returncode == 0, err
    sums = [json.loads(out.strip().splitlines()[-1])["sum"] for out, _ in res]
    assert sums[0] == sums[1]
    names = sorted(os.listdir(tmp_path / "c"))
    assert len([n for n in names if n.endswith(".so")]) == 2, names
    assert not [n for n in names if n.startswith("tmp-")], names
    third = child(tmp_path / "c", "0.75")
    assert third["stats"]["cache_hits"] == 2 and third["stats"]["processes"] == 0 and third["sum"] == sums[0]


def test_damaged_entry_is_rebuilt(tmp_path):
    first = child(tmp_path / "c", "1.5")
    for n in os.listdir(tmp_path / "c"):
        if n.endswith(".so"):
            with open(tmp_path / "c" / n, "r+b") as f:
                f.seek(200)
                f.write(b"\x00garbage\xff")
    second = child(tmp_path / "c", "1.5")
    assert second["stats"]["rebuilt"] == 2 and second["stats"]["compiles"] == 2
    assert second["sum"] == first["sum"]
    third = child(tmp_path / "c", "1.5")
    assert third["stats"]["cache_hits"] == 2 and third["stats"]["rebuilt"] == 0


def test_no_compiler(tmp_path):
    p = child(tmp_path / "c", cc="ctorch-no-such-cc", check=False)
    assert p.returncode != 0
    assert "no C compiler" in p.stderr
    assert "cannot be compiled" in p.stderr or "could not be compiled" in p.stderr  # the mask fell back


def test_cache_dir_writable_by_others_refused(tmp_path):
    d = tmp_path / "open"
    d.mkdir()
    d.chmod(0o777)
    p = child(d, "2.5", check=False)
    assert p.returncode != 0 and "writable by other users" in p.stderr


def test_default_cache_dir_xdg_then_home(tmp_path):
    """Without CT_CACHE_DIR the cache is $XDG_CACHE_HOME/ctorch, else ~/.cache/ctorch."""
    base = {k: v for k, v in os.environ.items() if k not in ("CT_CACHE_DIR", "XDG_CACHE_HOME", "HOME")}
    base["PYTHONPATH"] = os.path.join(ROOT, "python")
    for env, where in ((dict(XDG_CACHE_HOME=str(tmp_path / "xdg"), HOME=str(tmp_path / "h1")),
                        tmp_path / "xdg" / "ctorch"),
                       (dict(HOME=str(tmp_path / "h2")), tmp_path / "h2" / ".cache" / "ctorch")):
        p = subprocess.run([sys.executable, "-c", CHILD, "3.25"], env=dict(base, **env), capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        assert len([n for n in os.listdir(where) if n.endswith(".so")]) == 2
        assert os.stat(where).st_mode & 0o777 == 0o700
