"""Fused linear + cross-entropy (PyTorch 2.13's F.linear_cross_entropy, plus z-loss and
softcap) and cross-entropy on logits, as torch.autograd functions over libctorch."""
import ctypes

import torch

from .._lib import as_c, check, lib, ptr

_REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}
_DT = {torch.float32: 0, torch.bfloat16: 3, torch.int64: 8, torch.int32: 7}


class CeOptions(ctypes.Structure):
    _fields_ = [("ignore_index", ctypes.c_int64), ("reduction", ctypes.c_int),
                ("label_smoothing", ctypes.c_float), ("class_weight", ctypes.c_void_p),
                ("z_loss", ctypes.c_float), ("softcap", ctypes.c_float),
                ("scratch_bytes", ctypes.c_size_t)]


class CeOutputs(ctypes.Structure):
    _fields_ = [("loss", ctypes.c_void_p), ("z_loss", ctypes.c_void_p), ("lse", ctypes.c_void_p)]


class LceInputs(ctypes.Structure):
    _fields_ = [("h", ctypes.c_void_p), ("weight", ctypes.c_void_p), ("bias", ctypes.c_void_p),
                ("dtype", ctypes.c_int), ("target", ctypes.c_void_p), ("target_dtype", ctypes.c_int),
                ("N", ctypes.c_int64), ("D", ctypes.c_int64), ("V", ctypes.c_int64)]


class LceGrads(ctypes.Structure):
    _fields_ = [("dh", ctypes.c_void_p), ("dweight", ctypes.c_void_p), ("dbias", ctypes.c_void_p),
                ("accumulate", ctypes.c_bool)]


lib.ct_ce_options_default.restype = CeOptions
lib.ct_ce_options_default.argtypes = []
_P = ctypes.POINTER
lib.ct_linear_cross_entropy_forward.argtypes = [_P(CeOutputs), _P(LceInputs), _P(CeOptions)]
lib.ct_linear_cross_entropy_backward.argtypes = [_P(LceGrads), ctypes.c_void_p, ctypes.c_void_p,
                                                 _P(LceInputs), _P(CeOptions)]
lib.ct_linear_cross_entropy_forward_backward.argtypes = [_P(CeOutputs), _P(LceGrads), ctypes.c_void_p,
                                                         _P(LceInputs), _P(CeOptions)]
lib.ct_cross_entropy_forward.argtypes = [_P(CeOutputs), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                         ctypes.c_int64, ctypes.c_int64, _P(CeOptions)]
lib.ct_cross_entropy_backward.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                          ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                                          _P(CeOptions)]


def _p(t):
    p = ptr(t)
    return None if p is None else p.value


def _options(reduction, ignore_index, label_smoothing, weight, z_loss, softcap, scratch_bytes=None):
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {sorted(_REDUCTIONS)}, got {reduction!r}")
    o = lib.ct_ce_options_default()
    o.ignore_index = -100 if ignore_index is None else int(ignore_index)
    o.reduction = _REDUCTIONS[reduction]
    o.label_smoothing = float(label_smoothing)
    o.class_weight = _p(weight)
    o.z_loss = float(z_loss)
    o.softcap = 0.0 if softcap is None else float(softcap)
    if scratch_bytes:
        o.scratch_bytes = int(scratch_bytes)
    return o


def _target(target):
    if target.dtype not in (torch.int64, torch.int32):
        target = target.long()
    return target.contiguous()


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, w, b, target, cw, reduction, ignore_index, label_smoothing, z_loss, softcap,
                scratch_bytes):
        work = torch.bfloat16 if (h.dtype == torch.bfloat16 and w.dtype == torch.bfloat16) else torch.float32
        lead = h.shape[:-1]
        D = h.shape[-1]
        hc = as_c(h.reshape(-1, D), work)
        wc = as_c(w, work)
        bc = as_c(b, torch.float32)
        tc = _target(target.reshape(-1))
        cwc = as_c(cw, torch.float32)
        N, V = hc.shape[0], wc.shape[0]
        if tc.numel() != N:
            raise ValueError(f"target has {tc.numel()} elements, input has {N} rows")
        if wc.shape[1] != D:
            raise ValueError(f"linear_weight is {tuple(wc.shape)}, expected [V, {D}]")
        o = _options(reduction, ignore_index, label_smoothing, cwc, z_loss, softcap, scratch_bytes)
        inp = LceInputs(_p(hc), _p(wc), _p(bc), _DT[work], _p(tc), _DT[tc.dtype], N, D, V)
        shape = (N,) if reduction == "none" else ()
        loss = torch.empty(shape, dtype=torch.float32)
        zl = torch.empty(shape, dtype=torch.float32)
        lse = torch.empty(N, dtype=torch.float32)
        outs = CeOutputs(_p(loss), _p(zl), _p(lse))
        need = ctx.needs_input_grad
        ctx.meta = (reduction, lead, h.dtype, w.dtype, None if b is None else b.dtype)
        ctx.opts = o
        ctx.inp = inp
        if reduction != "none" and (need[0] or need[1] or need[2]):
            # The training path: gradients in the same pass, scaled by grad_output later.
            dh = torch.empty(N, D, dtype=torch.float32) if need[0] else None
            dw = torch.empty(V, D, dtype=torch.float32) if need[1] else None
            db = torch.empty(V, dtype=torch.float32) if (need[2] and b is not None) else None
            g = LceGrads(_p(dh), _p(dw), _p(db), False)
            check(lib.ct_linear_cross_entropy_forward_backward(ctypes.byref(outs), ctypes.byref(g), None,
                                                               ctypes.byref(inp), ctypes.byref(o)))
            ctx.fused = True
            ctx.save_for_backward(dh, dw, db)
            ctx.keep = (hc, wc, bc, tc, cwc)
        else:
            check(lib.ct_linear_cross_entropy_forward(ctypes.byref(outs), ctypes.byref(inp), ctypes.byref(o)))
            ctx.fused = False
            ctx.save_for_backward(lse)
            ctx.keep = (hc, wc, bc, tc, cwc)
        ctx.mark_non_differentiable(zl)
        return loss.to(h.dtype) if h.dtype != torch.float32 else loss, zl

    @staticmethod
    def backward(ctx, grad_loss, grad_z):
        reduction, lead, hdt, wdt, bdt = ctx.meta
        need = ctx.needs_input_grad
        hc, wc, bc, tc, cwc = ctx.keep
        N, D, V = ctx.inp.N, ctx.inp.D, ctx.inp.V
        if ctx.fused:
            dh, dw, db = ctx.saved_tensors
            g = grad_loss.to(torch.float32)
            dh = dh * g if dh is not None else None
            dw = dw * g if dw is not None else None
            db = db * g if db is not None else None
        else:
            (lse,) = ctx.saved_tensors
            dloss = as_c(grad_loss, torch.float32).reshape(-1)
            dh = torch.empty(N, D, dtype=torch.float32) if need[0] else None
            dw = torch.empty(V, D, dtype=torch.float32) if need[1] else None
            db = torch.empty(V, dtype=torch.float32) if (need[2] and bc is not None) else None
            g = LceGrads(_p(dh), _p(dw), _p(db), False)
            check(lib.ct_linear_cross_entropy_backward(ctypes.byref(g), _p(dloss), _p(lse),
                                                       ctypes.byref(ctx.inp), ctypes.byref(ctx.opts)))
        dh = dh.reshape(*lead, D).to(hdt) if dh is not None else None
        dw = dw.to(wdt) if dw is not None else None
        db = db.to(bdt) if db is not None else None
        return dh, dw, db, None, None, None, None, None, None, None, None


def linear_cross_entropy(input, linear_weight, target, *, linear_bias=None, weight=None, reduction="mean",
                         ignore_index=-100, label_smoothing=0.0, z_loss=0.0, softcap=None,
                         return_z_loss=False, scratch_bytes=None):
    """cross_entropy(linear(input, linear_weight, linear_bias), target, ...) without holding
    the logits. ``weight`` is the per-class weight, as in F.cross_entropy. With
    ``return_z_loss`` returns (loss, z_term); the z term is already part of loss."""
    loss, z = _LinearCrossEntropy.apply(input, linear_weight, linear_bias, target, weight, reduction,
                                        ignore_index, label_smoothing, z_loss, softcap, scratch_bytes)
    return (loss, z) if return_z_loss else loss


class LinearCrossEntropyLoss(torch.nn.Module):
    """nn.Module form: owns nothing; call as loss_fn(input, linear_weight, target, linear_bias=None)."""

    def __init__(self, weight=None, reduction="mean", ignore_index=-100, label_smoothing=0.0,
                 z_loss=0.0, softcap=None):
        super().__init__()
        self.register_buffer("weight", weight)
        self.reduction, self.ignore_index = reduction, ignore_index
        self.label_smoothing, self.z_loss, self.softcap = label_smoothing, z_loss, softcap

    def forward(self, input, linear_weight, target, linear_bias=None):
        return linear_cross_entropy(input, linear_weight, target, linear_bias=linear_bias, weight=self.weight,
                                    reduction=self.reduction, ignore_index=self.ignore_index,
                                    label_smoothing=self.label_smoothing, z_loss=self.z_loss,
                                    softcap=self.softcap)


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, cw, reduction, ignore_index, label_smoothing, z_loss, softcap):
        lc = as_c(logits, torch.float32)
        tc = _target(target)
        cwc = as_c(cw, torch.float32)
        N, V = lc.shape
        o = _options(reduction, ignore_index, label_smoothing, cwc, z_loss, softcap)
        loss = torch.empty((N,) if reduction == "none" else (), dtype=torch.float32)
        check(lib.ct_cross_entropy_forward(ctypes.byref(CeOutputs(_p(loss), None, None)), _p(lc), _p(tc),
                                           _DT[tc.dtype], N, V, ctypes.byref(o)))
        ctx.keep = (lc, tc, cwc, o, logits.dtype)
        return loss

    @staticmethod
    def backward(ctx, grad):
        lc, tc, cwc, o, dt = ctx.keep
        N, V = lc.shape
        g = as_c(grad, torch.float32).reshape(-1)
        d = torch.empty(N, V, dtype=torch.float32)
        check(lib.ct_cross_entropy_backward(_p(d), _p(g), _p(lc), _p(tc), _DT[tc.dtype], N, V, ctypes.byref(o)))
        return d.to(dt), None, None, None, None, None, None, None


def cross_entropy(input, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0,
                  z_loss=0.0, softcap=None):
    """F.cross_entropy on [N, C] logits and [N] class indices (plus z_loss and softcap)."""
    return _CrossEntropy.apply(input, target, weight, reduction, ignore_index, label_smoothing, z_loss, softcap)
