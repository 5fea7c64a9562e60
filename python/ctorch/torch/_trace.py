"""Tracing a Python score_mod / mask_mod (written as PyTorch documents) into ctorch's mod
expression language, compiled to native tile kernels by libctorch (see docs/compile.md).

The function is called once with symbolic proxies for ``score`` (float), ``b``, ``h``,
``q_idx`` and ``kv_idx`` (int64). Arithmetic, comparisons, ``& | ~``, ``//`` and ``%`` (floor
semantics), ``torch.where``, ``abs exp log tanh sigmoid sqrt floor clamp minimum maximum``,
Python constants and indexing of captured tensors by index expressions are recorded; captured
tensors become runtime arguments (float32 ones that require grad receive gradients). Anything
else raises TraceError naming the construct: a data-dependent Python ``if``, an unknown torch
function, an in-place write, a captured tensor of the wrong device or dtype.
"""
import ctypes
import math
import threading

import torch

from .._lib import lib

_i64 = ctypes.c_int64
_vp = ctypes.c_void_p


class TraceError(TypeError):
    """The function uses a construct the tracer cannot record (the message names it)."""


class _Binding(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int),
                ("shape", _i64 * 4), ("data", _vp), ("requires_grad", ctypes.c_bool)]


_CT_DTYPE = {torch.float32: 0, torch.uint8: 5, torch.int32: 7, torch.int64: 8, torch.bool: 9}
_KIND = {torch.float32: "float", torch.uint8: "bool", torch.int32: "int", torch.int64: "int",
         torch.bool: "bool"}

_state = threading.local()


class _Capture:
    def __init__(self, tensor, name, grad):
        self.tensor = tensor
        self.name = name
        self.grad = grad


class _Tracer:
    def __init__(self, is_mask):
        self.is_mask = is_mask
        self.captures = []
        self._by_id = {}

    def capture(self, t):
        c = self._by_id.get(id(t))
        if c is not None:
            return c
        if t.device.type not in ("cpu", "cuda"):
            raise TraceError(f"captured tensor on device {t.device} (mods read CPU or CUDA tensors)")
        if t.dtype not in _CT_DTYPE:
            raise TraceError(f"captured tensor of dtype {t.dtype} (need float32, int32, int64, bool "
                             "or uint8)")
        if t.dim() > 4:
            raise TraceError(f"captured tensor with {t.dim()} dims (at most 4)")
        if len(self.captures) >= 16:
            raise TraceError("more than 16 captured tensors")
        grad = (not self.is_mask) and t.dtype == torch.float32 and t.requires_grad
        c = _Capture(t, f"t{len(self.captures)}", grad)
        self.captures.append(c)
        self._by_id[id(t)] = c
        return c


def _tracer():
    t = getattr(_state, "tracer", None)
    if t is None:
        raise TraceError("a traced value escaped its trace")
    return t


def _const(x):
    if isinstance(x, bool):
        return Proxy("true" if x else "false", "bool")
    if isinstance(x, int):
        if not -(2 ** 63) < x < 2 ** 63:
            raise TraceError(f"integer constant {x} does not fit int64")
        return Proxy(str(x) if x >= 0 else f"({x})", "int")
    if isinstance(x, float):
        if math.isnan(x):
            raise TraceError("a NaN constant")
        if math.isinf(x):
            return Proxy("inf" if x > 0 else "(-inf)", "float")
        return Proxy(repr(x) if x >= 0 else f"({x!r})", "float")
    return None


def _lift(x):
    """A Proxy for an operand: proxies, Python numbers, 0-dim captured tensors."""
    if isinstance(x, Proxy):
        return x
    if isinstance(x, _Partial):
        raise TraceError(f"captured tensor indexed with {len(x.idx)} of its {x.cap.tensor.dim()} dims "
                         "used as a value")
    c = _const(x)
    if c is not None:
        return c
    if isinstance(x, torch.Tensor):
        if x.dim() != 0:
            raise TraceError(f"captured tensor of shape {tuple(x.shape)} used without indexing")
        cap = _tracer().capture(x)
        return Proxy(cap.name, _KIND[x.dtype])
    raise TraceError(f"unsupported value of type {type(x).__name__}")


def _num(a, b):
    return "float" if "float" in (a.t, b.t) else "int"


def _bin(op, a, b):
    a, b = _lift(a), _lift(b)
    if op in ("<", "<=", ">", ">=", "==", "!="):
        return Proxy(f"({a.e} {op} {b.e})", "bool")
    if op in ("&", "|", "^"):
        if "float" in (a.t, b.t):
            raise TraceError(f"operator {op} on a float")
        t = "bool" if a.t == b.t == "bool" else "int"
        return Proxy(f"({a.e} {op} {b.e})", t)
    if op == "/":  # true division
        return Proxy(f"(float({a.e}) / {b.e})", "float")
    if op == "//":
        if _num(a, b) == "int":
            return Proxy(f"({a.e} / {b.e})", "int")
        # Python's (and torch's) float floor division: the quotient of a - (a mod b), rounded to
        # the integer it is within an ulp of (floor(a / b) is off by one where a / b rounds onto
        # an integer, e.g. 9.1 // -1.3); by 0 it is a / b as in torch
        return Proxy(f"where({b.e} == 0, float({a.e}) / {b.e}, floor(({a.e} - {a.e} % {b.e}) / {b.e} + 0.5))",
                     "float")
    return Proxy(f"({a.e} {op} {b.e})", _num(a, b))


def _fn1(name, a):
    a = _lift(a)
    if name == "abs":
        return Proxy(f"abs({a.e})", "int" if a.t == "bool" else a.t)
    if name == "floor" and a.t != "float":
        return a
    return Proxy(f"{name}({a.e})", "float")


def _minmax(name, a, b):
    a, b = _lift(a), _lift(b)
    return Proxy(f"{name}({a.e}, {b.e})", _num(a, b))


def _clamp(x, lo=None, hi=None):
    r = _lift(x)
    if lo is not None:
        r = _minmax("max", r, lo)
    if hi is not None:
        r = _minmax("min", r, hi)
    return r


def _where(c, a, b):
    c, a, b = _lift(c), _lift(a), _lift(b)
    t = "bool" if a.t == b.t == "bool" else _num(a, b)
    return Proxy(f"where({c.e}, {a.e}, {b.e})", t)


def _cast(x, dtype):
    x = _lift(x)
    if dtype is None:
        return x
    if dtype in (torch.float32, torch.float, torch.float64, torch.float16, torch.bfloat16):
        return Proxy(f"float({x.e})", "float")
    if dtype in (torch.int64, torch.int32, torch.long, torch.int):
        return Proxy(f"int({x.e})", "int")
    if dtype == torch.bool:
        return Proxy(f"({x.e} != 0)", "bool")
    raise TraceError(f"conversion to {dtype}")


def _index(base, idx):
    if not isinstance(idx, tuple):
        idx = (idx,)
    parts = []
    for i in idx:
        if isinstance(i, (slice, type(None), type(Ellipsis))):
            raise TraceError("slicing a captured tensor (index it with one value per dim)")
        if isinstance(i, torch.Tensor) and i.dim() != 0:
            raise TraceError("indexing a captured tensor with a tensor of indices")
        p = _lift(i)
        if p.t == "float":
            raise TraceError("indexing a captured tensor with a float")
        parts.append(p.e)
    if isinstance(base, _Partial):
        cap, prev = base.cap, base.idx
    else:
        cap, prev = _tracer().capture(base), []
    allidx = prev + parts
    nd = cap.tensor.dim()
    if len(allidx) > nd:
        raise TraceError(f"{len(allidx)} indices into a captured tensor of {nd} dims")
    if len(allidx) < nd:
        return _Partial(cap, allidx)
    return Proxy(f"{cap.name}[{', '.join(allidx)}]", _KIND[cap.tensor.dtype])


class _Partial:
    """A captured tensor indexed in some of its dims (more indices must follow)."""

    def __init__(self, cap, idx):
        self.cap = cap
        self.idx = idx

    def __getitem__(self, i):
        return _index(self, i)

    def __bool__(self):
        raise TraceError("data-dependent Python `if` on a traced value (use torch.where)")


_BINOPS = {"add": "+", "__add__": "+", "sub": "-", "__sub__": "-", "mul": "*", "__mul__": "*",
           "div": "/", "true_divide": "/", "__truediv__": "/", "__div__": "/",
           "floor_divide": "//", "__floordiv__": "//", "remainder": "%", "__mod__": "%",
           "fmod": None, "eq": "==", "__eq__": "==", "ne": "!=", "__ne__": "!=", "lt": "<",
           "__lt__": "<", "le": "<=", "__le__": "<=", "gt": ">", "__gt__": ">", "ge": ">=",
           "__ge__": ">=", "__and__": "&", "bitwise_and": "&", "logical_and": "&",
           "__or__": "|", "bitwise_or": "|", "logical_or": "|", "__xor__": "^",
           "bitwise_xor": "^", "logical_xor": "^", "greater": ">", "less": "<",
           "greater_equal": ">=", "less_equal": "<=", "not_equal": "!="}
_RBINOPS = {"__radd__": "+", "__rsub__": "-", "__rmul__": "*", "__rtruediv__": "/",
            "__rdiv__": "/", "__rfloordiv__": "//", "__rmod__": "%", "__rand__": "&",
            "__ror__": "|", "__rxor__": "^"}
_FN1 = {"exp": "exp", "log": "log", "tanh": "tanh", "sigmoid": "sigmoid", "sqrt": "sqrt",
        "abs": "abs", "absolute": "abs", "__abs__": "abs", "floor": "floor"}


def _torch_call(func, args, kwargs):
    name = getattr(func, "__name__", str(func))
    kwargs = kwargs or {}
    if name in ("__getitem__",):
        return _index(args[0], args[1])
    if name in ("__setitem__",) or name.endswith("_") and not name.startswith("__"):
        raise TraceError(f"in-place write ({name}) in a traced mod")
    if name in _BINOPS and _BINOPS[name] and len(args) == 2 and not kwargs:
        return _bin(_BINOPS[name], args[0], args[1])
    if name in _RBINOPS and len(args) == 2:
        return _bin(_RBINOPS[name], args[1], args[0])
    if name in _FN1 and len(args) == 1 and not kwargs:
        return _fn1(_FN1[name], args[0])
    if name in ("neg", "negative", "__neg__") and len(args) == 1:
        a = _lift(args[0])
        return Proxy(f"(-{a.e})", "int" if a.t == "bool" else a.t)
    if name in ("__invert__", "logical_not", "bitwise_not") and len(args) == 1:
        a = _lift(args[0])
        if name == "logical_not":
            return Proxy(f"(!{a.e})", "bool")
        return Proxy(f"(~{a.e})", a.t)
    if name in ("minimum", "maximum", "min", "max") and len(args) == 2 and not kwargs:
        return _minmax("min" if name.startswith("min") else "max", args[0], args[1])
    if name in ("clamp", "clip"):
        lo = args[1] if len(args) > 1 else kwargs.get("min")
        hi = args[2] if len(args) > 2 else kwargs.get("max")
        return _clamp(args[0], lo, hi)
    if name == "where" and len(args) == 3:
        return _where(*args)
    if name in ("to", "type") and len(args) >= 2 and isinstance(args[1], torch.dtype):
        return _cast(args[0], args[1])
    if name in ("to",) and "dtype" in kwargs:
        return _cast(args[0], kwargs["dtype"])
    if name in ("float", "double", "half", "bfloat16"):
        return _cast(args[0], torch.float32)
    if name in ("long", "int"):
        return _cast(args[0], torch.int64)
    if name == "bool":
        return _cast(args[0], torch.bool)
    if name in ("as_tensor", "tensor") and len(args) == 1:
        return _cast(args[0], kwargs.get("dtype"))
    raise TraceError(f"torch function {name!r} is not supported in a traced mod")


class Proxy:
    """A symbolic scalar of a traced mod: ``e`` is its expression, ``t`` bool / int / float."""

    __slots__ = ("e", "t")

    def __init__(self, e, t):
        self.e = e
        self.t = t

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return _torch_call(func, args, kwargs)

    __hash__ = object.__hash__

    def __add__(self, o): return _bin("+", self, o)
    def __radd__(self, o): return _bin("+", o, self)
    def __sub__(self, o): return _bin("-", self, o)
    def __rsub__(self, o): return _bin("-", o, self)
    def __mul__(self, o): return _bin("*", self, o)
    def __rmul__(self, o): return _bin("*", o, self)
    def __truediv__(self, o): return _bin("/", self, o)
    def __rtruediv__(self, o): return _bin("/", o, self)
    def __floordiv__(self, o): return _bin("//", self, o)
    def __rfloordiv__(self, o): return _bin("//", o, self)
    def __mod__(self, o): return _bin("%", self, o)
    def __rmod__(self, o): return _bin("%", o, self)
    def __and__(self, o): return _bin("&", self, o)
    def __rand__(self, o): return _bin("&", o, self)
    def __or__(self, o): return _bin("|", self, o)
    def __ror__(self, o): return _bin("|", o, self)
    def __xor__(self, o): return _bin("^", self, o)
    def __rxor__(self, o): return _bin("^", o, self)
    def __lt__(self, o): return _bin("<", self, o)
    def __le__(self, o): return _bin("<=", self, o)
    def __gt__(self, o): return _bin(">", self, o)
    def __ge__(self, o): return _bin(">=", self, o)
    def __eq__(self, o): return _bin("==", self, o)  # noqa: E704
    def __ne__(self, o): return _bin("!=", self, o)
    def __neg__(self): return Proxy(f"(-{self.e})", "int" if self.t == "bool" else self.t)
    def __pos__(self): return self
    def __invert__(self): return Proxy(f"(~{self.e})", self.t)
    def __abs__(self): return _fn1("abs", self)

    def __pow__(self, o):
        if isinstance(o, int) and not isinstance(o, bool) and 1 <= o <= 4:
            r = self
            for _ in range(o - 1):
                r = r * self
            return r
        raise TraceError("** (power) other than by a constant 1 .. 4")

    def __bool__(self):
        raise TraceError("data-dependent Python `if` / `and` / `or` / `not` on a traced value "
                         "(use torch.where, &, |, ~)")

    def __index__(self):
        raise TraceError("a traced value used as a Python int (e.g. to index a list)")

    def __int__(self):
        raise TraceError("int() of a traced value")

    def __float__(self):
        raise TraceError("float() of a traced value")

    def __len__(self):
        raise TraceError("len() of a traced value")

    def __iter__(self):
        raise TraceError("iterating over a traced value")

    def __setitem__(self, k, v):
        raise TraceError("in-place write (item assignment) in a traced mod")

    def __iadd__(self, o):
        return self + o

    # tensor methods PyTorch mods use
    def exp(self): return _fn1("exp", self)
    def log(self): return _fn1("log", self)
    def tanh(self): return _fn1("tanh", self)
    def sigmoid(self): return _fn1("sigmoid", self)
    def sqrt(self): return _fn1("sqrt", self)
    def abs(self): return _fn1("abs", self)
    def floor(self): return _fn1("floor", self)
    def clamp(self, min=None, max=None): return _clamp(self, min, max)  # noqa: A002
    clip = clamp
    def minimum(self, o): return _minmax("min", self, o)
    def maximum(self, o): return _minmax("max", self, o)
    def logical_and(self, o): return _bin("&", _cast(self, torch.bool), _cast(o, torch.bool))
    def logical_or(self, o): return _bin("|", _cast(self, torch.bool), _cast(o, torch.bool))
    def logical_not(self): return Proxy(f"(!{self.e})", "bool")
    def float(self): return _cast(self, torch.float32)
    def long(self): return _cast(self, torch.int64)
    def int(self): return _cast(self, torch.int64)
    def bool(self): return _cast(self, torch.bool)

    def to(self, *a, **k):
        dt = k.get("dtype") or next((x for x in a if isinstance(x, torch.dtype)), None)
        return _cast(self, dt)

    def __getattr__(self, name):
        if name.endswith("_") and not name.startswith("__"):
            raise TraceError(f"in-place write (.{name}()) in a traced mod")
        raise TraceError(f"tensor attribute or method .{name} is not supported in a traced mod")


def trace(fn, is_mask):
    """(expression, captures) of fn traced with proxies."""
    tr = _Tracer(is_mask)
    prev = getattr(_state, "tracer", None)
    _state.tracer = tr
    try:
        idx = [Proxy(n, "int") for n in ("b", "h", "q", "kv")]
        args = idx if is_mask else [Proxy("score", "float")] + idx
        try:
            r = fn(*args)
        except TraceError:
            raise
        except (TypeError, RuntimeError, IndexError, ValueError, AttributeError) as e:
            raise TraceError(f"the function failed under tracing: {type(e).__name__}: {e}") from e
        r = _lift(r)
    finally:
        _state.tracer = prev
    return r.e, tr.captures


def _bindings(captures, grad_base=None):
    """ctypes bindings of the captures; grad captures read grad_base (the packed f32 buffer
    address) at their offsets. Returns (array, keep-alive list)."""
    arr = (_Binding * max(1, len(captures)))()
    keep = []
    off = 0
    for i, c in enumerate(captures):
        t = c.tensor.detach()
        b = arr[i]
        b.name = c.name.encode()
        b.dtype = _CT_DTYPE[t.dtype]
        b.ndim = t.dim()
        for d, n in enumerate(t.shape):
            b.shape[d] = n
        b.requires_grad = c.grad
        if c.grad and grad_base is not None:
            b.data = grad_base + 4 * off
            off += t.numel()
        else:
            tc = t.cpu().contiguous()  # compiling and range checks read host values (CUDA: a copy)
            keep.append(tc)
            b.data = tc.data_ptr()
    return arr, keep


def _raise_status(status, index_error):
    from .._lib import status_name
    msg = lib.ct_last_error().decode()
    if index_error and status_name(status) == "CT_EINVAL":
        raise IndexError(msg)
    from .._lib import CtorchError
    raise CtorchError(status_name(status), msg)


def _sizes(B, H, L, S):
    return [_i64(1 if x is None else int(x)) for x in (B, H, L, S)]


def compile_mask_mod(fn, B, H, Q_LEN, KV_LEN):
    """A MaskMod compiled from a Python mask_mod, range-checked for the sizes; None (with a
    warning naming the construct) when it cannot be traced or compiled."""
    import warnings

    from .attention import MaskMod
    try:
        expr, caps = trace(fn, True)
    except TraceError as e:
        warnings.warn(f"ctorch: mask_mod cannot be traced ({e}); evaluating it per block in Python",
                      stacklevel=3)
        return None
    arr, keep = _bindings(caps)
    try:
        m = MaskMod(f"compiled({expr})",
                    lambda out: lib.ct_mask_mod_compile(expr.encode(), arr, len(caps), None, out),
                    fn, keep=(arr, keep, caps))
    except Exception as e:  # noqa: BLE001  (no compiler, cache refused: keep working)
        warnings.warn(f"ctorch: mask_mod could not be compiled ({e}); evaluating it per block in "
                      "Python", stacklevel=3)
        return None
    st = lib.ct_jit_check_mask(ctypes.byref(m._c), *_sizes(B, H, Q_LEN, KV_LEN))
    if st:
        _raise_status(st, True)
    return m


def compile_score_mod(fn):
    """A ScoreMod compiled from a Python score_mod (TraceError when it cannot be traced). Its
    ``param`` packs the captured float32 tensors that require grad, in capture order, so
    autograd hands each its own gradient."""
    from .attention import ScoreMod

    expr, caps = trace(fn, False)
    grads = [c.tensor for c in caps if c.grad]
    param = torch.cat([g.reshape(-1).to(torch.float32) for g in grads]) if grads else None

    class _Compiled(ScoreMod):
        def _c(self, p, d):
            from .attention import _ScoreMod
            arr, keep = _bindings(caps, grad_base=p)
            self._hold = (arr, keep)
            c = _ScoreMod()
            st = lib.ct_score_mod_compile(expr.encode(), arr, len(caps), None, ctypes.byref(c))
            if st:
                _raise_status(st, False)
            if d is not None:
                c.param_grad = d
            return c

        def check_sizes(self, B, H, L, S):
            pc = None if self.param is None else self.param.detach().to("cpu", torch.float32).contiguous()
            c = self._c(None if pc is None else pc.data_ptr(), None)
            try:
                st = lib.ct_jit_check_score(ctypes.byref(c), *_sizes(B, H, L, S))
            finally:
                lib.ct_score_mod_free(ctypes.byref(c))
            if st:
                _raise_status(st, True)

    return _Compiled(f"compiled({expr})", None, fn, param=param)


class _Stats(ctypes.Structure):
    _fields_ = [(n, _i64) for n in ("table_hits", "cache_hits", "compiles", "rebuilt", "processes")]


lib.ct_jit_get_stats.argtypes = [ctypes.POINTER(_Stats)]
lib.ct_jit_get_stats.restype = None


def stats():
    """This process's compile counters: table_hits, cache_hits, compiles, rebuilt, processes."""
    s = _Stats()
    lib.ct_jit_get_stats(ctypes.byref(s))
    return {n: getattr(s, n) for n, _ in _Stats._fields_}


# The ctypes mirrors above match the C structs of the loaded library (or this import fails).
from .._lib import check_layouts as _check_layouts  # noqa: E402

_check_layouts({_Binding: "ct_jit_binding", _Stats: "ct_jit_stats"})
