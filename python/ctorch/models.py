"""ctorch's decoder-only transformer (include/ctorch/model.h) from Python.

    from ctorch import models
    m = models.load("path/to/hf-dir")          # a Hugging Face Llama-family directory, or a
                                                # ctorch checkpoint (.safetensors)
    logits = m.forward(torch.tensor([[1, 2, 3]]))   # [B, T] -> [B, T, V] float32
    ids = m.generate(torch.tensor([[1, 2, 3]]), 8)  # [B, T] -> [B, T + 8] int64 (KV cache)

    m = models.Model({"vocab_size": 64, "d_model": 32, ...})   # a ctorch config (model.h keys)
    m.set_weights({"tok_embeddings.weight": tensor, ...})      # ctorch tensor names
    loss, grads = m.loss_and_grads(tokens)     # tokens [B, T + 1]: mean next-token loss and
                                                # d loss / d every parameter (ctorch names)

Inputs are torch tensors (or anything torch.as_tensor takes); outputs are torch tensors. The
model instance is sized for the largest batch and sequence seen so far, and re-created (weights
copied) when a call needs more.
"""
import ctypes
import json
import os

import torch

from ._lib import check, cpath, cstr, lib, read_regular
from . import io as _io

_P = ctypes.POINTER
_vp = ctypes.c_void_p


class _Config(ctypes.Structure):
    _fields_ = [("vocab_size", ctypes.c_int64), ("context", ctypes.c_int64),
                ("n_layer", ctypes.c_int64), ("d_model", ctypes.c_int64),
                ("n_head", ctypes.c_int64), ("n_kv_head", ctypes.c_int64),
                ("d_ff", ctypes.c_int64), ("rope_base", ctypes.c_float),
                ("window", ctypes.c_int64), ("tied", ctypes.c_bool),
                ("norm_eps", ctypes.c_float), ("init_std", ctypes.c_float),
                ("head_dim", ctypes.c_int64), ("qkv_bias", ctypes.c_bool),
                ("o_bias", ctypes.c_bool), ("rope_scaling", ctypes.c_int32),
                ("rope_factor", ctypes.c_float), ("rope_low_freq_factor", ctypes.c_float),
                ("rope_high_freq_factor", ctypes.c_float),
                ("rope_original_context", ctypes.c_int64),
                ("score_mod", ctypes.c_char * 256), ("mask_mod", ctypes.c_char * 256)]


class _Options(ctypes.Structure):
    _fields_ = [("batch", ctypes.c_int64), ("seq", ctypes.c_int64),
                ("fused_head", ctypes.c_bool), ("dense_attention", ctypes.c_bool),
                ("eos_token", ctypes.c_int32), ("z_loss", ctypes.c_float),
                ("label_smoothing", ctypes.c_float), ("lce_scratch_bytes", ctypes.c_size_t),
                ("dtype", ctypes.c_int), ("device", ctypes.c_void_p)]


_Tensor = _io._Tensor  # the one mirror of ct_tensor (ctorch.io)


_CT_BF16 = 3  # CT_DTYPE_BF16 of ctorch/tensor.h
lib.ct_gpt_config_default.restype = _Config
lib.ct_gpt_options_default.restype = _Options
lib.ct_gpt_config_from_json.argtypes = [ctypes.c_char_p, _P(_Config)]
lib.ct_gpt_config_to_json.argtypes = [_P(_Config), _P(_vp)]
lib.ct_gpt_create.argtypes = [_P(_Config), _P(_Options), _P(_vp)]
lib.ct_gpt_free.argtypes = [_vp]
lib.ct_gpt_free.restype = None
lib.ct_gpt_init.argtypes = [_vp, ctypes.c_uint64]
lib.ct_gpt_num_tensors.argtypes = [_vp]
lib.ct_gpt_num_params.argtypes = [_vp]
lib.ct_gpt_num_params.restype = ctypes.c_int64
lib.ct_gpt_params.argtypes = [_vp]
lib.ct_gpt_params.restype = _vp
lib.ct_gpt_grads.argtypes = [_vp]
lib.ct_gpt_grads.restype = _vp
lib.ct_gpt_tensor.argtypes = [_vp, ctypes.c_int, _P(ctypes.c_char_p), _P(_Tensor), _P(_Tensor)]
lib.ct_gpt_zero_grad.argtypes = [_vp]
lib.ct_gpt_zero_grad.restype = None
lib.ct_gpt_logits.argtypes = [_vp, _vp, ctypes.c_int64, ctypes.c_int64, _vp]
lib.ct_gpt_forward_backward.argtypes = [_vp, _vp, ctypes.c_int64, ctypes.c_int64, ctypes.c_float,
                                        _P(ctypes.c_float)]
lib.ct_free.argtypes = [_vp]
lib.ct_free.restype = None
lib.ct_hf_open.argtypes = [ctypes.c_char_p, _P(_vp)]
lib.ct_hf_close.argtypes = [_vp]
lib.ct_hf_close.restype = None
lib.ct_hf_get_config.argtypes = [_vp]
lib.ct_hf_get_config.restype = _P(_Config)
lib.ct_hf_load_params.argtypes = [_vp, _vp]
lib.ct_hf_map_params.argtypes = [_vp, _vp, _P(ctypes.c_int)]
lib.ct_hf_map_model.argtypes = [_vp, _P(_Options), _P(_vp), _P(ctypes.c_int)]
lib.ct_hf_num_shards.argtypes = [_vp]


class _HfInfo(ctypes.Structure):
    _fields_ = [("arch", ctypes.c_int), ("dtype", ctypes.c_int), ("bos_token", ctypes.c_int32),
                ("eos_token", ctypes.c_int32)]


lib.ct_hf_get_info.argtypes = [_vp]
lib.ct_hf_get_info.restype = _P(_HfInfo)


class _HfSaveOptions(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int), ("arch", ctypes.c_int)]


lib.ct_hf_save_options_default.restype = _HfSaveOptions
lib.ct_hf_save.argtypes = [_vp, _vp, ctypes.c_char_p, _P(_HfSaveOptions)]
_DTYPES = {None: -1, "f32": 0, "float32": 0, "f16": 2, "float16": 2, "bf16": 3, "bfloat16": 3}


class _HfDir:
    """An opened Hugging Face directory (ct_hf_model), closed when the last user goes."""

    def __init__(self, path):
        h = _vp()
        check(lib.ct_hf_open(cpath(path), ctypes.byref(h)))
        self.h = h

    def __del__(self):
        if getattr(self, "h", None):
            lib.ct_hf_close(self.h)
            self.h = None


def _config_struct(cfg):
    c = lib.ct_gpt_config_default()
    text = cfg if isinstance(cfg, str) else json.dumps(cfg)
    check(lib.ct_gpt_config_from_json(text.encode(), ctypes.byref(c)))
    return c


def _config_dict(c):
    out = _vp()
    check(lib.ct_gpt_config_to_json(ctypes.byref(c), ctypes.byref(out)))
    try:
        return json.loads(ctypes.string_at(out.value).decode())
    finally:
        lib.ct_free(out)


_GEMM_DTYPES = {torch.float32: 0, "f32": 0, "float32": 0, torch.bfloat16: _CT_BF16, "bf16": _CT_BF16,
                "bfloat16": _CT_BF16}


class Model:
    """A ctorch model with f32 weights (zero until set_weights / init / load). dtype
    torch.bfloat16 (or "bf16"): mixed precision as torch.autocast("cpu", torch.bfloat16) does
    for linear / matmul: every matrix product takes bf16 operands (the weights' bf16 copy and
    the activation) and accumulates in f32; the weights, gradients, norms, attention and the
    loss stay f32 (ct_gpt_options.dtype, docs/train.md)."""

    def __init__(self, config, seed=None, _hf=None, _mapped=False, dtype=torch.float32):
        if dtype not in _GEMM_DTYPES:
            raise ValueError(f"ctorch.models: dtype must be torch.float32 or torch.bfloat16, got {dtype!r}")
        self._dtype = _GEMM_DTYPES[dtype]
        self._cfg = _config_struct(config)
        self.config = _config_dict(self._cfg)
        self._hf = _hf          # the directory the weights come from (kept open: mapped views)
        self._mapped = _mapped  # weights read in place from the files (inference only)
        self.mapped_tensors = 0
        self._m = None
        self._batch = 0
        self._seq = 0
        self._ensure(1, 1)
        if seed is not None:
            check(lib.ct_gpt_init(self._m, seed))

    def __del__(self):
        if getattr(self, "_m", None):
            lib.ct_gpt_free(self._m)
            self._m = None

    def _ensure(self, B, T):
        if self._m is not None and B <= self._batch and T <= self._seq:
            return
        if getattr(self, "_pinned", False):
            raise ValueError(f"ctorch.models: this model carries LoRA adapters and is sized for "
                             f"{self._batch} x {self._seq} tokens")
        ctx = self.config["context"]
        if T > ctx:
            raise ValueError(f"ctorch.models: sequence of {T} tokens is longer than the model's "
                             f"context {ctx}")
        nb, ns = max(B, self._batch, 1), max(T, self._seq, 1)
        o = lib.ct_gpt_options_default()
        o.batch, o.seq, o.dtype = nb, ns, self._dtype
        m = _vp()
        if self._mapped:  # views into the files in their dtype, no parameter arrays
            n = ctypes.c_int()
            check(lib.ct_hf_map_model(self._hf.h, ctypes.byref(o), ctypes.byref(m),
                                      ctypes.byref(n)))
            self.mapped_tensors = n.value
        else:
            check(lib.ct_gpt_create(ctypes.byref(self._cfg), ctypes.byref(o), ctypes.byref(m)))
            if self._m is not None:
                n = lib.ct_gpt_num_params(m)
                ctypes.memmove(lib.ct_gpt_params(m), lib.ct_gpt_params(self._m), n * 4)
        if self._m is not None:
            lib.ct_gpt_free(self._m)
        self._m, self._batch, self._seq = m, nb, ns

    def _views(self, grads=False):
        out = {}
        for i in range(lib.ct_gpt_num_tensors(self._m)):
            name = ctypes.c_char_p()
            p, g = _Tensor(), _Tensor()
            check(lib.ct_gpt_tensor(self._m, i, ctypes.byref(name), ctypes.byref(p), ctypes.byref(g)))
            t = g if grads else p
            shape = tuple(t.shape[d] for d in range(t.ndim))
            n = 1
            for s in shape:
                n *= s
            buf = (ctypes.c_float * n).from_address(t.data)
            out[name.value.decode()] = torch.frombuffer(buf, dtype=torch.float32).view(shape)
        return out

    def names(self):
        """The parameter names, in the model's order."""
        return list(self._views().keys())

    def state_dict(self):
        """Copies of the parameters (f32 torch tensors) under ctorch's names."""
        return {k: v.clone() for k, v in self._views().items()}

    def set_weights(self, weights, strict=True):
        """Copy tensors (ctorch names) into the model; strict: every parameter must be given
        and no other name."""
        views = self._views()
        if strict:
            missing = [k for k in views if k not in weights]
            extra = [k for k in weights if k not in views]
            if missing or extra:
                raise KeyError(f"ctorch.models: missing {missing[:4]}, unexpected {extra[:4]}")
        for k, v in weights.items():
            if k not in views:
                continue
            v = torch.as_tensor(v)
            if tuple(v.shape) != tuple(views[k].shape):
                raise ValueError(f"ctorch.models: {k} has shape {tuple(v.shape)}, the model's is "
                                 f"{tuple(views[k].shape)}")
            views[k].copy_(v.to(torch.float32))

    def _ids(self, x, extra=0):
        """x as contiguous int32 [B, T]. As torch.nn.functional.embedding: indices must be
        int64 or int32 (float ids are refused, never truncated) and in [0, vocab_size) (checked
        before the narrowing to int32, which would wrap 2^32 + 5 to 5)."""
        x = torch.as_tensor(x)
        if x.dtype not in (torch.int64, torch.int32):
            raise RuntimeError("Expected tensor for argument #1 'indices' to have one of the "
                               f"following scalar types: Long, Int; but got {x.type()} instead "
                               "(ctorch.models: input_ids)")
        if x.dim() == 1:
            x = x[None]
        if x.dim() != 2 or x.shape[1] < 1 + extra:
            raise ValueError("ctorch.models: input_ids must be [B, T] with T >= 1")
        V = self.config["vocab_size"]
        if x.numel() and (int(x.min()) < 0 or int(x.max()) >= V):
            bad = int(x.min()) if int(x.min()) < 0 else int(x.max())
            raise IndexError(f"index out of range in self (ctorch.models: token id {bad} is "
                             f"outside the vocabulary [0, {V}))")
        return x.to(torch.int32).contiguous()

    def forward(self, input_ids):
        """Logits [B, T, V] (float32) of input_ids [B, T] (a 1-D input is one sequence)."""
        ids = self._ids(input_ids)
        B, T = ids.shape
        self._ensure(B, T)
        out = torch.empty(B, T, self.config["vocab_size"], dtype=torch.float32)
        check(lib.ct_gpt_logits(self._m, _vp(ids.data_ptr()), B, T, _vp(out.data_ptr())))
        return out

    __call__ = forward

    eos_token_id = None  # generate() stops a row at this token (None: never)

    def generate(self, input_ids, max_new_tokens, do_sample=False, temperature=1.0, top_k=None,
                 top_p=None, seed=None, **kw):
        """input_ids [B, T] continued by up to max_new_tokens tokens with a KV cache: int64
        [B, T + new] (see ctorch._generate: greedy unless do_sample; temperature -> top-k ->
        top-p; seed=None is 1; rows ending in eos_token_id are padded with it)."""
        from . import _generate
        return _generate.generate(self, input_ids, max_new_tokens, do_sample, temperature, top_k,
                                  top_p, seed, **kw)

    def merge_lora(self, path):
        """Fold a PEFT LoRA adapter directory into the weights (W += alpha / r B A); returns the
        number of adapters merged. Needs own weights (load(..., mmap=False))."""
        n = ctypes.c_int()
        check(lib.ct_lora_merge(self._m, cpath(path), ctypes.byref(n)))
        return n.value

    def save_hf(self, path, dtype=None, arch=None):
        """Write a Hugging Face directory (config.json + model.safetensors, or the source's
        shards). dtype: None (the source's torch_dtype, or f32), "f32", "f16" or "bf16"."""
        o = lib.ct_hf_save_options_default()
        o.dtype = _DTYPES[dtype]
        if arch is not None:
            o.arch = {"llama": 1, "qwen2": 2, "mistral": 3}[arch]
        check(lib.ct_hf_save(self._m, self._hf.h if self._hf else None, cpath(path),
                             ctypes.byref(o)))

    def loss_and_grads(self, tokens):
        """(mean next-token cross-entropy, {name: gradient}) of tokens [B, T + 1]."""
        ids = self._ids(tokens, extra=1)
        B, T = ids.shape[0], ids.shape[1] - 1
        self._ensure(B, T)
        lib.ct_gpt_zero_grad(self._m)
        loss = ctypes.c_float()
        check(lib.ct_gpt_forward_backward(self._m, _vp(ids.data_ptr()), B, T, 1.0,
                                          ctypes.byref(loss)))
        return loss.value, {k: v.clone() for k, v in self._views(grads=True).items()}


class _LoraOptions(ctypes.Structure):
    _fields_ = [("rank", ctypes.c_int64), ("alpha", ctypes.c_float), ("targets", ctypes.c_uint32)]


lib.ct_lora_options_default.restype = _LoraOptions
lib.ct_lora_targets_parse.argtypes = [ctypes.c_char_p, _P(ctypes.c_uint32)]
lib.ct_lora_create.argtypes = [_vp, _P(_LoraOptions), ctypes.c_uint64, _P(_vp)]
lib.ct_lora_free.argtypes = [_vp]
lib.ct_lora_free.restype = None
lib.ct_lora_apply.argtypes = [_vp]
lib.ct_lora_backward.argtypes = [_vp]
lib.ct_lora_num_tensors.argtypes = [_vp]
lib.ct_lora_tensor.argtypes = [_vp, ctypes.c_int, _P(ctypes.c_char_p), _P(_Tensor), _P(_Tensor)]
lib.ct_lora_save.argtypes = [_vp, ctypes.c_char_p, ctypes.c_char_p]
lib.ct_lora_merge.argtypes = [_vp, ctypes.c_char_p, _P(ctypes.c_int)]


def _view(t):
    shape = tuple(t.shape[d] for d in range(t.ndim))
    n = 1
    for d in shape:
        n *= d
    return torch.frombuffer((ctypes.c_float * n).from_address(t.data), dtype=torch.float32).view(shape)


class Lora:
    """LoRA adapters on a Model (include/ctorch/model.h): the model's current weights become the
    frozen base. The model is sized for batch x seq tokens first and then keeps that size.

        lora = models.Lora(m, rank=4, alpha=8, targets="q,v", batch=2, seq=16)
        lora.set_weights({...PEFT names...}); lora.apply()      # weights = base + s B A
        loss, _ = m.loss_and_grads(tokens); g = lora.grads()     # d loss / d A, B
        lora.save("adapter-dir", base_model="path")
    """

    def __init__(self, model, rank=8, alpha=8.0, targets="q,v", seed=1, batch=1, seq=None):
        model._ensure(batch, seq or model.config["context"])
        model._pinned = True
        o = lib.ct_lora_options_default()
        o.rank, o.alpha = rank, alpha
        bits = ctypes.c_uint32()
        check(lib.ct_lora_targets_parse(cstr(targets, "ctorch.models.Lora: targets"),
                                         ctypes.byref(bits)))
        o.targets = bits.value
        h = _vp()
        check(lib.ct_lora_create(model._m, ctypes.byref(o), seed, ctypes.byref(h)))
        self._l, self.model = h, model

    def __del__(self):
        if getattr(self, "_l", None):
            lib.ct_lora_free(self._l)
            self._l = None

    def _views(self, grads=False):
        out = {}
        for i in range(lib.ct_lora_num_tensors(self._l)):
            name, p, g = ctypes.c_char_p(), _Tensor(), _Tensor()
            check(lib.ct_lora_tensor(self._l, i, ctypes.byref(name), ctypes.byref(p), ctypes.byref(g)))
            out[name.value.decode()] = _view(g if grads else p)
        return out

    def state_dict(self):
        return {k: v.clone() for k, v in self._views().items()}

    def set_weights(self, weights):
        views = self._views()
        for k, v in weights.items():
            views[k].copy_(torch.as_tensor(v, dtype=torch.float32))

    def apply(self):
        check(lib.ct_lora_apply(self._l))

    def grads(self):
        """The adapters' gradients from the model's last loss_and_grads."""
        check(lib.ct_lora_backward(self._l))
        return {k: v.clone() for k, v in self._views(grads=True).items()}

    def save(self, path, base_model=None):
        check(lib.ct_lora_save(self._l, cpath(path), cstr(base_model, "base_model") if base_model else None))


def _hf_tokens(m, hf_config):
    """bos/eos ids of a checkpoint converted from a HF directory (its "hf_config")."""
    m.eos_token_id = m.bos_token_id = None
    if not hf_config:
        return
    c = json.loads(hf_config) if isinstance(hf_config, str) else hf_config
    for key, attr in (("eos_token_id", "eos_token_id"), ("bos_token_id", "bos_token_id")):
        v = c.get(key)
        if isinstance(v, list):
            v = v[0] if v else None
        if isinstance(v, int) and 0 <= v < m.config["vocab_size"]:
            setattr(m, attr, v)


lib.ct_hf_config_parse.argtypes = [ctypes.c_char_p, ctypes.c_size_t, _P(_Config), _P(_HfInfo)]
lib.ct_gpt_load_state_dict.argtypes = [_vp, _vp]
lib.ct_gpt_state_dict_check.argtypes = [_vp, _P(_Config)]


def _read_config(config, path):
    """(ctorch config dict, bos, eos) of `config`: a dict, JSON text or a config.json path; a
    Hugging Face config.json (it has "architectures" or "model_type") is read by
    ct_hf_config_parse, anything else as a ctorch configuration."""
    if isinstance(config, (str, bytes, os.PathLike)) and not str(config).lstrip().startswith("{"):
        config = read_regular(config, "model configuration", 16 << 20).decode()
    d = json.loads(config) if isinstance(config, (str, bytes)) else dict(config)
    if "architectures" in d or "model_type" in d:
        text = json.dumps(d).encode()
        c, info = lib.ct_gpt_config_default(), _HfInfo()
        check(lib.ct_hf_config_parse(text, len(text), ctypes.byref(c), ctypes.byref(info)))
        return (_config_dict(c), info.bos_token if info.bos_token >= 0 else None,
                info.eos_token if info.eos_token >= 0 else None)
    return d, None, None


def _load_file(path, config):
    """A model from a ctorch checkpoint or any file ct_load reads (a torch.save state dict,
    safetensors) with a configuration (see load)."""
    from . import io
    with io.SafetensorsFile(path) as f:
        meta = f.metadata
        src = config
        if src is None:
            src = meta.get("config")
        beside = os.path.join(os.path.dirname(os.path.abspath(path)), "config.json")
        if src is None and os.path.isfile(beside):
            src = beside
        if src is None:
            raise ValueError(f"ctorch.models.load: {path} carries no configuration: pass "
                             "config= (a dict, JSON or a config.json path), store it in the file "
                             "under \"config\", or put config.json beside it")
        cfg, bos, eos = _read_config(src, path)
        # names, shapes and dtypes against the configuration before the model is allocated
        check(lib.ct_gpt_state_dict_check(f._h, ctypes.byref(_config_struct(cfg))))
        m = Model(cfg)
        # ctorch or Hugging Face names under one prefix, checked and converted by the library
        check(lib.ct_gpt_load_state_dict(m._m, f._h))
        if bos is None and eos is None:
            _hf_tokens(m, meta.get("hf_config"))
        else:
            m.bos_token_id, m.eos_token_id = bos, eos
        return m


def load(path, mmap=True, config=None):
    """A Model from a Hugging Face Llama-family directory (config.json + model.safetensors or
    shards), a ctorch checkpoint (.safetensors with the "config" metadata), or a PyTorch
    state dict (`torch.save`, .pt / .bin, read by ct_load without running the pickle; also
    a safetensors file) with a configuration: `config` (a dict, JSON text or a config.json
    path, Hugging Face's or ctorch's), else a "config" entry saved in the file (torch.save({
    "config": {...}, "model": state_dict})), else a config.json beside the file. Tensor names
    are ctorch's or Hugging Face's (model.layers.N.self_attn.q_proj.weight, ...), under one
    prefix ("model." for {"model": state_dict}).

    mmap (directories only): True (default) reads the weights in place from the mapped files,
    in their dtype (f32, bf16, f16; no copy, no parameter arrays: norm weights and biases in
    bf16 / f16 are converted; the model is inference-only: forward, generate, save_hf);
    False converts them into the model's own f32 buffers, so loss_and_grads, Lora and
    merge_lora work."""
    path = os.fspath(path)
    if os.path.isdir(path):
        if config is not None:
            raise ValueError("ctorch.models.load: a directory has its own config.json")
        hf = _HfDir(path)
        cfg = _config_dict(lib.ct_hf_get_config(hf.h).contents)
        m = Model(cfg, _hf=hf, _mapped=mmap)
        if not mmap:
            check(lib.ct_hf_load_params(hf.h, m._m))
        info = lib.ct_hf_get_info(hf.h).contents
        m.eos_token_id = info.eos_token if info.eos_token >= 0 else None
        m.bos_token_id = info.bos_token if info.bos_token >= 0 else None
        return m
    if os.path.isfile(path):
        return _load_file(path, config)
    raise ValueError(f"ctorch.models.load: {path} is neither a directory nor a file")


# The ctypes mirrors above match the C structs of the loaded library (or this import fails).
from ._lib import check_layouts as _check_layouts  # noqa: E402

_check_layouts({_Config: "ct_gpt_config", _Options: "ct_gpt_options", _Tensor: "ct_tensor", _HfInfo: "ct_hf_info", _HfSaveOptions: "ct_hf_save_options", _LoraOptions: "ct_lora_options"})
