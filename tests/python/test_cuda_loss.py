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


def _capped(logits, softcap):
    return logits if softcap is None else softcap * torch.tanh(logits / softcap)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("opts", [{}, {"ignore_index": 3}, {"label_smoothing": 0.1}, {"weight": True},
                                  {"softcap": 5.0, "bias": True}, {"z_loss": 1e-2}])
def test_reduction_none_with_gradients_matches_pytorch(dtype, opts):
    """reduction='none' with gradients on CUDA tensors (per-row upstream gradients, grad_rows):
    loss rows and every gradient against PyTorch's own ops on the GPU in float64 (the bf16
    inputs are exact there; ctorch's bf16 G rounding stays within bf16's tolerance)."""
    opts = dict(opts)
    g = torch.Generator(device="cuda").manual_seed(1)
    N, D, V = 200, 64, 1500
    h = torch.randn(N, D, device="cuda", generator=g).to(dtype).requires_grad_()
    w = (torch.randn(V, D, device="cuda", generator=g) * 0.1).to(dtype).requires_grad_()
    b = (torch.randn(V, device="cuda", generator=g) * 0.1).requires_grad_() if opts.pop("bias", False) else None
    cw = torch.rand(V, device="cuda", generator=g) + 0.5 if opts.pop("weight", False) else None
    y = torch.randint(0, V, (N,), device="cuda", generator=g)
    y[::7] = 3
    up = torch.randn(N, device="cuda", generator=g)
    up[0] = 0.0
    softcap, z = opts.pop("softcap", None), opts.pop("z_loss", 0.0)
    loss = ct.linear_cross_entropy(h, w, y, linear_bias=b, weight=cw, reduction="none", softcap=softcap,
                                   z_loss=z, **opts)
    (loss.float() * up).sum().backward()
    hr, wr = h.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    br = b.detach().double().requires_grad_() if b is not None else None
    logits = _capped(F.linear(hr, wr, br), softcap)
    ref = F.cross_entropy(logits, y, weight=None if cw is None else cw.double(), reduction="none", **opts)
    if z:
        ii = opts.get("ignore_index", -100)
        ref = ref + z * torch.logsumexp(logits, -1) ** 2 * (y != ii)
    (ref * up.double()).sum().backward()
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    assert loss.shape == (N,)
    assert torch.allclose(loss.double(), ref.detach(), rtol=tol, atol=tol)
    for got, want in ((h.grad, hr.grad), (w.grad, wr.grad)) + (((b.grad, br.grad),) if b is not None else ()):
        scale = want.abs().max().item()
        assert torch.allclose(got.double(), want, rtol=tol, atol=tol * scale), (got - want).abs().max()


def test_bf16_gradients_follow_pytorchs_bf16_path():
    """bf16 inputs: the gradients are those of PyTorch's bf16 path (logits' gradient in bf16,
    bf16 GEMMs with f32 accumulation) within bf16 rounding, and bitwise repeatable."""
    g = torch.Generator(device="cuda").manual_seed(2)
    N, D, V = 512, 128, 4000
    h = torch.randn(N, D, device="cuda", generator=g).bfloat16().requires_grad_()
    w = (torch.randn(V, D, device="cuda", generator=g) * 0.05).bfloat16().requires_grad_()
    y = torch.randint(0, V, (N,), device="cuda", generator=g)
    runs = []
    for _ in range(2):
        h.grad = w.grad = None
        ct.linear_cross_entropy(h, w, y).backward()
        runs.append((h.grad.clone(), w.grad.clone()))
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    hr, wr = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    F.cross_entropy(F.linear(hr, wr).float(), y).backward()
    for got, want in ((runs[0][0], hr.grad), (runs[0][1], wr.grad)):
        scale = want.float().abs().max().item()
        assert torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-2 * scale)
