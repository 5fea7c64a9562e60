"""Fused linear + cross-entropy (PyTorch 2.13's F.linear_cross_entropy, plus z-loss and
softcap) and cross-entropy on logits, as torch.autograd functions over libctorch."""
import ctypes
import math

import torch

from .._lib import as_c, check, lib, ptr
from . import _checks as C

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
        tc = target  # checked and flattened by linear_cross_entropy (_checks.class_targets)
        cwc = as_c(cw, torch.float32)
        N, V = hc.shape[0], wc.shape[0]
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


def _empty_loss(rows, reduction, lead):
    """The loss of zero rows, as PyTorch gives it: [0]-shaped for "none", 0 for "sum", NaN for
    "mean" (0 / 0); connected to the graph so backward works (zero gradients)."""
    if reduction == "none":
        return (rows.sum(-1) * 0).reshape(lead)
    z = rows.sum() * 0
    return z if reduction == "sum" else z / 0.0


def _lce_targets(fn, target, lead, V, ignore_index, like):
    """Targets of the fused loss: one class index per row of input ([*lead] or flat [N])."""
    C.tensor(fn, "target", target)
    N = 1
    for s in lead:
        N *= s
    if target.is_floating_point() and tuple(target.shape) == (*lead, V):
        C.class_targets(fn, target, (*lead, V), V, ignore_index, like.dtype)  # raises: probabilities
    t = target
    if target.dim() == len(lead) and tuple(target.shape) == tuple(lead):
        t = target.reshape(-1)
    elif target.dim() > 1:
        C.fail(RuntimeError, fn, f"0D or 1D target tensor expected, multi-target not supported (target "
                                 f"{tuple(target.shape)} for input rows {tuple(lead)})")
    return C.class_targets(fn, t, (N, V), V, -100 if ignore_index is None else ignore_index, like.dtype)


def _lce_options(fn, options):
    """F.linear_cross_entropy's ``options``: None or a torch.nn.LinearCrossEntropyOptions (its
    own __post_init__ has checked the fields). ctorch's fused path is always chunked, under its
    own scratch budget (``scratch_bytes``), so the chunking fields change no result; the
    accumulation is float32 (what 2.13's "auto" picks for f16/bf16 on the CPU), so acc_dtype
    float16 / bfloat16 (less precise) is refused rather than silently made exact."""
    if options is None:
        return None
    cls = getattr(torch.nn, "LinearCrossEntropyOptions", None)
    if cls is None or not isinstance(options, cls):
        C.fail(TypeError, fn, f"options must be a torch.nn.LinearCrossEntropyOptions or None, got "
                              f"{type(options).__name__}")
    if options.acc_dtype in (torch.float16, torch.bfloat16):
        C.fail(NotImplementedError, fn, f"options.acc_dtype={options.acc_dtype}: ctorch accumulates in "
                                        f"float32 (acc_dtype None, torch.float32 or torch.float64)")
    return options


# ---- CUDA tensors: the fused loss on the GPU through libctorch_cuda.so (docs/cuda.md) -----------

class DeviceOptions(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("index", ctypes.c_int), ("memory_limit", ctypes.c_size_t)]


lib.ct_device_options_default.restype = DeviceOptions
lib.ct_device_options_default.argtypes = []
lib.ct_device_open.argtypes = [_P(DeviceOptions), _P(ctypes.c_void_p)]
lib.ct_device_sync.argtypes = [ctypes.c_void_p]
lib.ct_device_linear_cross_entropy.argtypes = [ctypes.c_void_p, _P(CeOutputs), _P(LceGrads), ctypes.c_float,
                                               _P(LceInputs), _P(CeOptions)]
lib.ct_device_linear_cross_entropy_ex.argtypes = [ctypes.c_void_p, _P(CeOutputs), _P(LceGrads), ctypes.c_float,
                                                  ctypes.c_void_p, ctypes.c_uint, _P(LceInputs), _P(CeOptions)]
_CUDA_DEVICES = {}


def _cuda_device(index):
    """The ctorch device cuda:index, opened once per process."""
    if index not in _CUDA_DEVICES:
        o = lib.ct_device_options_default()
        o.kind, o.index = 1, index
        d = ctypes.c_void_p()
        check(lib.ct_device_open(ctypes.byref(o), ctypes.byref(d)))
        _CUDA_DEVICES[index] = d
    return _CUDA_DEVICES[index]


class _LinearCrossEntropyCuda(torch.autograd.Function):
    """The fused pass on the GPU: loss and (for mean / sum) the gradients at once, scaled by
    grad_output in backward, as the CPU's training path does. reduction='none' runs the forward
    alone and, in backward, the fused pass again with grad_output as every row's upstream
    gradient (ct_device_linear_cross_entropy_ex's grad_rows). bf16 inputs get PyTorch's bf16
    numerics: the logits' gradient rounded to bf16 for the two gradient GEMMs (docs/cuda.md).
    The work follows PyTorch's current stream: the stream is synchronised before the call and
    ctorch's after."""

    @staticmethod
    def forward(ctx, h, w, b, target, cw, reduction, ignore_index, label_smoothing, z_loss, softcap,
                scratch_bytes):
        dev = h.device
        work = torch.bfloat16 if (h.dtype == torch.bfloat16 and w.dtype == torch.bfloat16) else torch.float32
        lead, D = h.shape[:-1], h.shape[-1]
        hc = h.reshape(-1, D).to(work).contiguous()
        wc = w.to(work).contiguous()
        bc = None if b is None else b.to(torch.float32).contiguous()
        tc = target.reshape(-1).contiguous()
        cwc = None if cw is None else cw.to(torch.float32).contiguous()
        N, V = hc.shape[0], wc.shape[0]
        o = _options(reduction, ignore_index, label_smoothing, cwc, z_loss, softcap, scratch_bytes)
        if not scratch_bytes:
            o.scratch_bytes = 0  # the device's own budget (CUDA: 1 GiB, docs/cuda.md)
        inp = LceInputs(_p(hc), _p(wc), _p(bc), _DT[work], _p(tc), _DT[tc.dtype], N, D, V)
        shape = (N,) if reduction == "none" else ()
        loss = torch.empty(shape, dtype=torch.float32, device=dev)
        zl = torch.empty(shape, dtype=torch.float32, device=dev)
        lse = torch.empty(N, dtype=torch.float32, device=dev)
        outs = CeOutputs(_p(loss), _p(zl), _p(lse))
        need = ctx.needs_input_grad
        grads = None
        dh = dw = db = None
        ctx.rows = None
        if reduction == "none" and (need[0] or need[1] or need[2]):
            # the gradients wait for grad_output (one upstream gradient per row): backward
            ctx.rows = (hc, wc, bc, tc, cwc, o, inp, need[2] and b is not None)
        elif need[0] or need[1] or need[2]:
            dh = torch.empty(N, D, dtype=torch.float32, device=dev) if need[0] else None
            dw = torch.empty(V, D, dtype=torch.float32, device=dev) if need[1] else None
            db = torch.empty(V, dtype=torch.float32, device=dev) if (need[2] and b is not None) else None
            grads = LceGrads(_p(dh), _p(dw), _p(db), False)
        d = _cuda_device(dev.index if dev.index is not None else torch.cuda.current_device())
        torch.cuda.current_stream(dev).synchronize()
        check(lib.ct_device_linear_cross_entropy(d, ctypes.byref(outs), None if grads is None else ctypes.byref(grads),
                                                 1.0, ctypes.byref(inp), ctypes.byref(o)))
        check(lib.ct_device_sync(d))
        ctx.meta = (lead, D, h.dtype, w.dtype, None if b is None else b.dtype)
        ctx.save_for_backward(dh, dw, db)
        ctx.mark_non_differentiable(zl)
        return loss.to(h.dtype) if h.dtype != torch.float32 else loss, zl

    @staticmethod
    def backward(ctx, grad_loss, grad_z):
        lead, D, hdt, wdt, bdt = ctx.meta
        if ctx.rows is not None:
            return _LinearCrossEntropyCuda._backward_rows(ctx, grad_loss)
        dh, dw, db = ctx.saved_tensors
        g = grad_loss.to(torch.float32)
        dh = (dh * g).reshape(*lead, D).to(hdt) if dh is not None else None
        dw = (dw * g).to(wdt) if dw is not None else None
        db = (db * g).to(bdt) if db is not None else None
        return dh, dw, db, None, None, None, None, None, None, None, None

    @staticmethod
    def _backward_rows(ctx, grad_loss):
        """reduction='none': the fused pass once more, row n's loss weighted by grad_loss[n]."""
        lead, D, hdt, wdt, bdt = ctx.meta
        hc, wc, bc, tc, cwc, o, inp, want_db = ctx.rows
        need = ctx.needs_input_grad
        dev = hc.device
        N, V = inp.N, inp.V
        rows = grad_loss.reshape(-1).to(torch.float32).contiguous()
        dh = torch.empty(N, D, dtype=torch.float32, device=dev) if need[0] else None
        dw = torch.empty(V, D, dtype=torch.float32, device=dev) if need[1] else None
        db = torch.empty(V, dtype=torch.float32, device=dev) if want_db else None
        loss = torch.empty(N, dtype=torch.float32, device=dev)  # the pass writes the losses again
        outs = CeOutputs(_p(loss), None, None)
        grads = LceGrads(_p(dh), _p(dw), _p(db), False)
        d = _cuda_device(dev.index if dev.index is not None else torch.cuda.current_device())
        torch.cuda.current_stream(dev).synchronize()
        check(lib.ct_device_linear_cross_entropy_ex(d, ctypes.byref(outs), ctypes.byref(grads), 1.0, _p(rows), 0,
                                                    ctypes.byref(inp), ctypes.byref(o)))
        check(lib.ct_device_sync(d))
        dh = dh.reshape(*lead, D).to(hdt) if dh is not None else None
        dw = dw.to(wdt) if dw is not None else None
        db = db.to(bdt) if db is not None else None
        return dh, dw, db, None, None, None, None, None, None, None, None


def _lce_cuda(fn, input, w, target, bias, weight, reduction, ignore_index, label_smoothing, options, z_loss,
              softcap, return_z_loss, scratch_bytes):
    """linear_cross_entropy on CUDA tensors (2-D linear_weight): every tensor on input's GPU."""
    dev = input.device
    for name, t in (("linear_weight", w), ("target", target), ("linear_bias", bias), ("weight", weight)):
        if t is not None and (not isinstance(t, torch.Tensor) or t.device != dev):
            C.fail(RuntimeError, fn, f"Expected all tensors to be on the same device, but {name} is on "
                                     f"{getattr(t, 'device', type(t).__name__)} and input on {dev}")
    if w.dtype != input.dtype:
        C.fail(RuntimeError, fn, f"expected linear_weight and input to have the same dtype, but got "
                                 f"{w.dtype} and {input.dtype}")
    if not input.is_floating_point():
        C.fail(NotImplementedError, fn, f"input must be a floating-point tensor, got {input.dtype}")
    if w.dim() != 2 or input.dim() < 1 or input.shape[-1] != w.shape[1]:
        C.fail(RuntimeError, fn, f"on CUDA tensors linear_weight must be [V, D] with input [..., D], got "
                                 f"{tuple(w.shape)} and {tuple(input.shape)}")
    C.reduction(fn, reduction)
    _lce_options(fn, options)
    ii = -100 if ignore_index is None else int(ignore_index)
    V = w.shape[0]
    lead = tuple(input.shape[:-1])
    if target.is_floating_point() or target.dtype not in (torch.int64, torch.int32):
        C.fail(RuntimeError, fn, f"target must hold class indices (int64 or int32), got {target.dtype}")
    if tuple(target.shape) != lead:
        C.fail(RuntimeError, fn, f"target of shape {tuple(target.shape)} does not fit input's {lead}")
    if bias is not None and tuple(bias.shape) != (V,):
        C.fail(RuntimeError, fn, f"expected linear_bias of shape ({V},), got {tuple(bias.shape)}")
    if weight is not None and tuple(weight.shape) != (V,):
        C.fail(RuntimeError, fn, f"weight must be a 1-D tensor of {V} class weights, got {tuple(weight.shape)}")
    bad = ((target < 0) | (target >= V)) & (target != ii)  # checked here: the GPU's ids stay there
    if bool(bad.any()):
        C.fail(IndexError, fn, f"Target {int(target[bad].reshape(-1)[0])} is out of bounds (classes [0, {V}))")
    if target.numel() == 0:
        loss = _empty_loss(input.reshape(-1, input.shape[-1]), reduction, lead if reduction == "none" else ())
        return (loss, torch.zeros_like(loss.detach())) if return_z_loss else loss
    loss, z = _LinearCrossEntropyCuda.apply(input, w, bias, target, weight, reduction, ii, label_smoothing,
                                            z_loss, softcap, scratch_bytes)
    if reduction == "none":
        loss, z = loss.reshape(lead), z.reshape(lead)
    return (loss, z) if return_z_loss else loss


def linear_cross_entropy(input, linear_weight, target, *, linear_bias=None, weight=None, reduction="mean",
                         ignore_index=None, label_smoothing=0.0, options=None, z_loss=0.0, softcap=None,
                         return_z_loss=False, scratch_bytes=None):
    """PyTorch 2.13's F.linear_cross_entropy (the same arguments: ``linear_bias``, ``weight``
    the per-class weight, ``reduction``, ``ignore_index`` None meaning -100,
    ``label_smoothing``, ``options`` a torch.nn.LinearCrossEntropyOptions or None) without
    ever holding the logits, plus ``z_loss`` and ``softcap``. With ``return_z_loss`` returns
    (loss, z_term); the z term is already part of loss.
    input [..., D] and linear_weight [V, D] share one floating dtype (f32 and bf16 run
    natively, others in f32); target holds one class index per row of input. Every misuse
    raises what F.linear_cross_entropy raises (ctorch.torch._checks). K-dimensional weights
    [V, d1, ..., D] (input [N, D], target [N, d1, ...]) run one fused pass per position.
    Class-probability targets are refused (NotImplementedError)."""
    fn = "linear_cross_entropy"
    if isinstance(input, torch.Tensor) and input.is_cuda:
        return _lce_cuda(fn, input, linear_weight, target, linear_bias, weight, reduction, ignore_index,
                         label_smoothing, options, z_loss, softcap, return_z_loss, scratch_bytes)
    C.tensor(fn, "input", input)
    C.tensor(fn, "linear_weight", linear_weight)
    C.same_dtype(fn, "linear_weight", linear_weight, "input", input)  # matmul's check comes first
    C.floating(fn, "input", input)
    if input.dim() < 1:
        C.fail(RuntimeError, fn, "both arguments to matmul need to be at least 1D (input is 0-D)")
    if linear_weight.dim() > 2:
        return _k_dim(fn, input, linear_weight, target, linear_bias, weight, reduction, ignore_index,
                      label_smoothing, options, z_loss, softcap, return_z_loss, scratch_bytes)
    C.dims(fn, "linear_weight", linear_weight, (2,))
    D = input.shape[-1]
    V, Dw = linear_weight.shape
    lead = tuple(input.shape[:-1])
    if Dw != D:
        C.fail(RuntimeError, fn, f"expected equal input and linear_weight last dimensions (in_features), got "
                                 f"{D} and {Dw}, respectively (linear_weight must be [V, {D}])")
    C.reduction(fn, reduction)
    _lce_options(fn, options)
    if ignore_index is None:
        ignore_index = -100
    bias = C.linear_bias(fn, linear_bias, V, input)
    C.class_weight(fn, weight, V, input)
    tc = _lce_targets(fn, target, lead, V, ignore_index, input)
    if tc.numel() == 0:
        loss = _empty_loss(input.reshape(-1, D) if D else input.reshape(0, 1), reduction,
                           lead if reduction == "none" else ())
        loss = loss + (linear_weight.sum() * 0).to(loss.dtype)
        return (loss, torch.zeros_like(loss.detach())) if return_z_loss else loss
    loss, z = _LinearCrossEntropy.apply(input, linear_weight, bias, tc, weight, reduction,
                                        ignore_index, label_smoothing, z_loss, softcap, scratch_bytes)
    return (loss, z) if return_z_loss else loss


def _k_dim(fn, input, w, target, bias, weight, reduction, ignore_index, label_smoothing, options, z_loss, softcap,
           return_z_loss, scratch_bytes):
    """K-dimensional loss (linear_weight [C, d1, ..., dK, D], input [N, D], target [N, d1, ...]):
    logits[n, c, j] = input[n] . w[c, j]; one fused pass per position j (its [C, D] slice),
    summed, and for "mean" divided by the weight of the counted targets over all positions (as
    PyTorch's cross_entropy over [N, C, d1, ...])."""
    Cn, outf, D = w.shape[0], tuple(w.shape[1:-1]), w.shape[-1]
    if input.dim() != 2:
        C.fail(RuntimeError, fn, f"multi-dimensional linear_weight {tuple(w.shape)} needs batched input "
                                 f"(N, in_features), got {tuple(input.shape)}")
    if input.shape[1] != D:
        C.fail(RuntimeError, fn, f"expected equal input and linear_weight last dimensions (in_features), got "
                                 f"{input.shape[1]} and {D}, respectively")
    if bias is not None:
        C.tensor(fn, "linear_bias", bias)
        if tuple(bias.shape) != (Cn, *outf):
            C.fail(RuntimeError, fn, f"expected linear_bias shape {(Cn, *outf)}, got {tuple(bias.shape)}")
    C.tensor(fn, "target", target)
    N = input.shape[0]
    if target.is_floating_point():
        C.fail(NotImplementedError, fn, "class-probability targets: ctorch computes class-index targets only")
    if tuple(target.shape) != (N, *outf):
        C.fail(RuntimeError, fn, f"target of shape {tuple(target.shape)} does not fit (N, *out_features) = "
                                 f"{(N, *outf)}")
    C.reduction(fn, reduction)
    K = math.prod(outf)
    wk = w.reshape(Cn, K, D)
    bk = None if bias is None else bias.reshape(Cn, K)
    tk = target.reshape(N, K)
    red = "none" if reduction == "none" else "sum"
    parts = [linear_cross_entropy(input, wk[:, j], tk[:, j], linear_bias=None if bk is None else bk[:, j],
                                  weight=weight, reduction=red, ignore_index=ignore_index,
                                  label_smoothing=label_smoothing, options=options, z_loss=z_loss, softcap=softcap,
                                  return_z_loss=True, scratch_bytes=scratch_bytes) for j in range(K)]
    if reduction == "none":
        loss = torch.stack([p[0] for p in parts], 1).reshape(N, *outf)
        z = torch.stack([p[1].to(loss.dtype) for p in parts], 1).reshape(N, *outf)
    else:
        loss = sum(p[0] for p in parts)
        z = sum(p[1].to(loss.dtype) for p in parts)
        if reduction == "mean":
            ii = -100 if ignore_index is None else ignore_index
            valid = tk != ii
            den = valid.sum() if weight is None else weight.detach()[tk[valid]].sum()
            loss, z = loss / den.to(loss.dtype), z / den.to(loss.dtype)
    return (loss, z) if return_z_loss else loss


class LinearCrossEntropyLoss(torch.nn.Module):
    """PyTorch 2.13's nn.LinearCrossEntropyLoss: the same constructor (in_features,
    num_classes, bias, device, dtype, reduction, weight, ignore_index, label_smoothing,
    options), the same parameters and state_dict keys (``linear.weight``, ``linear.bias``, the
    ``weight`` buffer) and ``forward(input, target)``, over ctorch's fused loss; plus
    ``z_loss`` and ``softcap``; ``out_features`` (K-dimensional loss) as PyTorch's."""

    def __init__(self, in_features, num_classes, *, out_features=(), bias=False, device=None, dtype=None,
                 reduction="mean", weight=None, ignore_index=None, label_smoothing=0.0, options=None,
                 z_loss=0.0, softcap=None):
        fn = "LinearCrossEntropyLoss"
        if weight is not None and tuple(weight.shape) != (num_classes,):
            C.fail(RuntimeError, fn, f"expected weight shape to be {(num_classes,)}, got {tuple(weight.shape)}")
        if label_smoothing < 0 or label_smoothing > 1.0:
            C.fail(RuntimeError, fn, f"expected label_smoothing to be in range [0, 1], got {label_smoothing}")
        C.reduction(fn, reduction)
        _lce_options(fn, options)
        super().__init__()
        self.register_buffer("weight", weight)
        self.reduction = reduction
        self.num_classes = num_classes
        self.out_features = tuple(out_features)
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing
        self.linear = torch.nn.Linear(in_features, math.prod(self.out_features, start=num_classes), bias=bias,
                                      device=device, dtype=dtype)
        self.options = options
        self.z_loss, self.softcap = z_loss, softcap

    def forward(self, input, target):
        w = self.linear.weight.reshape(self.num_classes, *self.out_features, self.linear.in_features)
        b = None if self.linear.bias is None else self.linear.bias.reshape(self.num_classes, *self.out_features)
        return linear_cross_entropy(input, w, target, linear_bias=b,
                                    weight=self.weight, reduction=self.reduction, ignore_index=self.ignore_index,
                                    label_smoothing=self.label_smoothing, options=self.options,
                                    z_loss=self.z_loss, softcap=self.softcap)

    def extra_repr(self):
        return (f"in_features={self.linear.in_features}, num_classes={self.num_classes}, "
                f"out_features={self.out_features}, bias={self.linear.bias is not None}, "
                f"reduction={self.reduction}, ignore_index={self.ignore_index}, "
                f"label_smoothing={self.label_smoothing}, options={self.options}")


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, cw, reduction, ignore_index, label_smoothing, z_loss, softcap):
        lc = as_c(logits, torch.float32)
        tc = target  # checked and flattened by cross_entropy (_checks.class_targets)
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
    """F.cross_entropy on logits [N, C] ([C] unbatched, [N, C, d1, ...] with the class dim 1)
    and class indices [N] ([] / [N, d1, ...]), plus z_loss and softcap. Every misuse raises
    what F.cross_entropy raises (ctorch.torch._checks); class-probability targets are refused
    (NotImplementedError), never truncated."""
    fn = "cross_entropy"
    C.tensor(fn, "input", input)
    C.floating(fn, "input", input)
    C.reduction(fn, reduction)
    if input.dim() == 0:
        C.fail(RuntimeError, fn, "input must have at least 1 dim (the classes), got a 0-D tensor")
    nc = input.shape[1] if input.dim() >= 2 else input.shape[0]
    ii = -100 if ignore_index is None else ignore_index
    tc = C.class_targets(fn, target, tuple(input.shape), nc, ii, input.dtype)
    C.class_weight(fn, weight, nc, input)
    if input.dim() == 1:
        rows = input.reshape(1, nc)
    elif input.dim() == 2:
        rows = input
    else:
        rows = input.movedim(1, -1).reshape(-1, nc)
    shape = tuple(target.shape)
    if rows.shape[0] == 0:
        return _empty_loss(rows, reduction, shape)
    loss = _CrossEntropy.apply(rows, tc, weight, reduction, ignore_index, label_smoothing, z_loss, softcap)
    return loss.reshape(shape) if reduction == "none" else loss


# The ctypes mirrors above match the C structs of the loaded library (or this import fails).
from .._lib import check_layouts as _check_layouts  # noqa: E402

_check_layouts({CeOptions: "ct_ce_options", CeOutputs: "ct_ce_outputs", LceInputs: "ct_lce_inputs", LceGrads: "ct_lce_grads", DeviceOptions: "ct_device_options"})
