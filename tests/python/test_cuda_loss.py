"""ctorch.torch.linear_cross_entropy on CUDA tensors (the fused loss of libctorch_cuda.so)
against PyTorch's own linear + cross_entropy on the same GPU. Needs a CUDA GPU, a CUDA build of
PyTorch and libctorch_cuda.so: elsewhere every test says SKIPPED and why (a GPU test)."""
import pytest
import torch
import torch.nn.functional as F

import ctorch
import ctorch.torch as ct


def _why_not():
    if not torch.cuda.is_available():
        return "no CUDA GPU (torch.cuda.is_available() is False)"
    line = ctorch.lib.ct_cuda_describe()
    line = line.decode() if isinstance(line, bytes) else str(line)
    if "not loaded" in line or "no usable GPU" in line:
        return line
    return None


WHY = _why_not() if hasattr(ctorch, "lib") else "ctorch.lib missing"
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"SKIPPED: {WHY}")


def _ref(h, w, y, **kw):
    return F.cross_entropy(F.linear(h.double(), w.double()), y, **kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("opts", [{}, {"label_smoothing": 0.1}, {"ignore_index": 3}, {"reduction": "sum"}])
def test_matches_pytorch_on_the_gpu(dtype, opts):
    g = torch.Generator(device="cuda").manual_seed(0)
    N, D, V = 300, 64, 1000
    h = torch.randn(N, D, device="cuda", generator=g).to(dtype).requires_grad_()
    w = (torch.randn(V, D, device="cuda", generator=g) * 0.1).to(dtype).requires_grad_()
    y = torch.randint(0, V, (N,), device="cuda", generator=g)
    y[::7] = 3
    loss = ct.linear_cross_entropy(h, w, y, **opts)
    loss.backward()
    hr, wr = h.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = _ref(hr, wr, y, **opts)
    ref.backward()
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    assert torch.allclose(loss.double(), ref, rtol=tol, atol=tol)
    assert torch.allclose(h.grad.double(), hr.grad, rtol=tol, atol=tol * 1e-2 + 1e-6)
    assert torch.allclose(w.grad.double(), wr.grad, rtol=tol, atol=tol * 1e-2 + 1e-6)


def test_bitwise_repeatable_and_bad_targets():
    N, D, V = 257, 48, 777
    h = torch.randn(N, D, device="cuda").requires_grad_()
    w = torch.randn(V, D, device="cuda").requires_grad_()
    y = torch.randint(0, V, (N,), device="cuda")
    outs = []
    for _ in range(3):
        h.grad = w.grad = None
        loss = ct.linear_cross_entropy(h, w, y)
        loss.backward()
        outs.append((loss.detach().clone(), h.grad.clone(), w.grad.clone()))
    for o in outs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(outs[0], o))
    y[5] = V
    with pytest.raises(IndexError, match="out of bounds"):
        ct.linear_cross_entropy(h, w, y)
    with pytest.raises(RuntimeError, match="same device"):
        ct.linear_cross_entropy(h, w.detach().cpu(), y)
