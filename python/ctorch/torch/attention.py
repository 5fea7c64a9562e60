"""FlexAttention over libctorch: ``flex_attention`` (torch.autograd, forward and a
deterministic backward on the CPU), ``create_block_mask`` (built-in masks classified in
O(blocks) in C; a Python ``mask_mod`` written as for PyTorch is called on broadcast index
tensors block by block, never on the whole L x S grid), the mask library (``mask_mods``) and
the score mods (``score_mods``: softcap, alibi, relative_bias with the table's gradient).

    from ctorch.torch import flex_attention, create_block_mask, mask_mods, score_mods
    bm = create_block_mask(mask_mods.sliding_window(256), None, None, L, L)
    out = flex_attention(q, k, v, score_mod=score_mods.softcap(30.0), block_mask=bm)
"""
import ctypes
import math

import torch

from .._lib import check, lib
from .. import io as _io
from . import _checks as C
from . import _trace

_P = ctypes.POINTER
_vp = ctypes.c_void_p
_i64 = ctypes.c_int64


class _Tile(ctypes.Structure):
    _fields_ = [(n, _i64) for n in ("b", "h", "q0", "nq", "kv0", "nkv", "q_stride", "kv_stride")]


class _MaskMod(ctypes.Structure):
    _fields_ = [("tile", _vp), ("block", _vp), ("ctx", _vp), ("destroy", _vp),
                ("uses_b", ctypes.c_bool), ("uses_h", ctypes.c_bool)]


class _ScoreMod(ctypes.Structure):
    _fields_ = [("fwd", _vp), ("grad", _vp), ("ctx", _vp), ("destroy", _vp),
                ("param_grad", _vp), ("param_len", _i64)]


class _BlockMask(ctypes.Structure):
    _fields_ = ([(n, _i64) for n in ("B", "H", "q_len", "kv_len", "block_size", "num_q_blocks",
                                     "num_kv_blocks")]
                + [("mask_mod", _MaskMod)]
                + [(n, _vp) for n in ("kv_ptr", "full_kv_ptr", "kv_idx", "full_kv_idx", "q_ptr",
                                      "full_q_ptr", "q_idx", "full_q_idx", "tiles", "q_tile")]
                + [("bytes", ctypes.c_size_t)])


class _BlockMaskOptions(ctypes.Structure):
    _fields_ = [("block_size", _i64), ("store_partial", ctypes.c_bool)]


class _FlexOptions(ctypes.Structure):
    _fields_ = [("scale", ctypes.c_float), ("score_mod", _vp), ("grad_scratch_bytes", ctypes.c_size_t)]


_Tensor = _io._Tensor  # the one mirror of ct_tensor (ctorch.io)


_TILE_FN = ctypes.CFUNCTYPE(None, _vp, _P(_Tile), _vp)

lib.ct_mask_mod_causal.argtypes = [_P(_MaskMod)]
lib.ct_mask_mod_sliding_window.argtypes = [_i64, ctypes.c_bool, _P(_MaskMod)]
lib.ct_mask_mod_prefix_lm.argtypes = [_i64, _P(_MaskMod)]
lib.ct_mask_mod_document.argtypes = [_vp, _vp, _i64, _i64, _i64, _P(_MaskMod)]
lib.ct_mask_mod_noop.argtypes = [_P(_MaskMod)]
for _f in (lib.ct_mask_mod_and, lib.ct_mask_mod_or):
    _f.argtypes = [_P(_MaskMod), ctypes.c_int, _P(_MaskMod)]
lib.ct_mask_mod_not.argtypes = [_P(_MaskMod), _P(_MaskMod)]
lib.ct_mask_mod_free.argtypes = [_P(_MaskMod)]
lib.ct_mask_mod_free.restype = None
lib.ct_score_mod_softcap.argtypes = [ctypes.c_float, _P(_ScoreMod)]
lib.ct_score_mod_alibi.argtypes = [_i64, _vp, _P(_ScoreMod)]
lib.ct_score_mod_relative_bias.argtypes = [_vp, _i64, _i64, _i64, _vp, _P(_ScoreMod)]
lib.ct_score_mod_free.argtypes = [_P(_ScoreMod)]
lib.ct_score_mod_free.restype = None
lib.ct_block_mask_create_ex.argtypes = [_P(_MaskMod), _i64, _i64, _i64, _i64, _P(_BlockMaskOptions),
                                        _P(_P(_BlockMask))]
lib.ct_block_mask_free.argtypes = [_P(_BlockMask)]
lib.ct_block_mask_free.restype = None
lib.ct_block_mask_to_dense.argtypes = [_P(_BlockMask), _vp]
lib.ct_flex_options_default.restype = _FlexOptions
lib.ct_flex_options_default.argtypes = []
lib.ct_flex_attention_forward.argtypes = [_P(_Tensor)] * 3 + [_P(_BlockMask), _P(_FlexOptions),
                                                              _P(_Tensor), _P(_Tensor)]
lib.ct_flex_attention_backward.argtypes = ([_P(_Tensor)] * 6 + [_P(_BlockMask), _P(_FlexOptions)]
                                           + [_P(_Tensor)] * 3)

_DT = {torch.float32: 0, torch.bfloat16: 3}

# Flex attention on device memory (include/ctorch/device.h): CUDA tensors.
lib.ct_device_block_mask_upload.argtypes = [_vp, _P(_BlockMask), _P(_vp)]
lib.ct_device_block_mask_free.argtypes = [_vp]
lib.ct_device_block_mask_free.restype = None
lib.ct_device_flex_attention_forward.argtypes = ([_vp] + [_P(_Tensor)] * 3 + [_vp, _P(_FlexOptions)]
                                                 + [_P(_Tensor)] * 2)
lib.ct_device_flex_attention_backward.argtypes = ([_vp] + [_P(_Tensor)] * 6 + [_vp, _P(_FlexOptions)]
                                                  + [_P(_Tensor)] * 3)


def _tensor(t):
    """A ct_tensor view of a CPU torch tensor (no copy; its strides are kept)."""
    if t is None:
        return None
    if t.device.type != "cpu":
        raise ValueError("ctorch: tensors must be on the CPU")
    c = _Tensor()
    c.data = t.data_ptr()
    c.dtype = _DT[t.dtype]
    c.ndim = t.dim()
    for i, (n, s) in enumerate(zip(t.shape, t.stride())):
        c.shape[i], c.strides[i] = n, s
    return ctypes.byref(c), c


def _dtensor(t):
    """A ct_tensor view of a CUDA torch tensor: its device pointer and strides (buffer NULL: a
    device pointer from elsewhere, as ct_device_flex_attention_* take)."""
    if t is None:
        return None
    c = _Tensor()
    c.data = t.data_ptr()
    c.dtype = _DT[t.dtype] if t.dtype in _DT else 0
    c.ndim = t.dim()
    for i, (n, s) in enumerate(zip(t.shape, t.stride())):
        c.shape[i], c.strides[i] = n, s
    return ctypes.byref(c), c


# ---- mask mods ------------------------------------------------------------------------------

class MaskMod:
    """A built-in mask_mod: evaluated in C (classified per block in O(1)), and callable as a
    PyTorch mask_mod ``(b, h, q_idx, kv_idx) -> bool tensor`` (for references and create_mask)."""

    def __init__(self, name, make, fn, children=(), keep=(), needs=None):
        self.name = name
        self._fn = fn
        self._children = tuple(children)  # their C contexts are referenced by ours
        self._keep = keep
        self._needs = needs  # (batch rows or None when shared, q ids, kv ids) a mod reads
        self._c = _MaskMod()
        check(make(ctypes.byref(self._c)))

    def check(self, B, H, Q_LEN, KV_LEN, fn="create_block_mask"):
        """Raise what evaluating this mask_mod on the grid would raise in PyTorch (IndexError
        for ids shorter than Q_LEN / KV_LEN or fewer rows than B), before C reads them."""
        if self._needs is not None:
            rows, lq, lk = self._needs
            if rows is not None:
                C.index_bound(fn, "document ids", rows, B, "batch rows (one per batch, or one shared)")
            C.index_bound(fn, "document ids", lq, Q_LEN, "query positions")
            C.index_bound(fn, "kv document ids", lk, KV_LEN, "key positions")
        for m in self._children:
            m.check(B, H, Q_LEN, KV_LEN, fn)

    def __call__(self, b, h, q_idx, kv_idx):
        return self._fn(b, h, q_idx, kv_idx)

    def __repr__(self):
        return f"MaskMod({self.name})"

    def __del__(self):
        c = getattr(self, "_c", None)
        if c is not None and lib is not None:
            lib.ct_mask_mod_free(ctypes.byref(c))


def _as_ids(ids):
    ids = torch.as_tensor(ids)
    if ids.is_complex():
        C.fail(RuntimeError, "mask_mods.document", f"document ids must be real, got {ids.dtype}")
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if ids.dim() != 2:
        raise ValueError(f"document ids must be [L] or [B, L], got shape {tuple(ids.shape)}")
    return ids


def _int32_ids(qd, kd):
    """q and kv ids as int32 with the same equalities and order (the C mask compares them):
    int32 as they are, any other dtype through their ranks among the values of both, so
    nothing is truncated (2.7 and 2.2 stay different documents)."""
    if qd.dtype == torch.int32 and kd.dtype == torch.int32:
        return qd.contiguous(), kd.contiguous()
    both = torch.cat([qd.reshape(-1), kd.reshape(-1)])
    if both.is_floating_point() and bool(torch.isnan(both).any()):
        C.fail(RuntimeError, "mask_mods.document", "document ids must not be NaN")
    _, rank = torch.unique(both, sorted=True, return_inverse=True)
    rank = rank.to(torch.int32)
    return (rank[:qd.numel()].reshape(qd.shape).contiguous(),
            rank[qd.numel():].reshape(kd.shape).contiguous())


class mask_mods:
    """The mask library (attention-gym's standard masks), all evaluated in C."""

    @staticmethod
    def causal():
        """q_idx >= kv_idx."""
        return MaskMod("causal", lib.ct_mask_mod_causal, lambda b, h, q, kv: q >= kv)

    @staticmethod
    def noop():
        """Every pair attends."""
        return MaskMod("noop", lib.ct_mask_mod_noop,
                       lambda b, h, q, kv: torch.ones_like(q >= kv, dtype=torch.bool))

    @staticmethod
    def sliding_window(window, causal=True):
        """causal: 0 <= q - kv <= window; two-sided: |q - kv| <= window."""
        w = int(window)
        if causal:
            fn = lambda b, h, q, kv: (q >= kv) & (q - kv <= w)  # noqa: E731
        else:
            fn = lambda b, h, q, kv: (q - kv).abs() <= w  # noqa: E731
        return MaskMod(f"sliding_window({w}, causal={causal})",
                       lambda out: lib.ct_mask_mod_sliding_window(w, bool(causal), out), fn)

    @staticmethod
    def prefix_lm(prefix_len):
        """kv < prefix_len or q >= kv."""
        n = int(prefix_len)
        return MaskMod(f"prefix_lm({n})", lambda out: lib.ct_mask_mod_prefix_lm(n, out),
                       lambda b, h, q, kv: (kv < n) | (q >= kv))

    @staticmethod
    def document(doc_ids, kv_doc_ids=None):
        """doc[q] == doc[kv] for per-token document ids ([L] shared or [B, L] per batch);
        kv_doc_ids for keys of another length. Combine with causal() through and_masks."""
        qd = _as_ids(doc_ids)
        kd = qd if kv_doc_ids is None else _as_ids(kv_doc_ids)
        if kd.shape[0] != qd.shape[0]:
            raise ValueError("doc_ids and kv_doc_ids must have the same batch dim")
        nb, lq, lk = qd.shape[0], qd.shape[1], kd.shape[1]
        qf, kf = qd, kd  # the reference compares the ids as given
        qd, kd = _int32_ids(qd.cpu(), kd.cpu())  # C reads host ids (CUDA ids are copied)

        def fn(b, h, q, kv):
            bb = torch.as_tensor(b) if nb > 1 else torch.zeros((), dtype=torch.long)
            return qf[bb, q] == kf[bb, kv]

        return MaskMod("document", lambda out: lib.ct_mask_mod_document(
            qd.data_ptr(), kd.data_ptr(), nb, lq, lk, out), fn, keep=(qd, kd),
            needs=(nb if nb > 1 else None, lq, lk))

    @staticmethod
    def and_masks(*mods):
        return and_masks(*mods)

    @staticmethod
    def or_masks(*mods):
        return or_masks(*mods)

    @staticmethod
    def not_mask(mod):
        return not_mask(mod)


def _combine(kind, mods, fn):
    if not mods:
        raise ValueError(f"{kind} needs at least one mask_mod")
    if all(isinstance(m, MaskMod) for m in mods):
        arr = (_MaskMod * len(mods))(*[m._c for m in mods])
        make = {"and_masks": lib.ct_mask_mod_and, "or_masks": lib.ct_mask_mod_or}[kind]
        return MaskMod(f"{kind}({', '.join(m.name for m in mods)})",
                       lambda out: make(arr, len(mods), out), fn, children=mods, keep=(arr,))
    return fn  # a Python mask among them: combined in Python


def and_masks(*mods):
    """Conjunction of mask_mods (in C when all are built-ins)."""
    def fn(b, h, q, kv):
        r = mods[0](b, h, q, kv)
        for m in mods[1:]:
            r = r & m(b, h, q, kv)
        return r
    return _combine("and_masks", mods, fn)


def or_masks(*mods):
    """Disjunction of mask_mods (in C when all are built-ins)."""
    def fn(b, h, q, kv):
        r = mods[0](b, h, q, kv)
        for m in mods[1:]:
            r = r | m(b, h, q, kv)
        return r
    return _combine("or_masks", mods, fn)


def not_mask(mod):
    """Negation of a mask_mod."""
    fn = lambda b, h, q, kv: ~torch.as_tensor(mod(b, h, q, kv), dtype=torch.bool)  # noqa: E731
    if isinstance(mod, MaskMod):
        return MaskMod(f"not_mask({mod.name})", lambda out: lib.ct_mask_mod_not(ctypes.byref(mod._c), out),
                       fn, children=(mod,))
    return fn


noop_mask = mask_mods.noop()
causal_mask = mask_mods.causal()
_BY_NAME = {"causal": mask_mods.causal, "noop": mask_mods.noop}


# ---- block masks ----------------------------------------------------------------------------

class BlockMask:
    """A ctorch block mask: per (b, h, query block) the partial and full key blocks, and the
    transposed lists. Made by create_block_mask; passed to flex_attention."""

    def __init__(self, ptr, mask_mod, keep):
        self._ptr = ptr
        self.mask_mod = mask_mod
        self._keep = keep
        self._dev = {}  # CUDA index -> its device copy (ct_device_block_mask_upload), made once

    def _on_device(self, d, index):
        """The device copy for ctorch device d (cuda:index): uploaded on first use."""
        h = self._dev.get(index)
        if h is None:
            h = _vp()
            check(lib.ct_device_block_mask_upload(d, self._ptr, ctypes.byref(h)))
            self._dev[index] = h
        return h

    def to(self, device):
        """PyTorch's BlockMask.to: the mask stays built on the host; a CUDA device gets its
        copy now (flex_attention on CUDA tensors would make it on first use)."""
        dev = torch.device(device)
        if dev.type == "cuda":
            index = dev.index if dev.index is not None else torch.cuda.current_device()
            self._on_device(_ctorch_cuda(f"BlockMask.to(cuda:{index})", index), index)
        elif dev.type != "cpu":
            raise ValueError(f"BlockMask.to: ctorch block masks live on the CPU or CUDA, not {dev}")
        return self

    def __del__(self):
        for h in getattr(self, "_dev", {}).values():
            if lib is not None:
                lib.ct_device_block_mask_free(h)
        self._dev = {}
        p = getattr(self, "_ptr", None)
        if p and lib is not None:
            lib.ct_block_mask_free(p)
            self._ptr = None

    @property
    def _s(self):
        return self._ptr.contents

    @property
    def shape(self):
        s = self._s
        return (s.B, s.H, s.q_len, s.kv_len)

    @property
    def BLOCK_SIZE(self):
        return (self._s.block_size, self._s.block_size)

    @property
    def nbytes(self):
        return self._s.bytes

    def to_dense(self):
        """Block kinds [B, H, num_q_blocks, num_kv_blocks]: 0 empty, 1 partial, 2 full."""
        s = self._s
        out = torch.empty(s.B, s.H, s.num_q_blocks, s.num_kv_blocks, dtype=torch.uint8)
        check(lib.ct_block_mask_to_dense(self._ptr, out.data_ptr()))
        return out

    def _lists(self, kind, transposed):
        d = self.to_dense()
        if transposed:
            d = d.transpose(-1, -2)
        sel = d == kind
        num = sel.sum(-1).to(torch.int32)
        n = d.shape[-1]
        key = torch.where(sel, torch.arange(n), torch.full((), n))  # selected blocks first, in order
        idx = key.sort(-1).values.clamp(max=n - 1).to(torch.int32) if n else key.to(torch.int32)
        return num, idx

    @property
    def kv_num_blocks(self):
        return self._lists(1, False)[0]

    @property
    def kv_indices(self):
        return self._lists(1, False)[1]

    @property
    def full_kv_num_blocks(self):
        return self._lists(2, False)[0]

    @property
    def full_kv_indices(self):
        return self._lists(2, False)[1]

    @property
    def q_num_blocks(self):
        return self._lists(1, True)[0]

    @property
    def q_indices(self):
        return self._lists(1, True)[1]

    @property
    def full_q_num_blocks(self):
        return self._lists(2, True)[0]

    @property
    def full_q_indices(self):
        return self._lists(2, True)[1]

    def sparsity(self):
        """Percentage of blocks skipped (as PyTorch's BlockMask.sparsity)."""
        d = self.to_dense()
        return 100.0 * float((d == 0).sum()) / max(1, d.numel())

    def __repr__(self):
        B, H, L, S = self.shape
        return (f"BlockMask(shape=({B}, {H}, {L}, {S}), block_size={self._s.block_size}, "
                f"sparsity={self.sparsity():.2f}%, mask_mod={self.mask_mod!r})")


def _py_tile(fn, errors):
    """A C tile callback evaluating a PyTorch-style mask_mod on broadcast index tensors."""
    def tile(ctx, tp, keep):
        t = tp.contents
        nq, nk = t.nq, t.nkv
        size = (nq - 1) * t.q_stride + (nk - 1) * t.kv_stride + 1
        buf = torch.frombuffer((ctypes.c_uint8 * size).from_address(keep), dtype=torch.uint8)
        view = buf.as_strided((nq, nk), (t.q_stride, t.kv_stride))
        try:
            q = torch.arange(t.q0, t.q0 + nq).view(nq, 1)
            kv = torch.arange(t.kv0, t.kv0 + nk).view(1, nk)
            r = fn(torch.tensor(t.b), torch.tensor(t.h), q, kv)
            view.copy_(torch.as_tensor(r).to(torch.bool).expand(nq, nk))
        except BaseException as e:  # noqa: BLE001  (re-raised by create_block_mask)
            errors.append(e)
            view.zero_()
    return _TILE_FN(tile)


def create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, BLOCK_SIZE=128, device="cpu"):
    """Block mask of ``mask_mod`` (a MaskMod from mask_mods, a name such as "causal", or a
    Python function ``(b, h, q_idx, kv_idx) -> bool tensor`` as in PyTorch). B / H None mean
    broadcast. Built-ins cost O(blocks); a Python mask_mod is traced and compiled to a native
    kernel (docs/compile.md: O(blocks) too, IndexError when an index can leave a captured
    tensor); one that cannot be traced is called once per block on index tensors (q_idx [n, 1],
    kv_idx [1, m], b and h 0-dim), with a warning, and its partial blocks are stored, so
    attention never calls back into Python. device: "cpu" (default), or a CUDA device: the
    mask is still built on the host and its copy for that GPU made now (once; flex_attention
    on CUDA tensors uses it)."""
    if isinstance(BLOCK_SIZE, (tuple, list)):
        if len(set(BLOCK_SIZE)) != 1:
            raise ValueError("ctorch block masks use square blocks: BLOCK_SIZE must be one number")
        BLOCK_SIZE = BLOCK_SIZE[0]
    if isinstance(mask_mod, str):
        if mask_mod not in _BY_NAME:
            raise ValueError(f"unknown mask name {mask_mod!r}; built-ins by name: {sorted(_BY_NAME)}")
        mask_mod = _BY_NAME[mask_mod]()
    if mask_mod is None:
        mask_mod = mask_mods.noop()
    if isinstance(mask_mod, MaskMod):
        mask_mod.check(1 if B is None else int(B), 1 if H is None else int(H), int(Q_LEN), int(KV_LEN))
    o = _BlockMaskOptions(int(BLOCK_SIZE), False)
    errors = []
    keep = ()
    if isinstance(mask_mod, MaskMod):
        c = mask_mod._c
    elif callable(mask_mod) and (cm := _trace.compile_mask_mod(mask_mod, B, H, Q_LEN, KV_LEN)):
        c, keep = cm._c, (cm,)  # traced and compiled: O(blocks), no Python in the loop
    elif callable(mask_mod):
        cb = _py_tile(mask_mod, errors)
        c = _MaskMod(ctypes.cast(cb, _vp).value, None, None, None, B is not None and B > 1,
                     H is not None and H > 1)
        o.store_partial = True
        keep = (cb,)
    else:
        raise TypeError(f"mask_mod must be a MaskMod, a name or a callable, got {type(mask_mod).__name__}")
    out = _P(_BlockMask)()
    check(lib.ct_block_mask_create_ex(ctypes.byref(c), 1 if B is None else int(B), 1 if H is None else int(H),
                                      int(Q_LEN), int(KV_LEN), ctypes.byref(o), ctypes.byref(out)))
    bm = BlockMask(out, mask_mod, keep)
    bm._made_for = (1 if B is None else int(B), 1 if H is None else int(H), int(Q_LEN), int(KV_LEN))
    if errors:
        raise errors[0]
    if device is not None and torch.device(device).type != "cpu":
        bm.to(device)  # built on the host; its device copy made (once) for that GPU
    return bm


def create_mask(mod_fn, B, H, Q_LEN, KV_LEN, device="cpu"):
    """The dense [B, H, Q_LEN, KV_LEN] boolean mask of a mask_mod (for tests and small sizes)."""
    B, H = 1 if B is None else B, 1 if H is None else H
    b = torch.arange(B).view(B, 1, 1, 1)
    h = torch.arange(H).view(1, H, 1, 1)
    q = torch.arange(Q_LEN).view(1, 1, Q_LEN, 1)
    kv = torch.arange(KV_LEN).view(1, 1, 1, KV_LEN)
    return torch.as_tensor(mod_fn(b, h, q, kv), dtype=torch.bool).expand(B, H, Q_LEN, KV_LEN).clone()


# ---- score mods -----------------------------------------------------------------------------

class ScoreMod:
    """A built-in score_mod, evaluated in C with its derivative; callable as a PyTorch score_mod
    ``(score, b, h, q_idx, kv_idx) -> score``. ``param`` is its trainable tensor, if any."""

    def __init__(self, name, make, fn, param=None):
        self.name = name
        self._make = make
        self._fn = fn
        self.param = param

    def __call__(self, score, b, h, q_idx, kv_idx):
        return self._fn(score, b, h, q_idx, kv_idx)

    def __repr__(self):
        return f"ScoreMod({self.name})"

    def _c(self, param, dparam):
        c = _ScoreMod()
        check(self._make(param, dparam, ctypes.byref(c)))
        return c


class score_mods:
    """Built-in score mods."""

    @staticmethod
    def softcap(cap):
        """cap * tanh(score / cap) (Gemma 2)."""
        cap = float(cap)
        return ScoreMod(f"softcap({cap})", lambda p, d, out: lib.ct_score_mod_softcap(cap, out),
                        lambda s, b, h, q, kv: cap * torch.tanh(s / cap))

    @staticmethod
    def alibi(num_heads=None, slopes=None):
        """score + slope[h] * (kv - q); slopes default to 2^(-8 (h+1) / num_heads)."""
        if slopes is None:
            if num_heads is None:
                raise ValueError("alibi needs num_heads or slopes")
            slopes = [2.0 ** (-8.0 * (i + 1) / num_heads) for i in range(num_heads)]
        sl = torch.tensor([float(x) for x in slopes], dtype=torch.float32)
        n = sl.numel()
        return ScoreMod(f"alibi({n})", lambda p, d, out: lib.ct_score_mod_alibi(n, sl.data_ptr(), out),
                        lambda s, b, h, q, kv: s + sl[torch.as_tensor(h) % n] * (kv - q).to(s.dtype))

    @staticmethod
    def relative_bias(table, offset=None):
        """score + table[h, clamp(q - kv + offset, 0, T - 1)] for table [H, T] (or [T], shared);
        offset defaults to (T - 1) // 2 (distances -offset .. T-1-offset, clamped beyond).
        The table may require grad: flex_attention returns its gradient."""
        if table.dim() not in (1, 2):
            raise ValueError(f"relative_bias table must be [T] or [H, T], got {tuple(table.shape)}")
        T = table.shape[-1]
        heads = table.shape[0] if table.dim() == 2 else 0
        off = (T - 1) // 2 if offset is None else int(offset)

        def fn(s, b, h, q, kv):
            idx = (q - kv + off).clamp(0, T - 1)
            t = table if table.dim() == 2 else table.unsqueeze(0)
            hh = torch.as_tensor(h) % t.shape[0]
            return s + t[hh, idx].to(s.dtype)

        return ScoreMod(f"relative_bias({tuple(table.shape)})",
                        lambda p, d, out: lib.ct_score_mod_relative_bias(p, heads, T, off, d, out), fn,
                        param=table)


# ---- flex_attention --------------------------------------------------------------------------

def _run_score_mod(score_mod, param, dparam):
    if score_mod is None:
        return None
    return score_mod._c(None if param is None else param.data_ptr(),
                        None if dparam is None else dparam.data_ptr())


class _FlexAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, param, block_mask, score_mod, scale):
        work = q.dtype
        pc = None if param is None else param.detach().to("cpu", torch.float32).contiguous()
        B, Hq, L, _ = q.shape
        out = torch.empty(B, Hq, L, v.shape[-1], dtype=work)
        lse = torch.empty(B, Hq, L, dtype=torch.float32)
        o = lib.ct_flex_options_default()
        o.scale = scale
        sm = _run_score_mod(score_mod, pc, None)
        try:
            if sm is not None:
                o.score_mod = ctypes.addressof(sm)
            check(lib.ct_flex_attention_forward(_tensor(q)[0], _tensor(k)[0], _tensor(v)[0],
                                                block_mask._ptr if block_mask is not None else None,
                                                ctypes.byref(o), _tensor(out)[0], _tensor(lse)[0]))
        finally:
            if sm is not None:
                lib.ct_score_mod_free(ctypes.byref(sm))
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.extra = (pc, block_mask, score_mod, scale, None if param is None else (param.dtype, param.device))
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        pc, block_mask, score_mod, scale, pdt = ctx.extra
        need = ctx.needs_input_grad
        dout = dout.to(q.dtype).contiguous()
        dq = torch.empty_like(q) if need[0] else None
        dk = torch.empty_like(k) if need[1] else None
        dv = torch.empty_like(v) if need[2] else None
        dparam = torch.zeros_like(pc) if (pc is not None and need[3]) else None
        o = lib.ct_flex_options_default()
        o.scale = scale
        sm = _run_score_mod(score_mod, pc, dparam)
        try:
            if sm is not None:
                o.score_mod = ctypes.addressof(sm)
            t = [_tensor(x) for x in (q, k, v, out, lse, dout, dq, dk, dv)]
            check(lib.ct_flex_attention_backward(*[None if x is None else x[0] for x in t[:6]],
                                                 block_mask._ptr if block_mask is not None else None,
                                                 ctypes.byref(o),
                                                 *[None if x is None else x[0] for x in t[6:]]))
        finally:
            if sm is not None:
                lib.ct_score_mod_free(ctypes.byref(sm))
        if dparam is not None:
            dparam = dparam.to(pdt[1], pdt[0])
        return dq, dk, dv, dparam, None, None, None


# ---- flex_attention on CUDA tensors (ct_device_flex_attention_*, docs/cuda.md) -----------------

def _ctorch_cuda(what, index):
    """ctorch's device cuda:index (opened once per process); without ctorch's CUDA backend
    (libctorch_cuda.so) or a usable GPU, a CtorchError saying so."""
    from .._lib import CtorchError
    from .loss import _cuda_device
    try:
        return _cuda_device(index)
    except CtorchError as e:
        why = str(e)
        why = why[len(e.status) + 2:] if why.startswith(f"{e.status}: ") else why
        raise CtorchError(e.status, f"{what} needs ctorch's CUDA backend "
                                    f"(libctorch_cuda.so, docs/cuda.md): {why}") from None


def _blhe(x, dtype):
    """x [B, H, L, E] as a view of contiguous [B, L, H, E] memory (the GPU's layout; no copy
    when x already is one)."""
    return x.to(dtype).transpose(1, 2).contiguous().transpose(1, 2)


def _empty_blhe(B, H, L, E, dtype, dev):
    return torch.empty(B, L, H, E, dtype=dtype, device=dev).transpose(1, 2)


class _FlexAttentionCuda(torch.autograd.Function):
    """flex_attention on CUDA tensors through ct_device_flex_attention_forward / _backward:
    inputs in [B, L, H, E] memory, the block mask's device copy cached on the BlockMask, the
    score mod's parameters on the host (compiled mods upload what they read), their gradient
    returned on the parameter's device. PyTorch's current stream is synchronised before each
    call and ctorch's stream after it (as linear_cross_entropy on CUDA tensors)."""

    @staticmethod
    def forward(ctx, q, k, v, param, block_mask, score_mod, scale, index):
        dev = q.device
        d = _ctorch_cuda("flex_attention on CUDA tensors", index)
        B, Hq, L, E = q.shape
        out = _empty_blhe(B, Hq, L, v.shape[-1], q.dtype, dev)
        lse = torch.empty(B, Hq, L, dtype=torch.float32, device=dev)
        h = block_mask._on_device(d, index) if block_mask is not None else None
        pc = None if param is None else param.detach().to("cpu", torch.float32).contiguous()
        o = lib.ct_flex_options_default()
        o.scale = scale
        sm = _run_score_mod(score_mod, pc, None)
        try:
            if sm is not None:
                o.score_mod = ctypes.addressof(sm)
            torch.cuda.current_stream(dev).synchronize()
            check(lib.ct_device_flex_attention_forward(d, _dtensor(q)[0], _dtensor(k)[0], _dtensor(v)[0], h,
                                                       ctypes.byref(o), _dtensor(out)[0], _dtensor(lse)[0]))
            check(lib.ct_device_sync(d))
        finally:
            if sm is not None:
                lib.ct_score_mod_free(ctypes.byref(sm))
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.extra = (pc, block_mask, score_mod, scale, index,
                     None if param is None else (param.dtype, param.device))
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        pc, block_mask, score_mod, scale, index, pdt = ctx.extra
        need = ctx.needs_input_grad
        dev = q.device
        d = _ctorch_cuda("flex_attention on CUDA tensors", index)
        dout = _blhe(dout, q.dtype)
        B, Hq, L, E = q.shape
        Hkv, S = k.shape[1], k.shape[2]
        dq = _empty_blhe(B, Hq, L, E, q.dtype, dev) if need[0] else None
        dk = _empty_blhe(B, Hkv, S, E, q.dtype, dev) if need[1] else None
        dv = _empty_blhe(B, Hkv, S, v.shape[-1], q.dtype, dev) if need[2] else None
        dparam = torch.zeros_like(pc) if (pc is not None and need[3]) else None
        h = block_mask._on_device(d, index) if block_mask is not None else None
        o = lib.ct_flex_options_default()
        o.scale = scale
        sm = _run_score_mod(score_mod, pc, dparam)
        try:
            if sm is not None:
                o.score_mod = ctypes.addressof(sm)
            t = [_dtensor(x) for x in (q, k, v, out, lse, dout, dq, dk, dv)]
            torch.cuda.current_stream(dev).synchronize()
            check(lib.ct_device_flex_attention_backward(d, *[x[0] for x in t[:6]], h, ctypes.byref(o),
                                                        *[None if x is None else x[0] for x in t[6:]]))
            check(lib.ct_device_sync(d))
        finally:
            if sm is not None:
                lib.ct_score_mod_free(ctypes.byref(sm))
        if dparam is not None:
            dparam = dparam.to(pdt[1], pdt[0])
        return dq, dk, dv, dparam, None, None, None, None


def _flex_cuda(query, key, value, score_mod, block_mask, scale):
    """flex_attention's CUDA branch (checks done by flex_attention): (out, lse)."""
    fn = "flex_attention"
    dev = query.device
    for name, t in (("key", key), ("value", value)):
        if t.device != dev:
            C.fail(RuntimeError, fn, f"Expected all tensors to be on the same device, but {name} is on "
                                     f"{t.device} and query on {dev}")
    if score_mod is not None and score_mod.param is not None and score_mod.param.device.type not in ("cpu", "cuda"):
        C.fail(RuntimeError, fn, f"score_mod's captured tensors are on {score_mod.param.device}")
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    _ctorch_cuda("flex_attention on CUDA tensors", index)  # without the CUDA backend: refused before any work
    dt = query.dtype
    work = dt if dt in (torch.float32, torch.bfloat16) and key.dtype == dt and value.dtype == dt \
        else torch.float32
    q, k, v = (_blhe(x, work) for x in (query, key, value))
    s = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    param = score_mod.param if score_mod is not None else None
    return _FlexAttentionCuda.apply(q, k, v, param, block_mask, score_mod, s, index)


def check_flex_inputs(fn, query, key, value, block_mask=None):
    """The checks every attention entry point shares (flex_attention; compiled mods call it
    too): tensors on the CPU (or CUDA, for flex_attention) of a floating dtype (integers fail as the softmax of PyTorch's
    reference does), and a block mask made for these queries: its B and H 1 or equal to
    query's (broadcasting, else RuntimeError as PyTorch's attention over the dense mask), its
    Q_LEN / KV_LEN equal to L and S (else ValueError, as PyTorch 2.13's flex_attention)."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if isinstance(t, torch.Tensor) and t.device.type == "cuda":  # flex_attention on CUDA tensors
            if not t.is_floating_point():
                C.floating(fn, name, torch.empty(0, dtype=t.dtype))  # the CPU's message
        else:
            C.floating(fn, name, t)
    if block_mask is None or not isinstance(block_mask, BlockMask) or query.dim() != 4 or key.dim() != 4:
        return
    B, H, L, S = query.shape[0], query.shape[1], query.shape[2], key.shape[2]
    mB, mH, mL, mS = getattr(block_mask, "_made_for", block_mask.shape)
    if mB not in (1, B) or mH not in (1, H):
        C.fail(RuntimeError, fn, f"the block mask was made for B={mB}, H={mH} but query has B={B}, H={H} (a "
                                 f"block mask's B and H must be 1 (broadcast) or match)")
    if (mL, mS) != (L, S):
        C.fail(ValueError, fn, f"the block mask was made for Q_LEN={mL}, KV_LEN={mS} but query has {L} "
                                 f"positions and key {S}")


def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None, enable_gqa=False,
                   return_lse=False, kernel_options=None, *, return_aux=None):
    """torch.nn.attention.flex_attention on the CPU with a backward. query [B, Hq, L, E],
    key [B, Hkv, S, E], value [B, Hkv, S, Ev]; Hq != Hkv needs enable_gqa=True (any multiple).
    score_mod: None, one of score_mods, or a function ``(score, b, h, q_idx, kv_idx) -> score``
    as in PyTorch, traced and compiled to a native kernel (docs/compile.md; captured float32
    tensors that require grad get gradients; TraceError names what cannot be traced);
    block_mask: from create_block_mask (None: dense).
    Returns out [B, Hq, L, Ev] (and lse [B, Hq, L] f32 with return_lse; fully masked rows give
    out 0 and lse -inf). f32 and bf16 run natively (bf16 with f32 accumulation); other float
    dtypes are computed in f32. return_aux (PyTorch 2.13's keyword): an AuxRequest-like
    (lse, max_scores); out and an AuxOutput come back, lse filled when asked; max_scores is
    refused (NotImplementedError)."""
    want_lse = return_lse
    if return_aux is not None:
        if return_lse:
            raise ValueError("flex_attention: give return_lse or return_aux, not both")
        if getattr(return_aux, "max_scores", False):
            C.fail(NotImplementedError, "flex_attention", "return_aux max_scores: ctorch returns lse only")
        want_lse = bool(getattr(return_aux, "lse", False))
    check_flex_inputs("flex_attention", query, key, value, block_mask)
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise ValueError("flex_attention: query, key and value must be 4-D [B, H, L, E]")
    Hq, Hkv = query.shape[1], key.shape[1]
    if Hq != Hkv and not enable_gqa:
        raise ValueError(f"flex_attention: {Hq} query heads vs {Hkv} key/value heads needs enable_gqa=True")
    if Hq % Hkv:
        raise ValueError(f"flex_attention: query heads ({Hq}) must be a multiple of key/value heads ({Hkv})")
    if score_mod is not None and not isinstance(score_mod, ScoreMod):
        if not callable(score_mod):
            raise TypeError("flex_attention: score_mod must be None, a function (score, b, h, q_idx, "
                            "kv_idx) -> score, or one of ctorch.torch.score_mods")
        score_mod = _trace.compile_score_mod(score_mod)  # traced, compiled (cached) and checked
        score_mod.check_sizes(query.shape[0], Hq, query.shape[2], key.shape[2])
    if block_mask is not None and not isinstance(block_mask, BlockMask):
        raise TypeError("flex_attention: block_mask must come from ctorch.torch.create_block_mask")
    dt = query.dtype
    if query.is_cuda:
        out, lse = _flex_cuda(query, key, value, score_mod, block_mask, scale)
    else:
        work = dt if dt in (torch.float32, torch.bfloat16) and key.dtype == dt and value.dtype == dt \
            else torch.float32
        q, k, v = (x.to(work).contiguous() for x in (query, key, value))
        s = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
        param = score_mod.param if score_mod is not None else None
        out, lse = _FlexAttention.apply(q, k, v, param, block_mask, score_mod, s)
    out = out.to(dt)
    if return_aux is not None:
        from torch.nn.attention.flex_attention import AuxOutput
        return out, AuxOutput(lse=lse if want_lse else None)
    return (out, lse) if return_lse else out


# ---- scaled_dot_product_attention ---------------------------------------------------------

class _SdpaOptions(ctypes.Structure):
    _fields_ = [("scale", ctypes.c_float), ("is_causal", ctypes.c_bool), ("attn_mask", _vp)]


lib.ct_sdpa_options_default.restype = _SdpaOptions
lib.ct_sdpa_options_default.argtypes = []
lib.ct_sdpa_forward.argtypes = [_P(_Tensor)] * 3 + [_P(_SdpaOptions), _P(_Tensor), _P(_Tensor)]
lib.ct_sdpa_backward.argtypes = [_P(_Tensor)] * 6 + [_P(_SdpaOptions)] + [_P(_Tensor)] * 3
_MASK_DT = {torch.bool: 9, torch.uint8: 5, torch.float32: 0}


def _sdpa_options(mask, is_causal, scale):
    o = lib.ct_sdpa_options_default()
    o.scale, o.is_causal = scale, bool(is_causal)
    keep = None
    if mask is not None:
        c = _Tensor()
        c.data, c.dtype, c.ndim = mask.data_ptr(), _MASK_DT[mask.dtype], mask.dim()
        for i, (n, st) in enumerate(zip(mask.shape, mask.stride())):
            c.shape[i], c.strides[i] = n, st
        o.attn_mask = ctypes.addressof(c)
        keep = c
    return o, keep


class _SDPA(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, is_causal, scale):
        B, Hq, L, _ = q.shape
        out = torch.empty(B, Hq, L, v.shape[-1], dtype=q.dtype)
        lse = torch.empty(B, Hq, L, dtype=torch.float32)
        o, keep = _sdpa_options(mask, is_causal, scale)
        check(lib.ct_sdpa_forward(_tensor(q)[0], _tensor(k)[0], _tensor(v)[0], ctypes.byref(o),
                                  _tensor(out)[0], _tensor(lse)[0]))
        del keep
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.extra = (mask, is_causal, scale)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        mask, is_causal, scale = ctx.extra
        need = ctx.needs_input_grad
        dout = dout.to(q.dtype).contiguous()
        grads = [torch.empty_like(x) if need[i] else None for i, x in enumerate((q, k, v))]
        o, keep = _sdpa_options(mask, is_causal, scale)
        t = [_tensor(x) for x in (q, k, v, out, lse, dout, *grads)]
        check(lib.ct_sdpa_backward(*[x[0] for x in t[:6]], ctypes.byref(o),
                                   *[None if x is None else x[0] for x in t[6:]]))
        del keep
        return (*grads, None, None, None)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention on ctorch's attention kernels (dense,
    deterministic backward): query [B, Hq, L, E] (or [Hq, L, E]), key / value [B, Hkv, S, *],
    Hq != Hkv with enable_gqa; attn_mask bool (True = attend) or float (added to the scores,
    no gradient), broadcast to [B, Hq, L, S], or is_causal (top-left aligned; not both, as
    PyTorch documents). Fully masked rows give 0, as PyTorch 2.13.
    dropout_p > 0 is refused (NotImplementedError): ctorch has no attention dropout."""
    fn = "scaled_dot_product_attention"
    for name, t in (("query", query), ("key", key), ("value", value)):
        C.floating(fn, name, t)
    if not (query.dtype == key.dtype == value.dtype):
        C.fail(RuntimeError, fn, f"Expected query, key, and value to have the same dtype, but got query.dtype: "
                                 f"{query.dtype} key.dtype: {key.dtype} and value.dtype: {value.dtype} instead.")
    if dropout_p:
        C.fail(NotImplementedError, fn, f"dropout_p={dropout_p}: ctorch has no attention dropout (use 0.0)")
    three = query.dim() == 3
    if three and key.dim() == 3 and value.dim() == 3:
        query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        C.fail(ValueError, fn, "query, key and value must be 4-D [B, H, L, E] (or 3-D [H, L, E])")
    B, Hq, L, E = query.shape
    Hkv, S = key.shape[1], key.shape[2]
    if key.shape[0] != B or value.shape[0] != B or value.shape[2] != S or key.shape[-1] != E:
        C.fail(RuntimeError, fn, f"query {tuple(query.shape)}, key {tuple(key.shape)} and value "
                                 f"{tuple(value.shape)} do not fit")
    if Hkv != value.shape[1] or (Hq != Hkv and (not enable_gqa or Hq % Hkv)):
        C.fail(RuntimeError, fn, f"The size of tensor a ({Hq}) must match the size of tensor b ({Hkv}) at "
                                 f"non-singleton dimension 1 (query heads vs key/value heads: enable_gqa=True "
                                 f"with a multiple)")
    mask = None
    if attn_mask is not None:
        C.tensor(fn, "attn_mask", attn_mask)
        if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
            C.fail(RuntimeError, fn, f"Expected attn_mask dtype to be bool or float or to match query dtype, but "
                                     f"got attn_mask.dtype: {attn_mask.dtype} and  query.dtype: {query.dtype} "
                                     f"instead.")
        if attn_mask.is_floating_point() and attn_mask.requires_grad:
            C.fail(NotImplementedError, fn, "a float attn_mask that requires grad: ctorch gives it no gradient")
        if attn_mask.dim() > 4 or attn_mask.dim() < 1:
            C.fail(RuntimeError, fn, f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to "
                                     f"{(B, Hq, L, S)}")
        m = attn_mask.reshape((1,) * (2 - attn_mask.dim()) + tuple(attn_mask.shape)) if attn_mask.dim() < 2 \
            else attn_mask
        for d, (have, want) in enumerate(zip(m.shape[::-1], (S, L, Hq, B))):
            if have not in (1, want):
                C.fail(RuntimeError, fn, f"The size of tensor a ({want}) must match the size of tensor b ({have}) "
                                         f"at non-singleton dimension {3 - d}")
        if is_causal:  # PyTorch's documented rule ("an error is thrown if both are set")
            C.fail(RuntimeError, fn, "_scaled_dot_product_attention: Explicit attn_mask should not be set when "
                                     "is_causal=True")
        mask = m if m.dtype == torch.bool else m.detach().to(torch.float32)
    dt = query.dtype
    work = dt if dt in (torch.float32, torch.bfloat16) else torch.float32
    q, k, v = (x.to(work).contiguous() for x in (query, key, value))
    s = 1.0 / math.sqrt(E) if scale is None else float(scale)
    out = _SDPA.apply(q, k, v, mask, bool(is_causal), s).to(dt)
    return out.squeeze(0) if three else out


# The ctypes mirrors above match the C structs of the loaded library (or this import fails).
from .._lib import check_layouts as _check_layouts  # noqa: E402

_check_layouts({_SdpaOptions: "ct_sdpa_options", _Tile: "ct_attn_tile", _MaskMod: "ct_mask_mod", _ScoreMod: "ct_score_mod", _BlockMask: "ct_block_mask", _BlockMaskOptions: "ct_block_mask_options", _FlexOptions: "ct_flex_options", _Tensor: "ct_tensor"})
