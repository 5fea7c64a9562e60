"""ctorch.torch.softmax / log_softmax / logsumexp (ct_softmax_forward / _backward,
ct_log_softmax_forward / _backward, ct_logsumexp_rows) against PyTorch 2.13's torch.softmax /
log_softmax / logsumexp in float64:
values and gradients on the scalar and AVX2 paths, other dims, large and -inf logits, bad
input."""
import pytest
import torch

import ctorch
from ctorch import CtorchError
from ctorch.torch import log_softmax, logsumexp, softmax


@pytest.fixture(params=["scalar", "avx2"])
def isa(request):
    lib = ctorch.lib
    old = lib.ct_active_isa()
    lib.ct_set_isa(1 if request.param == "avx2" else 0)
    yield request.param
    lib.ct_set_isa(old)


def _x(*shape, lo=-6.0, hi=6.0, seed=3):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(*shape, generator=g, dtype=torch.float64) * (hi - lo) + lo).float()


def _check(mine, ref, x, atol=1e-6, rtol=1e-5):
    a = x.clone().requires_grad_(True)
    b = x.double().requires_grad_(True)
    o1, o2 = mine(a), ref(b)
    assert o1.dtype == torch.float32 and o1.shape == o2.shape
    torch.testing.assert_close(o1.double(), o2.detach(), atol=atol, rtol=rtol)
    g = torch.randn(o2.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    (o1.double() * g).sum().backward()
    (o2 * g).sum().backward()
    torch.testing.assert_close(a.grad.double(), b.grad, atol=atol * 10, rtol=rtol * 10)


SHAPES = [(1, 1), (3, 7), (2, 5, 33), (4, 1000)]


@pytest.mark.parametrize("shape", SHAPES)
def test_softmax(isa, shape):
    _check(lambda t: softmax(t, -1), lambda t: torch.softmax(t, -1), _x(*shape))


@pytest.mark.parametrize("shape", SHAPES)
def test_log_softmax(isa, shape):
    _check(lambda t: log_softmax(t, -1), lambda t: torch.log_softmax(t, -1), _x(*shape), atol=1e-5)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("keepdim", [False, True])
def test_logsumexp(isa, shape, keepdim):
    _check(lambda t: logsumexp(t, -1, keepdim), lambda t: torch.logsumexp(t, -1, keepdim), _x(*shape),
           atol=1e-5)


@pytest.mark.parametrize("dim", [0, 1, -3])
def test_other_dims(isa, dim):
    x = _x(3, 4, 5, seed=dim + 10)
    _check(lambda t: softmax(t, dim), lambda t: torch.softmax(t, dim), x)
    _check(lambda t: log_softmax(t, dim), lambda t: torch.log_softmax(t, dim), x, atol=1e-5)
    _check(lambda t: logsumexp(t, dim, True), lambda t: torch.logsumexp(t, dim, True), x, atol=1e-5)


def test_large_and_infinite_logits(isa):
    # Shifted by the row max: no overflow at 1e4; -inf entries get probability 0.
    x = _x(5, 17) * 1000.0
    x[1, 3] = float("-inf")
    x[2, :5] = float("-inf")
    torch.testing.assert_close(softmax(x, -1).double(), torch.softmax(x.double(), -1), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(logsumexp(x, -1).double(), torch.logsumexp(x.double(), -1), atol=1e-3,
                               rtol=1e-6)
    lsm, ref = log_softmax(x, -1).double(), torch.log_softmax(x.double(), -1)
    assert torch.equal(torch.isinf(lsm), torch.isinf(ref))
    fin = torch.isfinite(ref)
    torch.testing.assert_close(lsm[fin], ref[fin], atol=1e-3, rtol=1e-6)
    # A row of -inf only: logsumexp is -inf (ct_logsumexp_rows' documented rule, as torch).
    row = torch.full((1, 4), float("-inf"))
    assert logsumexp(row, -1).item() == float("-inf") == torch.logsumexp(row, -1).item()


def test_other_dtypes_are_cast_back():
    for dt in (torch.float64, torch.bfloat16):
        x = _x(3, 9).to(dt)
        y = softmax(x, -1)
        assert y.dtype == dt
        torch.testing.assert_close(y.double(), torch.softmax(x.double(), -1), atol=1e-2 if dt == torch.bfloat16
                                   else 1e-6, rtol=1e-2 if dt == torch.bfloat16 else 1e-5)


def test_scalar_and_empty():
    s = torch.tensor(2.5)
    assert softmax(s, 0).item() == 1.0 == torch.softmax(s, 0).item()
    assert logsumexp(s, 0).item() == 2.5 == torch.logsumexp(s, 0).item()
    e = torch.empty(0, 6)
    assert softmax(e, -1).shape == (0, 6) and logsumexp(e, -1).shape == (0,)


def test_bad_input():
    with pytest.raises(IndexError, match="Dimension out of range"):
        softmax(_x(2, 3), 2)
    with pytest.raises(IndexError, match="Dimension out of range"):
        logsumexp(_x(2, 3), -3)
    with pytest.raises(NotImplementedError, match="not implemented for 'Long'"):  # as torch 2.13 does
        torch.log_softmax(torch.arange(6).reshape(2, 3), -1)
    with pytest.raises(NotImplementedError, match="floating-point"):
        log_softmax(torch.arange(6).reshape(2, 3), -1)
    with pytest.raises(TypeError):
        softmax([1.0, 2.0], -1)


def test_c_api_rejects_bad_lengths():
    # The C entry points check their sizes: a negative row count names the argument.
    out = torch.empty(4)
    with pytest.raises(CtorchError, match="N"):
        ctorch._lib.check(ctorch.lib.ct_softmax_forward(ctorch._lib.ptr(out), ctorch._lib.ptr(out), -1, 4))
