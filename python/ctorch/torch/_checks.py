"""Argument checks shared by every wrapper of ctorch.torch (and by ctorch.models and the
compiled mods): PyTorch 2.13's shape and dtype rules, and the exception class PyTorch raises
for each misuse, checked before any pointer or length reaches C (which trusts them).

Each failure is a ``CtorchError`` (status "CT_EINVAL") that is also an instance of the class
PyTorch raises for the same misuse: ``RuntimeError`` (CtorchError itself), ``ValueError``,
``IndexError``, ``TypeError``; ``NotImplementedError`` where PyTorch's kernels refuse a dtype
("... not implemented for 'Long'", a RuntimeError subclass) and where PyTorch accepts something
ctorch does not compute (class-probability targets), never a silent conversion.
"""
import torch

from .._lib import CtorchError


class CtorchValueError(CtorchError, ValueError):
    """A misuse PyTorch reports with ValueError."""


class CtorchIndexError(CtorchError, IndexError):
    """An index out of range, where PyTorch raises IndexError."""


class CtorchTypeError(CtorchError, TypeError):
    """An argument of the wrong kind (not a tensor), where PyTorch raises TypeError."""


class CtorchNotImplementedError(CtorchError, NotImplementedError):
    """Valid in PyTorch, not computed by ctorch (refused, never approximated)."""


class CtorchAssertionError(CtorchError, AssertionError):
    """Where PyTorch asserts (F.embedding's padding_idx)."""


_CLASSES = {RuntimeError: CtorchError, ValueError: CtorchValueError, IndexError: CtorchIndexError,
            TypeError: CtorchTypeError, NotImplementedError: CtorchNotImplementedError,
            AssertionError: CtorchAssertionError}

# PyTorch's names for dtypes in its messages ("expected scalar type Long but found Float").
_SCALAR = {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half",
           torch.bfloat16: "BFloat16", torch.int64: "Long", torch.int32: "Int", torch.int16: "Short",
           torch.int8: "Char", torch.uint8: "Byte", torch.bool: "Bool"}
_INTEGER = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def scalar_name(dt):
    return _SCALAR.get(dt, str(dt).replace("torch.", ""))


def fail(kind, fn, msg):
    """Raise the ctorch error that is a `kind` (RuntimeError, ValueError, ...)."""
    raise _CLASSES[kind]("CT_EINVAL", f"{fn}: {msg}")


def tensor(fn, name, t, optional=False):
    """t is a CPU torch.Tensor (or None when optional); returns it."""
    if t is None and optional:
        return None
    if not isinstance(t, torch.Tensor):
        fail(TypeError, fn, f"argument '{name}' must be Tensor, not {type(t).__name__}")
    if t.device.type != "cpu":
        fail(RuntimeError, fn, f"{name} must be on the CPU, got {t.device}")
    return t


def floating(fn, name, t):
    """A floating-point tensor: integer and bool inputs fail as PyTorch 2.13's kernels do
    (NotImplementedError: "GeluKernelImpl" not implemented for 'Long')."""
    tensor(fn, name, t)
    if not t.is_floating_point():
        fail(NotImplementedError, fn, f"\"{fn}\" not implemented for '{scalar_name(t.dtype)}' ({name} must be a "
                               f"floating-point tensor, got {t.dtype})")
    return t


def same_dtype(fn, name, t, like_name, like):
    """t has like's dtype (PyTorch's matmul and nll_loss rule)."""
    if t.dtype != like.dtype:
        fail(RuntimeError, fn, f"expected scalar type {scalar_name(like.dtype)} but found "
                               f"{scalar_name(t.dtype)} ({name} is {t.dtype}, {like_name} is {like.dtype})")


def dims(fn, name, t, allowed, kind=RuntimeError):
    if t.dim() not in allowed:
        want = " or ".join(f"{d}-D" for d in allowed)
        fail(kind, fn, f"{name} must be {want}, got shape {tuple(t.shape)}")


def reduction(fn, r):
    if r not in ("none", "mean", "sum"):
        fail(ValueError, fn, f"{r} is not a valid value for reduction (none, mean, sum)")
    return r


def class_weight(fn, weight, C, like):
    """The per-class weight of a loss: [C], the input's dtype (PyTorch's nll_loss)."""
    if weight is None:
        return None
    tensor(fn, "weight", weight)
    if weight.dim() != 1 or weight.shape[0] != C:
        fail(RuntimeError, fn, f"weight tensor should be defined either for all {C} classes or no classes "
                               f"but got weight tensor of shape: {list(weight.shape)}")
    same_dtype(fn, "weight", weight, "input", like)
    return weight


def class_targets(fn, target, input_shape, C, ignore_index, input_dtype):
    """Class-index targets for logits of shape input_shape ([N, C], [C] or [N, C, d1, ...]):
    returns them flattened to [rows] as int64/int32, checked against PyTorch's rules
    (batch size, dims, dtype, every value in [0, C) or ignore_index)."""
    tensor(fn, "target", target)
    if target.is_floating_point() or target.is_complex():
        if tuple(target.shape) == tuple(input_shape):
            fail(NotImplementedError, fn,
                 "a floating-point target with the input's shape holds class probabilities; ctorch "
                 "computes class-index targets only (pass target.argmax(1) for one-hot rows, or use "
                 "torch.nn.functional.cross_entropy)")
        fail(RuntimeError, fn, f"expected scalar type Long but found {scalar_name(target.dtype)} "
                               f"(class-index targets must be integers; never truncated)")
    if target.dtype not in _INTEGER:
        fail(RuntimeError, fn, f"expected scalar type Long but found {scalar_name(target.dtype)}")
    nd = len(input_shape)
    if nd == 1:
        if target.dim() != 0:
            fail(RuntimeError, fn, f"0D target tensor expected for a 1-D input, got shape {tuple(target.shape)}")
    elif target.dim() != nd - 1:
        if nd == 2 and target.dim() >= 2:
            fail(RuntimeError, fn, "0D or 1D target tensor expected, multi-target not supported")
        fail(RuntimeError, fn, f"target of shape {tuple(target.shape)} does not fit input {tuple(input_shape)}")
    if nd >= 2 and target.shape[0] != input_shape[0]:
        fail(ValueError, fn, f"Expected input batch_size ({input_shape[0]}) to match target batch_size "
                             f"({target.shape[0]}).")
    if nd >= 3 and tuple(target.shape[1:]) != tuple(input_shape[2:]):
        fail(RuntimeError, fn, f"size mismatch (got input: {tuple(input_shape)}, target: {tuple(target.shape)})")
    t = target.reshape(-1)
    if t.dtype not in (torch.int64, torch.int32):
        t = t.to(torch.int64)  # exact: every value of the narrower types fits
    t = t.contiguous()
    if t.numel():
        bad = ((t < 0) | (t >= C)) & (t != ignore_index)
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            v = int(t[i])
            fail(IndexError, fn, f"Target {v} is out of bounds: target[{i}] = {v} is outside [0, {C}) and is "
                                 f"not ignore_index ({ignore_index})")
    return t


def linear_bias(fn, bias, V, like):
    """The fused loss's bias: exactly [V] and the input's dtype (PyTorch 2.13's
    F.linear_cross_entropy: "expected linear_bias shape (V,)", then addmm's dtype rule)."""
    if bias is None:
        return None
    tensor(fn, "linear_bias", bias)
    if tuple(bias.shape) != (V,):
        fail(RuntimeError, fn, f"expected linear_bias shape {(V,)}, got {tuple(bias.shape)}")
    same_dtype(fn, "linear_bias", bias, "input", like)
    return bias


def index_bound(fn, name, n, need, what):
    """An index table of n entries read at positions up to need - 1 (IndexError as torch's
    indexing)."""
    if n < need:
        fail(IndexError, fn, f"index {n} is out of bounds for dimension 0 with size {n} ({name} has {n} "
                             f"{what}, {need} needed)")


def dim(fn, d, ndim):
    """A dim argument in [-ndim, ndim) (0-D tensors take -1 and 0); returns it made
    non-negative. IndexError as PyTorch's wrap_dim."""
    n = max(ndim, 1)
    if not isinstance(d, int) or isinstance(d, bool):
        fail(TypeError, fn, f"dim must be an int, got {type(d).__name__}")
    if not -n <= d < n:
        fail(IndexError, fn, f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {d})")
    return d % n


def int64_index(fn, name, t):
    """gather / scatter indices: int64 or int32 (torch.gather's rule in 2.13; never truncated)."""
    tensor(fn, name, t)
    if t.dtype not in (torch.int64, torch.int32):
        fail(RuntimeError, fn, f"{fn}(): Expected dtype int32/int64 for {name}, got {t.dtype}")
    return t


def id_tensor(fn, name, t):
    """Embedding ids: Long or Int (F.embedding's rule; never truncated)."""
    tensor(fn, name, t)
    if t.dtype not in (torch.int64, torch.int32):
        fail(RuntimeError, fn, f"Expected tensor for argument #1 '{name}' to have one of the following scalar "
                               f"types: Long, Int; but got {t.dtype} instead")
    return t


F32_EXACT = 1 << 24  # every integer up to this magnitude is exact in float32


def f32_exact(fn, name, t, scale=1):
    """Integer values that the float32 kernels hold exactly (|x| * scale <= 2^24): ctorch
    computes values in float32, and PyTorch keeps integers exact, so larger ones are refused
    (NotImplementedError) rather than rounded."""
    tensor(fn, name, t)
    if t.is_floating_point() or t.dtype == torch.bool or t.numel() == 0:
        return t
    big = int(t.abs().max()) if t.dtype != torch.uint8 else int(t.max())
    if big * scale > F32_EXACT:
        fail(NotImplementedError, fn, f"{name} holds integers up to {big}{f' (x {scale} summed)' if scale > 1 else ''}; "
                                      f"ctorch's kernels compute in float32, exact only up to 2^24, so this is "
                                      f"refused rather than rounded (use torch for it)")
    return t
