"""Embedding, sort / argsort / topk, gather / scatter_add and reductions as torch.autograd
functions over libctorch.

Drop-ins for torch.nn.functional.embedding, torch.sort / argsort / topk / gather /
scatter_add and torch.sum / mean / max / min / argmax along one dim. CPU tensors only. Values
are computed in float32 and returned in the input's dtype (a bf16 embedding table is read
by the bf16 kernel); indices are int64. The kernels work on the last dim of [N, C] rows, so
another ``dim`` is moved last first (one contiguous copy). Differences from torch, all
documented in ctorch/ops_index.h: topk always returns sorted results and, on ties, the lower
position first; sort is always stable; sums are accumulated in double. Integer inputs are
taken when float32 holds them exactly (|x| <= 2^24, sums included) and refused
(NotImplementedError) beyond, never rounded; arguments are checked by ctorch.torch._checks.

This module defines ``sum``, ``max`` and ``min``: import it as a module
(``from ctorch.torch import index``) rather than with ``*``.
"""
import ctypes
import math

import torch

from .._lib import as_c, check, lib, ptr
from . import _checks as C

_I64, _VP, _I, _B = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_bool
_DT_I32, _DT_I64 = 7, 8


def _sig(name, *args):
    f = getattr(lib, name)
    f.argtypes = list(args)
    f.restype = ctypes.c_int


_sig("ct_embedding_forward", _VP, _VP, _I, _VP, _I64, _I64, _I64)
_sig("ct_embedding_forward_bf16", _VP, _VP, _I, _VP, _I64, _I64, _I64)
_sig("ct_embedding_backward", _VP, _VP, _VP, _I, _I64, _I64, _I64, _I64)
for _n in ("ct_sum_rows", "ct_mean_rows", "ct_argmax_rows"):
    _sig(_n, _VP, _VP, _I64, _I64)
for _n in ("ct_max_rows", "ct_min_rows"):
    _sig(_n, _VP, _VP, _VP, _I64, _I64)
_sig("ct_sum_all", _VP, _VP, _I64)
_sig("ct_sort_rows", _VP, _VP, _VP, _I64, _I64, _B, _B)
_sig("ct_argsort_rows", _VP, _VP, _I64, _I64, _B, _B)
_sig("ct_topk_rows", _VP, _VP, _VP, _I64, _I64, _I64, _B, _B)
for _n in ("ct_gather_rows", "ct_scatter_rows", "ct_scatter_add_rows"):
    _sig(_n, _VP, _VP, _VP, _I64, _I64, _I64)


def _p(t):
    """Bare address of t: the caller keeps t alive across the call."""
    p = ptr(t)
    return None if p is None else p.value


# ---- [N, C] rows along a dim ------------------------------------------------------------------

class _Rows:
    """How a tensor was laid out as [N, C] rows with `dim` last, to undo it afterwards."""

    def __init__(self, shape, dim):
        self.scalar = len(shape) == 0
        shape = tuple(shape) or (1,)
        self.dim = C.dim("ctorch.torch.index", dim, len(shape))
        self.lead = shape[:self.dim] + shape[self.dim + 1:]
        self.N, self.C = math.prod(self.lead), shape[self.dim]

    def to_rows(self, t, dtype=torch.float32):
        """t (same shape as the tensor this was made for, or with another size along dim)
        as a contiguous [N, size] tensor."""
        t = t.reshape(1) if t.dim() == 0 else t
        return as_c(t.movedim(self.dim, -1), dtype).reshape(self.N, t.shape[self.dim])

    def from_rows(self, r, keep=True):
        """[N, K] back to the original layout; K is the size along dim (dropped when keep
        is False, for a reduction)."""
        out = r.reshape(*self.lead, r.shape[-1])
        if not keep:
            return out.reshape(self.lead) if not self.scalar else out.reshape(())
        out = out.movedim(-1, self.dim)
        return out.reshape(()) if self.scalar else out


def _empty(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype)


# ---- embedding --------------------------------------------------------------------------------

def _ids(ids):
    C.id_tensor("embedding", "indices", ids)
    ids = ids.contiguous()
    return ids, _DT_I64 if ids.dtype == torch.int64 else _DT_I32


class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids, table, pad):
        V, D = table.shape
        idc, idt = _ids(ids)
        N = idc.numel()
        out = _empty(N, D)
        if table.dtype == torch.bfloat16:
            tc = table.contiguous()
            check(lib.ct_embedding_forward_bf16(_p(out), _p(idc), idt, _p(tc), N, V, D))
        else:
            tc = as_c(table, torch.float32)
            check(lib.ct_embedding_forward(_p(out), _p(idc), idt, _p(tc), N, V, D))
        ctx.keep = (idc, idt, V, D, pad, table.dtype)
        return out.reshape(*ids.shape, D).to(table.dtype)

    @staticmethod
    def backward(ctx, grad):
        idc, idt, V, D, pad, dt = ctx.keep
        g = as_c(grad, torch.float32).reshape(idc.numel(), D)
        dtable = torch.zeros(V, D, dtype=torch.float32)
        check(lib.ct_embedding_backward(_p(dtable), _p(g), _p(idc), idt, idc.numel(), V, D, pad))
        return None, dtable.to(dt), None


def embedding(input, weight, padding_idx=None):
    """F.embedding(input, weight, padding_idx): rows of weight [V, D] picked by the integer
    ids in input (any shape); the gradient skips ids equal to padding_idx and is summed
    in token order, the same bits for any thread count."""
    C.id_tensor("embedding", "indices", input)
    C.floating("embedding", "weight", weight)
    if weight.dim() != 2:
        C.fail(RuntimeError, "embedding", f"'weight' must be 2-D, got shape {tuple(weight.shape)}")
    V = weight.shape[0]
    if padding_idx is None:
        pad = -1
    elif -V <= padding_idx < V:
        pad = padding_idx + V if padding_idx < 0 else padding_idx
    else:
        C.fail(AssertionError, "embedding", f"Padding_idx must be within num_embeddings: [-{V}, {V}), got "
                                            f"{padding_idx}")
    return _Embedding.apply(input, weight, pad)


# ---- sort / argsort / topk --------------------------------------------------------------------

def _scatter_grad(rows, grad, idx, dtype):
    """Gradient of a selection along rows' dim: zeros with grad added at idx ([N, K])."""
    g = rows.to_rows(grad)
    d = torch.zeros(rows.N, rows.C, dtype=torch.float32)
    check(lib.ct_scatter_add_rows(_p(d), _p(g), _p(idx), rows.N, rows.C, idx.shape[1]))
    return rows.from_rows(d).to(dtype)


class _Select(torch.autograd.Function):
    """sort (k = None) or topk (k given): values and int64 positions along dim."""

    @staticmethod
    def forward(ctx, x, dim, k, flag, stable_or_sorted):
        rows = _Rows(x.shape, dim)
        if k is not None and not 0 <= k <= rows.C:
            C.fail(RuntimeError, "topk", f"selected index k out of range: k = {k} must be in [0, {rows.C}] (the "
                                         f"size of dim {dim})")
        K = rows.C if k is None else k
        xr = rows.to_rows(x)
        vals, idx = _empty(rows.N, K), _empty(rows.N, K, dtype=torch.int64)
        if k is None:
            check(lib.ct_sort_rows(_p(vals), _p(idx), _p(xr), rows.N, rows.C, flag, stable_or_sorted))
        else:
            check(lib.ct_topk_rows(_p(vals), _p(idx), _p(xr), rows.N, rows.C, K, flag, stable_or_sorted))
        ctx.keep = (rows, idx, x.dtype)
        out_i = rows.from_rows(idx)
        ctx.mark_non_differentiable(out_i)
        return rows.from_rows(vals).to(x.dtype), out_i

    @staticmethod
    def backward(ctx, grad_v, grad_i):
        rows, idx, dt = ctx.keep
        return _scatter_grad(rows, grad_v, idx, dt), None, None, None, None


def sort(input, dim=-1, descending=False, stable=False):
    """torch.sort: (values, indices). Always the stable order; NaN sorts as the largest."""
    C.f32_exact("sort", "input", input)
    return _Select.apply(input, dim, None, bool(descending), bool(stable))


def argsort(input, dim=-1, descending=False, stable=False):
    """torch.argsort (stable order)."""
    C.f32_exact("argsort", "input", input)
    rows = _Rows(input.shape, dim)
    idx = _empty(rows.N, rows.C, dtype=torch.int64)
    xr = rows.to_rows(input.detach())  # held: _p gives a bare address
    check(lib.ct_argsort_rows(_p(idx), _p(xr), rows.N, rows.C, bool(descending), bool(stable)))
    return rows.from_rows(idx)


def topk(input, k, dim=-1, largest=True, sorted=True):
    """torch.topk: (values, indices), always sorted best first; ties go to the lower
    position."""
    C.f32_exact("topk", "input", input)
    return _Select.apply(input, dim, int(k), bool(largest), bool(sorted))


# ---- gather / scatter_add ---------------------------------------------------------------------

def _narrow_slices(index, dim, ndim):
    """Slices keeping the first index.size(d) entries on every d != dim (torch's rule that
    index may be smaller than the other tensors there)."""
    return tuple(slice(None) if d == dim else slice(0, index.shape[d]) for d in range(ndim))


def _check_index(name, t, index, dim, what="input"):
    C.int64_index(name, "index", index)
    if index.dim() != t.dim():
        C.fail(RuntimeError, name, f"Index tensor must have the same number of dimensions as {what} tensor "
                                   f"(index has {index.dim()}, {what} has {t.dim()})")
    for d in range(t.dim()):
        if d != dim and index.shape[d] > t.shape[d]:
            C.fail(RuntimeError, name, f"Size does not match at dimension {d}: index size {index.shape[d]} > "
                                       f"{what} size {t.shape[d]}")


def _gather_rows(xr, rows, idx):
    out = _empty(rows.N, idx.shape[1])
    check(lib.ct_gather_rows(_p(out), _p(xr), _p(idx), rows.N, rows.C, idx.shape[1]))
    return out


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, index):
        sl = _narrow_slices(index, dim, x.dim())
        xs = x[sl]
        rows = _Rows(xs.shape, dim)
        idx = rows.to_rows(index, torch.int64)
        out = _gather_rows(rows.to_rows(xs), rows, idx)
        ctx.keep = (rows, idx, sl, x.shape, x.dtype)
        return rows.from_rows(out).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        rows, idx, sl, shape, dt = ctx.keep
        part = _scatter_grad(rows, grad, idx, dt)
        if tuple(part.shape) == tuple(shape):
            return part, None, None
        dx = torch.zeros(shape, dtype=dt)
        dx[sl] = part
        return dx, None, None


def gather(input, dim, index):
    """torch.gather(input, dim, index); the backward is a deterministic scatter-add."""
    C.f32_exact("gather", "input", input)
    if input.dim() == 0:
        C.fail(RuntimeError, "gather", "input must have at least 1 dim")
    dim = C.dim("gather", dim, input.dim())
    _check_index("gather", input, index, dim)
    return _Gather.apply(input, dim, index)


class _ScatterAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, index, src):
        sl = _narrow_slices(index, dim, x.dim())
        src_sl = tuple(slice(0, s) for s in index.shape)
        out = x.detach().to(torch.float32, copy=True)
        region = out[sl]
        rows = _Rows(region.shape, dim)
        work = rows.to_rows(region).clone()
        idx = rows.to_rows(index, torch.int64)
        s = rows.to_rows(src[src_sl])
        check(lib.ct_scatter_add_rows(_p(work), _p(s), _p(idx), rows.N, rows.C, idx.shape[1]))
        region.copy_(rows.from_rows(work))
        ctx.keep = (rows, idx, sl, src_sl, src.shape, src.dtype)
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        rows, idx, sl, src_sl, src_shape, src_dt = ctx.keep
        gsrc = None
        if ctx.needs_input_grad[3]:
            part = rows.from_rows(_gather_rows(rows.to_rows(grad[sl]), rows, idx)).to(src_dt)
            if tuple(part.shape) == tuple(src_shape):
                gsrc = part
            else:
                gsrc = torch.zeros(src_shape, dtype=src_dt)
                gsrc[src_sl] = part
        return grad, None, None, gsrc


def scatter_add(input, dim, index, src):
    """torch.scatter_add(input, dim, index, src) (out of place); duplicates are added in
    index order, so the result is deterministic."""
    C.f32_exact("scatter_add", "input", input)
    C.int64_index("scatter_add", "index", index)
    C.f32_exact("scatter_add", "src", src, 1 + index.numel())  # a conservative bound on the sums
    if input.dim() == 0:
        C.fail(RuntimeError, "scatter_add", "input must have at least 1 dim")
    dim = C.dim("scatter_add", dim, input.dim())
    _check_index("scatter_add", input, index, dim)
    _check_index("scatter_add", src, index, -1, "src")  # on every dim
    return _ScatterAdd.apply(input, dim, index, src)


# ---- reductions -------------------------------------------------------------------------------

class _Sum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, keepdim, mean):
        if dim is None:
            xc = as_c(x, torch.float32)
            out = _empty(())
            n = xc.numel()
            if mean:
                check(lib.ct_mean_rows(_p(out), _p(xc), 1, n))
            else:
                check(lib.ct_sum_all(_p(out), _p(xc), n))
            ctx.keep = (None, x.shape, x.dtype, n, keepdim, mean)
            out = out.reshape([1] * x.dim()) if keepdim else out
            return out.to(x.dtype)
        rows = _Rows(x.shape, dim)
        out, xr = _empty(rows.N, 1), rows.to_rows(x)
        check((lib.ct_mean_rows if mean else lib.ct_sum_rows)(_p(out), _p(xr), rows.N, rows.C))
        ctx.keep = (rows, x.shape, x.dtype, rows.C, keepdim, mean)
        return rows.from_rows(out, keep=keepdim).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        rows, shape, dt, n, keepdim, mean = ctx.keep
        if rows is not None and not keepdim and not rows.scalar:
            grad = grad.unsqueeze(rows.dim)
        elif rows is None and not keepdim:
            grad = grad.reshape([1] * len(shape))
        g = grad / n if mean else grad
        return g.expand(shape).to(dt), None, None, None


def sum(input, dim=None, keepdim=False):
    """torch.sum over one dim, or over everything when dim is None (accumulated in double
    in a fixed order: the same bits for any thread count)."""
    C.f32_exact("sum", "input", input, input.numel() if isinstance(input, torch.Tensor) else 1)
    return _Sum.apply(input, dim, keepdim, False)


def mean(input, dim=None, keepdim=False):
    """torch.mean over one dim, or over everything when dim is None."""
    C.tensor("mean", "input", input)
    if not input.is_floating_point():
        C.fail(RuntimeError, "mean", f"mean(): could not infer output dtype. Input dtype must be either a floating "
                                     f"point or complex dtype. Got: {C.scalar_name(input.dtype)}")
    return _Sum.apply(input, dim, keepdim, True)


class _Extreme(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, keepdim, largest):
        rows = _Rows(x.shape, dim)
        if rows.C == 0 and rows.N:
            nm = 'max' if largest else 'min'
            C.fail(IndexError, nm, f"{nm}(): Expected reduction dim {rows.dim} to have non-zero size.")
        vals, idx = _empty(rows.N, 1), _empty(rows.N, 1, dtype=torch.int64)
        xr = rows.to_rows(x)
        fn = lib.ct_max_rows if largest else lib.ct_min_rows
        check(fn(_p(vals), _p(idx), _p(xr), rows.N, rows.C))
        ctx.keep = (rows, idx, x.dtype, keepdim)
        out_i = rows.from_rows(idx, keep=keepdim)
        ctx.mark_non_differentiable(out_i)
        return rows.from_rows(vals, keep=keepdim).to(x.dtype), out_i

    @staticmethod
    def backward(ctx, grad_v, grad_i):
        rows, idx, dt, keepdim = ctx.keep
        if not keepdim and not rows.scalar:
            grad_v = grad_v.unsqueeze(rows.dim)
        return _scatter_grad(rows, grad_v, idx, dt), None, None, None


def max(input, dim, keepdim=False):
    """torch.max(input, dim, keepdim): (values, indices); the first position on ties, the
    first NaN if any; the gradient goes to that position."""
    C.f32_exact("max", "input", input)
    return _Extreme.apply(input, dim, keepdim, True)


def min(input, dim, keepdim=False):
    """torch.min(input, dim, keepdim): (values, indices), as max."""
    C.f32_exact("min", "input", input)
    return _Extreme.apply(input, dim, keepdim, False)


def argmax(input, dim=None, keepdim=False):
    """torch.argmax: over the flattened tensor when dim is None."""
    C.f32_exact("argmax", "input", input)
    x = input.detach()
    if dim is None:
        rows = _Rows((x.numel(),), 0)
        xr = as_c(x, torch.float32).reshape(1, x.numel())
    else:
        rows = _Rows(x.shape, dim)
        xr = rows.to_rows(x)
    if rows.C == 0 and rows.N:
        C.fail(IndexError, "argmax", f"argmax(): Expected reduction dim {rows.dim} to have non-zero size.")
    idx = _empty(rows.N, 1, dtype=torch.int64)
    check(lib.ct_argmax_rows(_p(idx), _p(xr), rows.N, rows.C))
    if dim is None:
        return idx.reshape([1] * x.dim()) if keepdim else idx.reshape(())
    return rows.from_rows(idx, keep=keepdim)
