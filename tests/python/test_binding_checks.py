"""Misuse of the Python binding, side by side with PyTorch 2.13 (issue 14, item 4): every
entry point checks shapes and dtypes before C sees a pointer or a length, and raises the
exception class PyTorch's own op raises for the same misuse (F.linear_cross_entropy,
F.cross_entropy, flex_attention, F.scaled_dot_product_attention, F.rms_norm, ...; RoPE, which
PyTorch lacks, is compared with the softmax kernel's dtype rule). Before, these read past buffers (a class weight of 2 for
V=4096, a bias of 3, a target shorter than N, document ids shorter than Q_LEN), truncated
(float targets: 2.7 -> class 2) or computed garbage (int64 q/k/v gave zeros)."""
import pytest
import torch
import torch.nn.functional as F
import torch.nn.attention.flex_attention as TF

import ctorch
import ctorch.torch as ct
from ctorch.torch import create_block_mask, flex_attention, mask_mods
from ctorch.torch import index as ci

torch.manual_seed(0)
N, D, V = 6, 8, 4096
# PyTorch's eager flex_attention is the oracle here; its advice to compile it is not a failure.
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def same_error(ours, theirs, needle=None):
    """theirs() raises; ours() raises an instance of the same class, as a CtorchError."""
    with pytest.raises(Exception) as t:
        theirs()
    with pytest.raises(Exception) as o:
        ours()
    assert isinstance(o.value, type(t.value)), f"ctorch raised {type(o.value).__mro__}, torch {type(t.value)}: {o.value}"
    assert isinstance(o.value, ctorch.CtorchError), type(o.value)
    if needle:
        assert needle in str(o.value), str(o.value)
    return o.value


def lce_inputs():
    h = torch.randn(N, D)
    w = torch.randn(V, D) * 0.1
    y = torch.randint(0, V, (N,))
    return h, w, y


def ref_lce(h, w, y, b=None, **kw):
    return F.linear_cross_entropy(h, w, y, linear_bias=b, **kw)


# ---- losses -------------------------------------------------------------------------------

def test_class_weight_of_the_wrong_length():
    h, w, y = lce_inputs()
    cw = torch.ones(2)
    same_error(lambda: ct.linear_cross_entropy(h, w, y, weight=cw), lambda: ref_lce(h, w, y, weight=cw),
               "4096 classes")
    x = torch.randn(N, V)
    same_error(lambda: ct.cross_entropy(x, y, weight=cw), lambda: F.cross_entropy(x, y, weight=cw))
    same_error(lambda: ct.cross_entropy(x, y, weight=torch.ones(V, 1)), lambda: F.cross_entropy(x, y, weight=torch.ones(V, 1)))
    same_error(lambda: ct.cross_entropy(x, y, weight=torch.ones(V, dtype=torch.float64)),
               lambda: F.cross_entropy(x, y, weight=torch.ones(V, dtype=torch.float64)))


def test_linear_bias_of_the_wrong_length():
    h, w, y = lce_inputs()
    b = torch.zeros(3)
    same_error(lambda: ct.linear_cross_entropy(h, w, y, linear_bias=b), lambda: ref_lce(h, w, y, b), "(4096,)")
    # what F.linear would broadcast, F.linear_cross_entropy (2.13) refuses: [1] and [1, V]
    for b in (torch.full((1,), 0.5), torch.randn(1, V)):
        same_error(lambda: ct.linear_cross_entropy(h, w, y, linear_bias=b), lambda: ref_lce(h, w, y, b))
    b = torch.randn(V)
    torch.testing.assert_close(ct.linear_cross_entropy(h, w, y, linear_bias=b), ref_lce(h, w, y, b),
                               rtol=1e-5, atol=1e-5)
    same_error(lambda: ct.linear_cross_entropy(h, w, y, linear_bias=torch.zeros(V, dtype=torch.long)),
               lambda: ref_lce(h, w, y, torch.zeros(V, dtype=torch.long)))


def test_target_shorter_or_longer_than_the_rows():
    h, w, y = lce_inputs()
    x = torch.randn(N, V)
    for t in (y[:3], torch.zeros(N + 2, dtype=torch.long)):
        same_error(lambda: ct.cross_entropy(x, t), lambda: F.cross_entropy(x, t), "batch_size")
        same_error(lambda: ct.linear_cross_entropy(h, w, t), lambda: ref_lce(h, w, t), "batch_size")
    same_error(lambda: ct.cross_entropy(x, y.view(N, 1)), lambda: F.cross_entropy(x, y.view(N, 1)))


def test_targets_out_of_range_and_not_integers():
    x = torch.randn(N, 5)
    bad = torch.tensor([0, 1, 5, 2, 3, 4])
    same_error(lambda: ct.cross_entropy(x, bad), lambda: F.cross_entropy(x, bad), "target[2] = 5")
    for dt in (torch.float32, torch.float64, torch.bool):
        t = torch.tensor([0, 1, 2, 3, 4, 1]).to(dt)
        same_error(lambda: ct.cross_entropy(x, t), lambda: F.cross_entropy(x, t), "never truncated" if dt != torch.bool else None)
    h, w, y = lce_inputs()
    yf = y.float() + 0.7  # was truncated to y
    same_error(lambda: ct.linear_cross_entropy(h, w, yf), lambda: ref_lce(h, w, yf))


def test_class_probability_targets_are_refused_not_truncated():
    x = torch.randn(N, 5)
    p = torch.softmax(torch.randn(N, 5), -1)
    F.cross_entropy(x, p)  # PyTorch computes these
    with pytest.raises(NotImplementedError, match="class probabilities"):
        ct.cross_entropy(x, p)
    h, w, _ = lce_inputs()
    with pytest.raises(NotImplementedError, match="class probabilities"):
        ct.linear_cross_entropy(h, w, torch.softmax(torch.randn(N, V), -1))


def test_integer_inputs_to_the_losses():
    h, w, y = lce_inputs()
    same_error(lambda: ct.linear_cross_entropy(h.long(), w, y), lambda: ref_lce(h.long(), w, y))
    same_error(lambda: ct.linear_cross_entropy(h.long(), w.long(), y), lambda: ref_lce(h.long(), w.long(), y))
    same_error(lambda: ct.linear_cross_entropy(h.bfloat16(), w, y), lambda: ref_lce(h.bfloat16(), w, y))
    same_error(lambda: ct.linear_cross_entropy(h, w[:, :5], y), lambda: ref_lce(h, w[:, :5], y))
    x = torch.randn(N, 5)
    same_error(lambda: ct.cross_entropy(x.long(), y % 5), lambda: F.cross_entropy(x.long(), y % 5))
    same_error(lambda: ct.cross_entropy([1.0, 2.0], y), lambda: F.cross_entropy([1.0, 2.0], y))
    same_error(lambda: ct.cross_entropy(x, y % 5, reduction="avg"), lambda: F.cross_entropy(x, y % 5, reduction="avg"))
    same_error(lambda: ct.linear_cross_entropy(h, w, y, reduction="avg"), lambda: ref_lce(h, w, y, reduction="avg"))
    # options must be LinearCrossEntropyOptions (PyTorch reads its fields: AttributeError there)
    with pytest.raises(AttributeError):
        ref_lce(h, w, y, options={"batch_chunk_size": 2})
    with pytest.raises(TypeError, match="LinearCrossEntropyOptions"):
        ct.linear_cross_entropy(h, w, y, options={"batch_chunk_size": 2})


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_zero_rows(reduction):
    x = torch.randn(0, 7, requires_grad=True)
    t = torch.zeros(0, dtype=torch.long)
    want = F.cross_entropy(x, t, reduction=reduction)
    got = ct.cross_entropy(x, t, reduction=reduction)
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want, equal_nan=True)
    h = torch.randn(0, D, requires_grad=True)
    w = torch.randn(7, D, requires_grad=True)
    want = ref_lce(h, w, t, reduction=reduction)
    got = ct.linear_cross_entropy(h, w, t, reduction=reduction)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, equal_nan=True)
    if reduction != "mean":
        got.sum().backward()
        assert h.grad.shape == h.shape and w.grad is not None and not w.grad.any()


def test_unbatched_and_k_dim_cross_entropy():
    x, t = torch.randn(5), torch.tensor(3)
    torch.testing.assert_close(ct.cross_entropy(x, t), F.cross_entropy(x, t))
    x, t = torch.randn(2, 5, 3), torch.randint(0, 5, (2, 3))
    for r in ("none", "mean", "sum"):
        torch.testing.assert_close(ct.cross_entropy(x, t, reduction=r), F.cross_entropy(x, t, reduction=r))
    same_error(lambda: ct.cross_entropy(x, t[:, :2]), lambda: F.cross_entropy(x, t[:, :2]))


# ---- attention ----------------------------------------------------------------------------

def dense_reference(q, k, v, mask=None):
    """PyTorch's attention over a dense boolean mask (F.scaled_dot_product_attention)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def torch_block_mask(mod, B, H, L, S):
    """PyTorch 2.13's own create_block_mask (on the CPU) of a PyTorch-style mask_mod."""
    return TF.create_block_mask(mod, B, H, L, S, device="cpu", BLOCK_SIZE=16)


def test_document_ids_shorter_than_q_len_or_fewer_rows_than_b():
    ids = torch.arange(32) // 8
    same_error(lambda: create_block_mask(mask_mods.document(ids), 1, 1, 64, 64, BLOCK_SIZE=16),
               lambda: torch_block_mask(lambda b, h, q, kv: ids[q] == ids[kv], 1, 1, 64, 64), "64 needed")
    kv_ids = torch.arange(20) // 8
    same_error(lambda: create_block_mask(mask_mods.document(ids, kv_ids), 1, 1, 32, 40, BLOCK_SIZE=16),
               lambda: torch_block_mask(lambda b, h, q, kv: ids[q] == kv_ids[kv], 1, 1, 32, 40))
    rows = torch.stack([torch.arange(64) // 8, torch.arange(64) // 16])
    same_error(lambda: create_block_mask(mask_mods.document(rows), 3, 1, 64, 64, BLOCK_SIZE=16),
               lambda: torch_block_mask(lambda b, h, q, kv: rows[b, q] == rows[b, kv], 3, 1, 64, 64), "batch rows")
    # inside a combination too
    same_error(lambda: create_block_mask(ct.and_masks(mask_mods.causal(), mask_mods.document(rows)), 3, 2, 64, 64),
               lambda: torch_block_mask(lambda b, h, q, kv: (q >= kv) & (rows[b, q] == rows[b, kv]), 3, 2, 64, 64))
    # what fits: shared ids for any B, per-batch ids for B <= rows, ids longer than Q_LEN
    create_block_mask(mask_mods.document(ids), 5, 2, 32, 32, BLOCK_SIZE=16)
    create_block_mask(mask_mods.document(rows), 2, 1, 48, 48, BLOCK_SIZE=16)
    # ids of any real dtype keep their equalities (2.7 and 2.2 were both truncated to 2)
    fl = torch.tensor([0.5, 0.5, 2.2, 2.7, 2.7, 9.0, 9.0, 9.0] * 4)
    big = (torch.arange(32) // 8) * (1 << 40)  # beyond int32
    for other in (fl, big):
        got = create_block_mask(mask_mods.document(other), 1, 1, 32, 32, BLOCK_SIZE=4)
        want = TF.create_mask(lambda b, h, q, kv: other[q] == other[kv], 1, 1, 32, 32, device="cpu")
        q = torch.randn(1, 1, 32, 8)
        torch.testing.assert_close(flex_attention(q, q, q, block_mask=got), dense_reference(q, q, q, want),
                                   rtol=1e-5, atol=1e-5)


def test_block_mask_made_for_other_b_or_h():
    """A block mask made for other lengths: ValueError, as PyTorch 2.13's flex_attention. One made
    for another B or H: PyTorch 2.13's flex_attention does not check it (it reads the mask's
    leading rows, or others), so the oracle is its attention over the same dense mask, which
    refuses to broadcast it (RuntimeError); ctorch refuses it too, naming both shapes."""
    causal = lambda b, h, qq, kv: qq >= kv  # noqa: E731
    q = torch.randn(1, 2, 64, 16)
    bm = create_block_mask(mask_mods.causal(), 2, 3, 64, 64, BLOCK_SIZE=16)
    dense = TF.create_mask(causal, 2, 3, 64, 64, device="cpu")
    same_error(lambda: flex_attention(q, q, q, block_mask=bm), lambda: dense_reference(q, q, q, dense), "B=2, H=3")
    bm2 = create_block_mask(mask_mods.causal(), 1, 3, 64, 64, BLOCK_SIZE=16)
    same_error(lambda: flex_attention(q, q, q, block_mask=bm2),
               lambda: dense_reference(q, q, q, dense[:1]))
    for L, S in ((32, 64), (128, 128)):
        bm3 = create_block_mask(mask_mods.causal(), 1, 1, L, S, BLOCK_SIZE=16)
        same_error(lambda: flex_attention(q, q, q, block_mask=bm3),
                   lambda: TF.flex_attention(q, q, q, block_mask=torch_block_mask(causal, 1, 1, L, S)), "Q_LEN")
    # broadcasting B = H = 1 (or None) works, as in PyTorch
    want = TF.flex_attention(q, q, q, block_mask=torch_block_mask(causal, None, None, 64, 64))
    for b in (create_block_mask(mask_mods.causal(), None, None, 64, 64, BLOCK_SIZE=16),
              create_block_mask(mask_mods.causal(), 1, 2, 64, 64, BLOCK_SIZE=16)):
        torch.testing.assert_close(flex_attention(q, q, q, block_mask=b), want, rtol=1e-5, atol=1e-5)


def test_integer_q_k_v():
    """PyTorch 2.13's eager flex_attention computes integer q, k, v in integers on the CPU (no
    softmax kernel runs); ctorch refuses them as its SDPA does (RuntimeError), with the
    kernels' NotImplementedError."""
    q = torch.randint(-3, 3, (1, 2, 16, 8))
    same_error(lambda: flex_attention(q, q, q), lambda: dense_reference(q, q, q), "not implemented for 'Long'")
    f = q.float()
    same_error(lambda: flex_attention(f, q, f), lambda: dense_reference(f, q, f))
    same_error(lambda: flex_attention(f, f, [1.0]), lambda: dense_reference(f, f, [1.0]))


# ---- the rest of the entry points: one helper, the same rules ------------------------------

@pytest.mark.parametrize("name,ours,theirs", [
    ("gelu", lambda x: ct.gelu(x), lambda x: F.gelu(x)),
    ("silu", lambda x: ct.silu(x), lambda x: F.silu(x)),
    ("swiglu", lambda x: ct.swiglu(x), lambda x: F.silu(x[..., :2]) * x[..., 2:]),
    ("rms_norm", lambda x: ct.rms_norm(x), lambda x: F.rms_norm(x, (4,), eps=1e-6)),
    ("layer_norm", lambda x: ct.layer_norm(x, 4), lambda x: F.layer_norm(x, (4,))),
    ("rope", lambda x: ct.rope(x.view(1, 2, 1, 4)), lambda x: torch.softmax(x, -1)),
])
def test_integer_inputs_everywhere(name, ours, theirs):
    x = torch.arange(8).view(2, 4)
    e = same_error(lambda: ours(x), lambda: theirs(x), "not implemented for 'Long'")
    assert isinstance(e, NotImplementedError), type(e)  # 2.13's kernels raise NotImplementedError


def test_integer_embedding_table_is_refused_not_rounded():
    """F.embedding copies rows of an integer table; ctorch's kernels are float (f32 / bf16), so an
    integer table is refused (NotImplementedError, PyTorch computes it) rather than rounded."""
    x = torch.arange(8).view(2, 4) * (1 << 40)
    assert torch.equal(F.embedding(torch.tensor([1]), x), x[1:])
    with pytest.raises(NotImplementedError):
        ci.embedding(torch.tensor([1]), x)


def test_indices_of_the_wrong_dtype_are_refused_not_truncated():
    x = torch.randn(3, 5)
    same_error(lambda: ci.embedding(torch.tensor([0.0, 1.9]), x), lambda: F.embedding(torch.tensor([0.0, 1.9]), x))
    i = torch.zeros(3, 1)
    same_error(lambda: ci.gather(x, 1, i), lambda: torch.gather(x, 1, i))
    # int32 indices are taken (as PyTorch 2.13 does), exactly
    i32 = torch.tensor([[4], [0], [2]], dtype=torch.int32)
    assert torch.equal(ci.gather(x, 1, i32), torch.gather(x, 1, i32))
    torch.testing.assert_close(ci.scatter_add(x, 1, i32, x), torch.scatter_add(x, 1, i32, x))
    same_error(lambda: ci.scatter_add(x, 1, i, x), lambda: torch.scatter_add(x, 1, i, x))
    j = torch.zeros(3, dtype=torch.long)
    same_error(lambda: ci.gather(x, 1, j), lambda: torch.gather(x, 1, j))
    same_error(lambda: ci.gather(x, 1, torch.zeros(4, 1, dtype=torch.long)),
               lambda: torch.gather(x, 1, torch.zeros(4, 1, dtype=torch.long)))


def test_dims_out_of_range_are_refused_not_wrapped():
    x = torch.randn(3, 5)
    for ours, theirs in ((lambda: ci.sort(x, dim=5), lambda: torch.sort(x, dim=5)),
                         (lambda: ci.sum(x, dim=-3), lambda: torch.sum(x, dim=-3)),
                         (lambda: ci.max(x, 2), lambda: torch.max(x, 2)),
                         (lambda: ci.topk(x, 1, dim=2), lambda: torch.topk(x, 1, dim=2)),
                         (lambda: ci.gather(x, 2, torch.zeros(3, 1, dtype=torch.long)),
                          lambda: torch.gather(x, 2, torch.zeros(3, 1, dtype=torch.long)))):
        same_error(ours, theirs, "Dimension out of range")


def test_integers_beyond_float32_are_refused_not_rounded():
    big = torch.tensor([2 ** 25 + 1, 2 ** 25, 3])
    torch.sort(big)  # exact in PyTorch
    for f in (lambda: ci.sort(big), lambda: ci.topk(big, 1), lambda: ci.max(big, 0), lambda: ci.argmax(big),
              lambda: ci.sum(big), lambda: ci.gather(big, 0, torch.tensor([0]))):
        with pytest.raises(NotImplementedError, match="2\\^24"):
            f()
    small = torch.tensor([5, -3, 7, 7])
    assert torch.equal(ci.sort(small)[0], torch.sort(small)[0])
    assert torch.equal(ci.sum(small), torch.sum(small))
    same_error(lambda: ci.mean(small), lambda: torch.mean(small))
