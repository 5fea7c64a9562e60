"""Generation with a KV cache (ct_gpt_generate) for ctorch.models.Model.

    ids = m.generate(input_ids, max_new_tokens=20)                       # greedy
    ids = m.generate(input_ids, 20, do_sample=True, temperature=0.8, top_k=40, top_p=0.95,
                     seed=3)                                             # sampled, reproducible

``input_ids`` is [B, T] (or one sequence [T]); the result is int64 [B, T + new] holding the
prompt then the new tokens, with rows that produced the EOS token padded with it (the run stops
once every row has). Sampling applies temperature, then top-k, then top-p (Hugging Face's
order), and draws from one seeded generator (``seed=None`` is seed 1), so the same call gives
the same ids. ``sample_probs`` returns the distribution a draw is made from.
"""
import ctypes

import torch

from ._lib import check, lib

_vp = ctypes.c_void_p


class _SampleOptions(ctypes.Structure):
    _fields_ = [("temperature", ctypes.c_float), ("top_k", ctypes.c_int64),
                ("top_p", ctypes.c_float)]


_STEP_FN = ctypes.CFUNCTYPE(None, _vp, ctypes.c_int64, _vp, ctypes.c_int64)


class _GenerateOptions(ctypes.Structure):
    _fields_ = [("max_new_tokens", ctypes.c_int64), ("sample", _SampleOptions),
                ("seed", ctypes.c_uint64), ("eos_token", ctypes.c_int32),
                ("no_cache", ctypes.c_bool), ("on_step", _STEP_FN), ("ctx", _vp)]


class _GenerateStats(ctypes.Structure):
    _fields_ = [("prompt_tokens", ctypes.c_int64), ("new_tokens", ctypes.c_int64),
                ("prompt_seconds", ctypes.c_double), ("decode_seconds", ctypes.c_double)]


lib.ct_generate_options_default.restype = _GenerateOptions
lib.ct_gpt_generate.argtypes = [_vp, _vp, ctypes.c_int64, ctypes.c_int64,
                                ctypes.POINTER(_GenerateOptions), _vp,
                                ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(_GenerateStats)]
lib.ct_sample_probs.argtypes = [_vp, ctypes.c_int64, ctypes.POINTER(_SampleOptions), _vp]


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def _sample_options(do_sample, temperature, top_k, top_p):
    """Validate like transformers' generation config / logits warpers; the C options."""
    o = _SampleOptions(0.0, 0, 1.0)
    if not isinstance(do_sample, bool):
        raise TypeError(f"do_sample must be a bool, got {type(do_sample).__name__}")
    if not do_sample:
        return o  # greedy: temperature, top_k and top_p do not apply
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(f"temperature must be a float, got {type(temperature).__name__}")
    if not (temperature > 0) or temperature == float("inf"):
        raise ValueError(f"`temperature` (={temperature}) has to be a strictly positive float")
    o.temperature = float(temperature)
    if top_k is not None:
        if not _is_int(top_k):
            raise TypeError(f"top_k must be an int, got {type(top_k).__name__}")
        if top_k <= 0:
            raise ValueError(f"`top_k` has to be a strictly positive integer, but is {top_k}")
        o.top_k = top_k
    if top_p is not None:
        if isinstance(top_p, bool) or not isinstance(top_p, (int, float)):
            raise TypeError(f"top_p must be a float, got {type(top_p).__name__}")
        if not (0.0 <= top_p <= 1.0):
            raise ValueError(f"`top_p` has to be a float >= 0 and <= 1, but is {top_p}")
        o.top_p = float(top_p)
    return o


def sample_probs(logits, temperature=1.0, top_k=None, top_p=None):
    """The distribution a sampled token is drawn from (ct_sample_probs): float32 [..., V] with
    zeros for the tokens temperature -> top-k -> top-p filter out; temperature 0 is greedy."""
    x = torch.as_tensor(logits, dtype=torch.float32).contiguous()
    if x.dim() < 1 or x.shape[-1] < 1:
        raise ValueError("sample_probs: logits must have a last dim V >= 1")
    greedy = temperature == 0
    o = _sample_options(not greedy, 1.0 if greedy else temperature, top_k, top_p)
    if greedy:
        o.top_k = top_k or 0
        o.top_p = 1.0 if top_p is None else float(top_p)
    V = x.shape[-1]
    rows = x.reshape(-1, V)
    out = torch.empty_like(rows)
    for i in range(rows.shape[0]):
        check(lib.ct_sample_probs(_vp(rows[i].data_ptr()), V, ctypes.byref(o),
                                  _vp(out[i].data_ptr())))
    return out.view(x.shape)


def generate(model, input_ids, max_new_tokens, do_sample=False, temperature=1.0, top_k=None,
             top_p=None, seed=None, eos_token_id=None, use_cache=True):
    """Continue input_ids [B, T] by up to max_new_tokens tokens; int64 [B, T + new].

    eos_token_id (default: the model's ``eos_token_id`` attribute, None: never stop) ends a
    row; use_cache=False recomputes the whole sequence for every token (the baseline)."""
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids must be a torch.Tensor, got {type(input_ids).__name__}")
    if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or \
            input_ids.dtype == torch.bool:
        # what torch.nn.functional.embedding raises for such indices
        raise RuntimeError("Expected tensor for argument #1 'indices' to have one of the "
                           f"following scalar types: Long, Int; but got {input_ids.dtype} instead")
    ids = input_ids[None] if input_ids.dim() == 1 else input_ids
    if ids.dim() != 2 or ids.shape[0] < 1 or ids.shape[1] < 1:
        raise ValueError(f"input_ids must be [batch, seq_len] with both >= 1, got shape "
                         f"{tuple(input_ids.shape)}")
    if not _is_int(max_new_tokens):
        raise TypeError(f"max_new_tokens must be an int, got {type(max_new_tokens).__name__}")
    if max_new_tokens < 0:
        raise ValueError(f"`max_new_tokens` must be greater than or equal to 0, but is "
                         f"{max_new_tokens}")
    if seed is None:
        seed = 1
    if not _is_int(seed):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if not (0 <= seed < 2 ** 64):
        raise ValueError(f"seed must be in [0, 2^64), got {seed}")
    V = model.config["vocab_size"]
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= V):
        raise IndexError("index out of range in self")
    if eos_token_id is None:
        eos_token_id = getattr(model, "eos_token_id", None)
    if eos_token_id is not None and (not _is_int(eos_token_id) or not 0 <= eos_token_id < V):
        raise ValueError(f"eos_token_id must be an int in [0, {V}), got {eos_token_id}")
    o = lib.ct_generate_options_default()
    o.max_new_tokens = max_new_tokens
    o.sample = _sample_options(do_sample, temperature, top_k, top_p)
    o.seed = seed
    o.eos_token = -1 if eos_token_id is None else eos_token_id
    o.no_cache = not use_cache
    B, T = ids.shape
    # the model's sequence capacity is the window the next token is computed from
    model._ensure(1, min(T + max_new_tokens, model.config["context"]))
    prompt = ids.to(torch.int32).contiguous()
    out = torch.empty(B, T + max_new_tokens, dtype=torch.int32)
    n = ctypes.c_int64()
    check(lib.ct_gpt_generate(model._m, _vp(prompt.data_ptr()), B, T, ctypes.byref(o),
                              _vp(out.data_ptr()), ctypes.byref(n), None))
    return out[:, :T + n.value].to(torch.int64)


# The ctypes mirrors above match the C structs of the loaded library (or this import fails).
from ._lib import check_layouts as _check_layouts  # noqa: E402

_check_layouts({_SampleOptions: "ct_sample_options", _GenerateOptions: "ct_generate_options", _GenerateStats: "ct_generate_stats"})
