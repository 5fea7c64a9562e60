"""Activations, normalisation and rotary embedding as torch.autograd functions over libctorch.

Drop-ins for torch.nn.functional.gelu / silu / layer_norm / rms_norm (F.rms_norm's
arguments), the SwiGLU gate of Llama's MLP and Llama's rotate-half RoPE. CPU tensors only.
bfloat16 inputs use the bf16 kernels (f32 maths inside); every other dtype is computed in
float32 and cast back to the input's dtype.
"""
import ctypes
import math

import torch

from .._lib import as_c, check, lib, ptr
from . import _checks as C

_I64, _VP, _F, _I = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float, ctypes.c_int


def _sig(name, *args):
    f = getattr(lib, name)
    f.argtypes = list(args)
    f.restype = ctypes.c_int


for _s in ("", "_bf16"):
    _sig("ct_gelu_forward" + _s, _VP, _VP, _I64, _I)
    _sig("ct_gelu_backward" + _s, _VP, _VP, _VP, _I64, _I)
    _sig("ct_silu_forward" + _s, _VP, _VP, _I64)
    _sig("ct_silu_backward" + _s, _VP, _VP, _VP, _I64)
    _sig("ct_swiglu_forward" + _s, _VP, _VP, _I64, _I64)
    _sig("ct_swiglu_backward" + _s, _VP, _VP, _VP, _I64, _I64)
    _sig("ct_rmsnorm_forward" + _s, _VP, _VP, _VP, _VP, _I64, _I64, _F)
    _sig("ct_rmsnorm_backward" + _s, _VP, _VP, _VP, _VP, _VP, _VP, _I64, _I64)
    _sig("ct_layernorm_forward" + _s, _VP, _VP, _VP, _VP, _VP, _VP, _I64, _I64, _F)
    _sig("ct_layernorm_backward" + _s, _VP, _VP, _VP, _VP, _VP, _VP, _VP, _VP, _I64, _I64)
_sig("ct_rope_forward", _VP, _VP, _VP, _I64, _I64, _I64, _I64, _F)
_sig("ct_rope_backward", _VP, _VP, _VP, _I64, _I64, _I64, _I64, _F)

_GELU = {"none": 0, "tanh": 1}
_SILU = 2


def _work_dtype(*ts):
    """bfloat16 when every given tensor is bf16 (None ignored), float32 otherwise."""
    ts = [t for t in ts if t is not None]
    return torch.bfloat16 if all(t.dtype == torch.bfloat16 for t in ts) else torch.float32


def _sfx(dt):
    return "_bf16" if dt == torch.bfloat16 else ""


# ---- activations ---------------------------------------------------------------------------

def _act_call(kind, dt, forward, *args):
    s = _sfx(dt)
    if kind == _SILU:
        fn = getattr(lib, ("ct_silu_forward" if forward else "ct_silu_backward") + s)
        check(fn(*args))
    else:
        fn = getattr(lib, ("ct_gelu_forward" if forward else "ct_gelu_backward") + s)
        check(fn(*args, kind))


class _Activation(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, kind):
        dt = _work_dtype(x)
        xc = as_c(x, dt)
        out = torch.empty_like(xc)
        _act_call(kind, dt, True, ptr(out), ptr(xc), xc.numel())
        ctx.kind, ctx.dt, ctx.in_dtype, ctx.keep = kind, dt, x.dtype, xc
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        xc = ctx.keep
        g = as_c(grad, ctx.dt)
        d = torch.empty_like(xc)
        _act_call(ctx.kind, ctx.dt, False, ptr(d), ptr(g), ptr(xc), xc.numel())
        return d.to(ctx.in_dtype), None


def gelu(x, approximate="none"):
    """F.gelu(x, approximate=...): 'none' is x * Phi(x) (erf), 'tanh' the tanh approximation."""
    if approximate not in _GELU:
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    C.floating("gelu", "input", x)
    return _Activation.apply(x, _GELU[approximate])


def silu(x):
    """F.silu(x) = x * sigmoid(x)."""
    C.floating("silu", "input", x)
    return _Activation.apply(x, _SILU)


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        dt = _work_dtype(x)
        H = x.shape[-1] // 2
        xc = as_c(x, dt)
        N = xc.numel() // (2 * H) if H else 0
        out = torch.empty(*x.shape[:-1], H, dtype=dt)
        check(getattr(lib, "ct_swiglu_forward" + _sfx(dt))(ptr(out), ptr(xc), N, H))
        ctx.dt, ctx.in_dtype, ctx.keep, ctx.NH = dt, x.dtype, xc, (N, H)
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        xc = ctx.keep
        N, H = ctx.NH
        g = as_c(grad, ctx.dt)
        d = torch.empty_like(xc)
        check(getattr(lib, "ct_swiglu_backward" + _sfx(ctx.dt))(ptr(d), ptr(g), ptr(xc), N, H))
        return d.to(ctx.in_dtype)


def swiglu(x):
    """silu(a) * b with a, b = x.chunk(2, dim=-1): the gated MLP activation of Llama.
    x is [..., 2H]; the result is [..., H]."""
    C.floating("swiglu", "input", x)
    if x.dim() == 0 or x.shape[-1] % 2:
        raise ValueError(f"swiglu: the last dim must be even (gate | value), got shape {tuple(x.shape)}")
    return _SwiGLU.apply(x)


# ---- norms ---------------------------------------------------------------------------------

def _grad_out(t, dtype):
    return None if t is None else t.to(dtype)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        C = x.shape[-1]
        dt = _work_dtype(x, weight)
        xc, wc = as_c(x, dt), as_c(weight, dt)
        N = xc.numel() // C if C else 0
        out = torch.empty_like(xc)
        rstd = torch.empty(N, dtype=torch.float32)
        check(getattr(lib, "ct_rmsnorm_forward" + _sfx(dt))(ptr(out), ptr(rstd), ptr(xc), ptr(wc),
                                                            N, C, eps))
        ctx.dt, ctx.NC, ctx.keep = dt, (N, C), (xc, wc, rstd)
        ctx.dtypes = (x.dtype, None if weight is None else weight.dtype)
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        xc, wc, rstd = ctx.keep
        N, C = ctx.NC
        g = as_c(grad, ctx.dt)
        dx = torch.empty_like(xc)
        dw = torch.zeros(C, dtype=torch.float32) if (wc is not None and ctx.needs_input_grad[1]) else None
        check(getattr(lib, "ct_rmsnorm_backward" + _sfx(ctx.dt))(ptr(dx), ptr(dw), ptr(g), ptr(xc), ptr(wc),
                                                                 ptr(rstd), N, C))
        return dx.to(ctx.dtypes[0]), _grad_out(dw, ctx.dtypes[1]), None


def rms_norm(input, normalized_shape=None, weight=None, eps=None):
    """F.rms_norm(input, normalized_shape, weight=None, eps=None): RMSNorm over the trailing
    normalized_shape dims, x / sqrt(mean(x^2) + eps) * weight; eps None means
    torch.finfo(input.dtype).eps, as PyTorch. ctorch's earlier form rms_norm(x, weight=None,
    eps=None) (the last dim, a tensor or nothing second) still works."""
    x = input
    if normalized_shape is None or isinstance(normalized_shape, torch.Tensor):  # rms_norm(x, weight, eps)
        if weight is not None and not isinstance(weight, torch.Tensor):
            eps, weight = weight, None
        weight = normalized_shape if weight is None else weight
        normalized_shape = None
    C.floating("rms_norm", "input", x)
    if x.dim() == 0:
        C.fail(RuntimeError, "rms_norm", "x needs at least one dim")
    if normalized_shape is None:
        ns = (x.shape[-1],)
    else:
        ns = (int(normalized_shape),) if isinstance(normalized_shape, int) else tuple(int(n) for n in normalized_shape)
        if not ns or tuple(x.shape[x.dim() - len(ns):]) != ns or len(ns) > x.dim():
            C.fail(RuntimeError, "rms_norm", f"Given normalized_shape={list(ns)}, expected input with shape "
                                             f"[*, {', '.join(map(str, ns))}], but got input of size"
                                             f"{list(x.shape)}")
    if weight is not None:
        C.floating("rms_norm", "weight", weight)
        if tuple(weight.shape) != ns:
            C.fail(RuntimeError, "rms_norm", f"Expected weight to be of same shape as normalized_shape, but got "
                                             f"weight of shape {list(weight.shape)} and normalized_shape = "
                                             f"{list(ns)}")
    if eps is None:
        eps = torch.finfo(x.dtype).eps if x.is_floating_point() else torch.finfo(torch.float32).eps
    if len(ns) > 1:  # the trailing dims as one
        n = math.prod(ns)
        out = _RMSNorm.apply(x.reshape(*x.shape[:x.dim() - len(ns)], n),
                             None if weight is None else weight.reshape(n), float(eps))
        return out.reshape(x.shape)
    return _RMSNorm.apply(x, weight, float(eps))


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, C, eps):
        dt = _work_dtype(x, weight, bias)
        xc = as_c(x, dt)
        wc = as_c(None if weight is None else weight.reshape(-1), dt)
        bc = as_c(None if bias is None else bias.reshape(-1), dt)
        N = xc.numel() // C if C else 0
        out = torch.empty_like(xc)
        mean = torch.empty(N, dtype=torch.float32)
        rstd = torch.empty(N, dtype=torch.float32)
        check(getattr(lib, "ct_layernorm_forward" + _sfx(dt))(ptr(out), ptr(mean), ptr(rstd), ptr(xc), ptr(wc),
                                                              ptr(bc), N, C, eps))
        ctx.dt, ctx.NC, ctx.keep = dt, (N, C), (xc, wc, mean, rstd)
        ctx.meta = [(t.dtype, t.shape) if t is not None else None for t in (x, weight, bias)]
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        xc, wc, mean, rstd = ctx.keep
        N, C = ctx.NC
        need = ctx.needs_input_grad
        g = as_c(grad, ctx.dt)
        dx = torch.empty_like(xc)
        dw = torch.zeros(C, dtype=torch.float32) if (ctx.meta[1] and need[1]) else None
        db = torch.zeros(C, dtype=torch.float32) if (ctx.meta[2] and need[2]) else None
        check(getattr(lib, "ct_layernorm_backward" + _sfx(ctx.dt))(ptr(dx), ptr(dw), ptr(db), ptr(g), ptr(xc),
                                                                   ptr(wc), ptr(mean), ptr(rstd), N, C))
        dw = dw.reshape(ctx.meta[1][1]).to(ctx.meta[1][0]) if dw is not None else None
        db = db.reshape(ctx.meta[2][1]).to(ctx.meta[2][0]) if db is not None else None
        return dx.to(ctx.meta[0][0]), dw, db, None, None


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """F.layer_norm: normalise over the trailing dims `normalized_shape` (an int or a tuple);
    weight and bias have that shape or are None."""
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    normalized_shape = tuple(int(s) for s in normalized_shape)
    k = len(normalized_shape)
    C.floating("layer_norm", "input", x)
    if k == 0 or tuple(x.shape[x.dim() - k:]) != normalized_shape or x.dim() < k:
        C.fail(RuntimeError, "layer_norm", f"Given normalized_shape={list(normalized_shape)}, expected input with "
                                           f"shape [*, {', '.join(map(str, normalized_shape))}], but got input of "
                                           f"size{list(x.shape)}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None:
            C.floating("layer_norm", name, t)
            if tuple(t.shape) != normalized_shape:
                C.fail(RuntimeError, "layer_norm", f"Expected {name} to be of same shape as normalized_shape, but "
                                                   f"got {name} of shape {list(t.shape)} and normalized_shape = "
                                                   f"{list(normalized_shape)}")
    return _LayerNorm.apply(x, weight, bias, math.prod(normalized_shape), float(eps))


# ---- RoPE ----------------------------------------------------------------------------------

class _RoPE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, positions, base):
        T, H, E = x.shape[-3:]
        B = x.numel() // (T * H * E) if T * H * E else 0
        xc = as_c(x, torch.float32)
        out = torch.empty_like(xc)
        check(lib.ct_rope_forward(ptr(out), ptr(xc), ptr(positions), B, T, H, E, base))
        ctx.args, ctx.in_dtype, ctx.pos = (B, T, H, E, base), x.dtype, positions
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        B, T, H, E, base = ctx.args
        g = as_c(grad, torch.float32)
        d = torch.empty_like(g)
        check(lib.ct_rope_backward(ptr(d), ptr(g), ptr(ctx.pos), B, T, H, E, base))
        return d.to(ctx.in_dtype), None, None


def rope(x, positions=None, base=10000.0):
    """Rotary position embedding, rotate-half convention (Llama / Hugging Face), on
    x [..., T, H, E] (time, heads, head dim; E even; any leading batch dims).
    positions: integer tensor [T] (shared by the batch) or None for 0..T-1.
    Angles are f32(position) * inv_freq with inv_freq = 1 / base^(2i/E) in f32, as HF."""
    C.floating("rope", "input", x)
    if x.dim() < 3:
        raise ValueError(f"rope: x must be [..., T, H, E], got shape {tuple(x.shape)}")
    T = x.shape[-3]
    if positions is not None:
        if positions.dtype.is_floating_point or tuple(positions.shape) != (T,):
            raise ValueError(f"rope: positions must be an integer tensor of shape [{T}]")
        positions = as_c(positions, torch.int32)
    return _RoPE.apply(x, positions, float(base))


# ---- softmax family ------------------------------------------------------------------------
# Rows of the last dim go to ct_softmax_forward / ct_log_softmax_forward / ct_logsumexp_rows
# (f32; other floating dtypes are computed in float32 and cast back); another `dim` is moved
# last first.

_sig("ct_softmax_forward", _VP, _VP, _I64, _I64)
_sig("ct_softmax_backward", _VP, _VP, _VP, _I64, _I64)
_sig("ct_log_softmax_forward", _VP, _VP, _I64, _I64)
_sig("ct_log_softmax_backward", _VP, _VP, _VP, _I64, _I64)
_sig("ct_logsumexp_rows", _VP, _VP, _I64, _I64)


def _rows(x):
    C = x.shape[-1] if x.dim() else 1
    return (x.numel() // C if C else 0), C


class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, log):
        xc = as_c(x, torch.float32)
        N, C = _rows(xc)
        out = torch.empty_like(xc)
        check((lib.ct_log_softmax_forward if log else lib.ct_softmax_forward)(ptr(out), ptr(xc), N, C))
        ctx.log, ctx.in_dtype, ctx.NC = log, x.dtype, (N, C)
        ctx.save_for_backward(out)
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        N, C = ctx.NC
        g = as_c(grad, torch.float32)
        d = torch.empty_like(g)
        check((lib.ct_log_softmax_backward if ctx.log else lib.ct_softmax_backward)(ptr(d), ptr(g), ptr(out), N, C))
        return d.to(ctx.in_dtype), None


class _LogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        xc = as_c(x, torch.float32)
        N, C = _rows(xc)
        lse = torch.empty(xc.shape[:-1], dtype=torch.float32)
        check(lib.ct_logsumexp_rows(ptr(lse), ptr(xc), N, C))
        ctx.in_dtype, ctx.NC = x.dtype, (N, C)
        ctx.save_for_backward(xc)
        return lse.to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        (xc,) = ctx.saved_tensors
        N, C = ctx.NC
        p = torch.empty_like(xc)  # d lse / d x = softmax(x)
        check(lib.ct_softmax_forward(ptr(p), ptr(xc), N, C))
        return (p * as_c(grad, torch.float32).unsqueeze(-1)).to(ctx.in_dtype)


def _along(fn, name, x, dim, keepdim=False):
    C.floating(name, "input", x)
    nd = max(x.dim(), 1)
    if not isinstance(dim, int) or not -nd <= dim < nd:
        C.fail(IndexError, name, f"Dimension out of range (expected to be in range of [{-nd}, {nd - 1}], "
                                 f"but got {dim})")
    if x.dim() == 0:
        return fn(x.reshape(1)).reshape(())
    dim %= x.dim()
    last = dim == x.dim() - 1
    xm = x if last else x.movedim(dim, -1)
    y = fn(xm)
    if name == "logsumexp":
        return y.unsqueeze(dim) if keepdim else y
    return y if last else y.movedim(-1, dim)


def softmax(x, dim):
    """torch.softmax(x, dim) (f32 maths)."""
    return _along(lambda t: _Softmax.apply(t, False), "softmax", x, dim)


def log_softmax(x, dim):
    """torch.log_softmax(x, dim) (f32 maths)."""
    return _along(lambda t: _Softmax.apply(t, True), "log_softmax", x, dim)


def logsumexp(x, dim, keepdim=False):
    """torch.logsumexp(x, dim, keepdim) over one dim (f32 maths)."""
    return _along(_LogSumExp.apply, "logsumexp", x, dim, keepdim)
