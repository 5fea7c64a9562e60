"""ctorch.torch.nn against PyTorch 2.13's own ops: forward values and gradients of gelu, silu,
swiglu (F.silu(a) * b), rms_norm (F.rms_norm), layer_norm, and rope against transformers'
LlamaRotaryEmbedding + apply_rotary_pos_emb (PyTorch has no RoPE op); ct_adamw_step against
torch.optim.AdamW."""
import ctypes

import pytest
import torch
import torch.nn.functional as F

import ctorch
from ctorch import CtorchError
from ctorch.torch import gelu, layer_norm, rms_norm, rope, silu, swiglu


def _grads(fn, *inputs, seed=0):
    """Output of fn and the gradients of sum(out * g) for a fixed random g."""
    ins = [t.detach().clone().requires_grad_(True) if t is not None else None for t in inputs]
    out = fn(*ins)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    (out.double() * g).sum().backward()
    return out.detach(), [t.grad if t is not None else None for t in ins]


def _close(a, b, atol, rtol):
    torch.testing.assert_close(a.double(), b.double(), atol=atol, rtol=rtol)


def _compare(mine, ref, inputs, atol=1e-5, rtol=1e-5, gatol=None):
    """mine(*inputs) vs ref(*inputs in float64): values and gradients."""
    o1, g1 = _grads(mine, *inputs)
    o2, g2 = _grads(ref, *[t.double() if t is not None else None for t in inputs])
    assert o1.dtype == inputs[0].dtype
    _close(o1, o2, atol, rtol)
    for a, b in zip(g1, g2):
        if b is not None:
            assert a is not None and a.dtype != torch.float64
            _close(a, b, gatol or atol, rtol)


@pytest.fixture(params=["scalar", "avx2"])
def isa(request):
    """Run a test on both code paths (avx2 where the CPU has it; else it is the scalar path)."""
    lib = ctorch.lib
    old = lib.ct_active_isa()
    lib.ct_set_isa(1 if request.param == "avx2" else 0)
    yield request.param
    lib.ct_set_isa(old)


def _x(*shape, lo=-4.0, hi=4.0, seed=1, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(*shape, generator=g, dtype=torch.float64) * (hi - lo) + lo).to(dtype)


# ---- activations ---------------------------------------------------------------------------

@pytest.mark.parametrize("approx", ["none", "tanh"])
@pytest.mark.parametrize("shape", [(0,), (1,), (3, 7), (2, 5, 33)])
def test_gelu(isa, approx, shape):
    x = _x(*shape, lo=-8, hi=8)
    _compare(lambda t: gelu(t, approximate=approx), lambda t: F.gelu(t, approximate=approx), [x])


@pytest.mark.parametrize("shape", [(0,), (1,), (4, 9), (3, 2, 17)])
def test_silu(isa, shape):
    _compare(silu, F.silu, [_x(*shape, lo=-10, hi=10)])


@pytest.mark.parametrize("shape", [(1, 2), (5, 14), (2, 3, 66)])
def test_swiglu(isa, shape):
    def ref(t):
        a, b = t.chunk(2, dim=-1)
        return F.silu(a) * b
    _compare(swiglu, ref, [_x(*shape)])


def test_activations_bf16(isa):
    x = _x(6, 40, lo=-6, hi=6, dtype=torch.bfloat16)
    for mine, ref in [(lambda t: gelu(t), F.gelu), (lambda t: gelu(t, "tanh"), lambda t: F.gelu(t, approximate="tanh")),
                      (silu, F.silu), (swiglu, lambda t: F.silu(t.chunk(2, -1)[0]) * t.chunk(2, -1)[1])]:
        o1, (g1,) = _grads(mine, x)
        o2, (g2,) = _grads(ref, x.float())
        assert o1.dtype == torch.bfloat16 and g1.dtype == torch.bfloat16
        _close(o1, o2, 1e-3, 1.6e-2)
        _close(g1, g2, 1e-2, 1.6e-2)


def test_activation_errors():
    with pytest.raises(ValueError):
        gelu(torch.zeros(3), approximate="exact")
    with pytest.raises(ValueError):
        swiglu(torch.zeros(2, 3))


# ---- norms ---------------------------------------------------------------------------------

def _rms_ref(x, w, eps):
    return F.rms_norm(x, (x.shape[-1],), w, eps)


@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (2, 5, 64), (4, 129)])
@pytest.mark.parametrize("affine", [True, False])
def test_rms_norm(isa, shape, affine):
    x = _x(*shape, lo=-2, hi=3)
    w = _x(shape[-1], lo=0.5, hi=1.5, seed=2) if affine else None
    _compare(lambda t, u: rms_norm(t, u, eps=1e-6), lambda t, u: _rms_ref(t, u, 1e-6), [x, w], gatol=1e-4)


@pytest.mark.parametrize("ns", [(64,), (5, 64), [64]])
def test_rms_norm_is_f_rms_norm(ns):
    """rms_norm takes F.rms_norm's arguments (input, normalized_shape, weight, eps), one or more
    trailing dims; the same values, gradients and errors."""
    x = _x(2, 5, 64, lo=-2, hi=3)
    shape = tuple(ns)
    w = _x(*shape, lo=0.5, hi=1.5, seed=2)
    _compare(lambda t: rms_norm(t, ns), lambda t: F.rms_norm(t, ns), [x])
    _compare(lambda t, u: rms_norm(t, ns, u), lambda t, u: F.rms_norm(t, ns, u), [x, w], gatol=1e-4)
    _compare(lambda t, u: rms_norm(t, ns, u, 1e-3), lambda t, u: F.rms_norm(t, ns, u, 1e-3), [x, w], gatol=1e-4)
    for bad in ((7,), (4, 64)):
        with pytest.raises(RuntimeError):
            F.rms_norm(x, bad)
        with pytest.raises(RuntimeError):
            rms_norm(x, bad)


def test_rms_norm_default_eps():
    """eps None is finfo(input.dtype).eps, as F.rms_norm's (on the same float32 input)."""
    x = _x(3, 8) * 1e-4
    _close(rms_norm(x), F.rms_norm(x, (8,)), 1e-5, 1e-5)
    _close(rms_norm(x), _rms_ref(x.double(), None, torch.finfo(torch.float32).eps), 1e-5, 1e-5)


def test_rms_norm_bf16(isa):
    x = _x(4, 96, lo=-2, hi=3, dtype=torch.bfloat16)
    w = _x(96, lo=0.5, hi=1.5, seed=2, dtype=torch.bfloat16)
    o1, (gx1, gw1) = _grads(lambda t, u: rms_norm(t, u, 1e-6), x, w)
    o2, (gx2, gw2) = _grads(lambda t, u: _rms_ref(t, u, 1e-6), x.double(), w.double())
    assert o1.dtype == torch.bfloat16 and gx1.dtype == torch.bfloat16 and gw1.dtype == torch.bfloat16
    _close(o1, o2, 1e-2, 1.6e-2)
    _close(gx1, gx2, 2e-2, 1.6e-2)
    _close(gw1, gw2, 5e-2, 1.6e-2)


@pytest.mark.parametrize("shape,norm", [((3, 7), (7,)), ((2, 5, 64), (64,)), ((2, 3, 4, 5), (4, 5)), ((1, 1), 1)])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm(isa, shape, norm, affine):
    ns = (norm,) if isinstance(norm, int) else norm
    x = _x(*shape, lo=-2, hi=3)
    w = _x(*ns, lo=0.5, hi=1.5, seed=2) if affine else None
    b = _x(*ns, lo=-0.5, hi=0.5, seed=3) if affine else None
    _compare(lambda t, u, v: layer_norm(t, norm, u, v, 1e-5), lambda t, u, v: F.layer_norm(t, ns, u, v, 1e-5),
             [x, w, b], gatol=1e-4)


def test_layer_norm_bf16():
    x = _x(4, 80, lo=-2, hi=3, dtype=torch.bfloat16)
    w = _x(80, lo=0.5, hi=1.5, seed=2, dtype=torch.bfloat16)
    b = _x(80, lo=-0.5, hi=0.5, seed=3, dtype=torch.bfloat16)
    o1, g1 = _grads(lambda t, u, v: layer_norm(t, 80, u, v), x, w, b)
    o2, g2 = _grads(lambda t, u, v: F.layer_norm(t, (80,), u, v), x.double(), w.double(), b.double())
    assert o1.dtype == torch.bfloat16
    _close(o1, o2, 2e-2, 1.6e-2)
    for a, r in zip(g1, g2):
        assert a.dtype == torch.bfloat16
        _close(a, r, 5e-2, 1.6e-2)


def test_norm_errors():
    # the classes PyTorch raises
    with pytest.raises(RuntimeError):
        F.rms_norm(torch.zeros(2, 3), (3,), torch.ones(4))
    with pytest.raises(RuntimeError):
        rms_norm(torch.zeros(2, 3), torch.ones(4))
    with pytest.raises(RuntimeError):
        torch.nn.functional.layer_norm(torch.zeros(2, 3), (4,))
    with pytest.raises(RuntimeError):
        layer_norm(torch.zeros(2, 3), (4,))
    with pytest.raises(CtorchError) as e:
        rms_norm(torch.zeros(2, 3), eps=-1.0)
    assert e.value.status == "CT_EINVAL" and "eps" in str(e.value)


def test_norm_grads_deterministic_across_threads():
    x = _x(300, 72, lo=-2, hi=2)
    w = _x(72, lo=0.5, hi=1.5, seed=2)
    b = _x(72, lo=-0.5, hi=0.5, seed=3)
    old = ctorch.num_threads()
    res = []
    try:
        for n in (1, 2, 3):
            ctorch.set_num_threads(n)
            _, g_rms = _grads(lambda t, u: rms_norm(t, u, 1e-6), x, w)
            _, g_ln = _grads(lambda t, u, v: layer_norm(t, 72, u, v), x, w, b)
            res.append(g_rms + g_ln)
    finally:
        ctorch.set_num_threads(old)
    for r in res[1:]:
        for a, b_ in zip(res[0], r):
            assert torch.equal(a, b_)


# ---- AdamW ---------------------------------------------------------------------------------

class _AdamWOptions(ctypes.Structure):
    """ct_adamw_options (include/ctorch/optim.h): five floats."""
    _fields_ = [("lr", ctypes.c_float), ("beta1", ctypes.c_float), ("beta2", ctypes.c_float),
                ("eps", ctypes.c_float), ("weight_decay", ctypes.c_float)]


def _ct_adamw(p, grads, lr, betas, eps, wd):
    """ct_adamw_step over the flat f32 tensor p (updated in place), one step per gradient."""
    lib = ctorch.lib
    fp = ctypes.POINTER(ctypes.c_float)
    lib.ct_adamw_step.argtypes = [fp, fp, fp, fp, ctypes.c_int64, ctypes.c_int64,
                                  ctypes.POINTER(_AdamWOptions)]
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    o = _AdamWOptions(lr, betas[0], betas[1], eps, wd)
    ptr = lambda t: ctypes.cast(t.data_ptr(), fp)  # noqa: E731
    for step, g in enumerate(grads, 1):
        code = lib.ct_adamw_step(ptr(p), ptr(g), ptr(m), ptr(v), p.numel(), step, ctypes.byref(o))
        assert code == 0, lib.ct_last_error().decode()
    return p, m, v


@pytest.mark.parametrize("n", [1, 13, 4099])
def test_adamw_is_torch_adamw(isa, n):
    """ct_adamw_step against torch.optim.AdamW (the single-tensor loop and fused=True) over 6
    steps, with zero gradients among the elements; the AVX2 body gives the scalar body's bits
    (the same IEEE operations per element: ops/optim_kernels.h)."""
    lr, betas, eps, wd = 0.01, (0.9, 0.95), 1e-8, 0.1
    p0 = _x(n, lo=-1, hi=1, seed=11)
    grads = [_x(n, lo=-0.5, hi=0.5, seed=20 + s) for s in range(6)]
    for g in grads:
        g[::7] = 0
    mine, m, v = _ct_adamw(p0.clone(), grads, lr, betas, eps, wd)
    for fused in (False, True):
        ref = p0.clone().requires_grad_(True)
        opt = torch.optim.AdamW([ref], lr=lr, betas=betas, eps=eps, weight_decay=wd,
                                foreach=False, fused=fused)
        for g in grads:
            ref.grad = g.clone()
            opt.step()
        st = opt.state[ref]
        torch.testing.assert_close(mine, ref.detach(), atol=2e-7, rtol=2e-6)
        torch.testing.assert_close(m, st["exp_avg"], atol=1e-8, rtol=2e-6)
        torch.testing.assert_close(v, st["exp_avg_sq"], atol=1e-10, rtol=2e-6)
    lib = ctorch.lib
    old = lib.ct_active_isa()
    try:
        lib.ct_set_isa(0)
        scalar = _ct_adamw(p0.clone(), grads, lr, betas, eps, wd)
    finally:
        lib.ct_set_isa(old)
    for a, b in zip((mine, m, v), scalar):
        assert torch.equal(a, b)


# ---- RoPE ----------------------------------------------------------------------------------

def _rope_ref(x, positions, base):
    """transformers' LlamaRotaryEmbedding (default rope, theta = base) and apply_rotary_pos_emb
    on x [..., T, H, E] (the heads dim is 2 after flattening the batch dims)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb
    T, H, E = x.shape[-3:]
    cfg = LlamaConfig(hidden_size=H * E, num_attention_heads=H, head_dim=E, rope_theta=base)
    assert cfg.rope_parameters == {"rope_theta": base, "rope_type": "default"}
    pos = (torch.arange(T) if positions is None else positions)[None]
    xb = x.reshape(-1, T, H, E)
    cos, sin = LlamaRotaryEmbedding(cfg)(xb, pos)
    out, _ = apply_rotary_pos_emb(xb, xb, cos, sin, unsqueeze_dim=2)
    return out.reshape(x.shape)


@pytest.mark.parametrize("shape", [(2, 5, 3, 8), (1, 7, 2, 2), (4, 6, 64), (2, 3, 9, 4, 32)])
@pytest.mark.parametrize("with_pos", [False, True])
@pytest.mark.parametrize("base", [10000.0, 500000.0])
def test_rope(shape, with_pos, base):
    T = shape[-3]
    pos = torch.tensor([3 * t + 1 for t in range(T)][::-1], dtype=torch.int64) if with_pos else None
    x = _x(*shape, lo=-2, hi=2)
    o1, (g1,) = _grads(lambda t: rope(t, pos, base), x)
    o2, (g2,) = _grads(lambda t: _rope_ref(t, pos, base), x)
    _close(o1, o2, 1e-5, 1e-5)
    _close(g1, g2, 1e-5, 1e-5)


def test_rope_errors():
    with pytest.raises(CtorchError) as e:
        rope(torch.zeros(1, 2, 3, 5))
    assert e.value.status == "CT_EINVAL" and "even" in str(e.value)
    with pytest.raises(ValueError):
        rope(torch.zeros(2, 4))
    with pytest.raises(ValueError):
        rope(torch.zeros(1, 2, 3, 4), positions=torch.zeros(3, dtype=torch.int64))
