"""Tiny random Hugging Face Llama-family models in PyTorch 1.13, with the reference forward
written from the Hugging Face modeling definitions (LlamaForCausalLM / Qwen2ForCausalLM):
RMSNorm in f32 (x * rsqrt(mean(x^2) + eps) * weight), rotate_half RoPE with the default,
linear and llama3 inverse frequencies (modeling_rope_utils), repeat_kv for grouped-query
attention, softmax(q k^T / sqrt(head_dim) + causal mask) v, SwiGLU MLP, lm_head (tied or not).

    cfg = llama_config(...)            # a config.json dict
    w = random_weights(cfg, seed)      # {HF tensor name: f32 tensor}
    logits = forward(cfg, w, ids)      # [B, T, V]
    save_hf(dir, cfg, w, dtype=torch.float32, shards=1)   # config.json + model.safetensors
"""
import json
import math
import os
import struct

import torch
import torch.nn.functional as F


def llama_config(**kw):
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32,
         "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 8, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
         "rope_scaling": None, "max_position_embeddings": 64, "tie_word_embeddings": False,
         "vocab_size": 96, "torch_dtype": "float32", "attention_bias": False,
         "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2}
    c.update(kw)
    return c


def qwen2_config(**kw):
    c = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 32,
         "intermediate_size": 40, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 1, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
         "rope_scaling": None, "max_position_embeddings": 64, "tie_word_embeddings": True,
         "vocab_size": 80, "torch_dtype": "float32", "hidden_act": "silu",
         "use_sliding_window": False, "sliding_window": 64, "max_window_layers": 2,
         "bos_token_id": 1, "eos_token_id": 2}
    c.update(kw)
    return c


def head_dim(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def has_qkv_bias(cfg):
    return cfg["model_type"] == "qwen2" or bool(cfg.get("attention_bias"))


def has_o_bias(cfg):
    return cfg["model_type"] != "qwen2" and bool(cfg.get("attention_bias"))


def random_weights(cfg, seed=0, std=0.2):
    g = torch.Generator().manual_seed(seed)
    C, F_, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    H, K, E = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim(cfg)

    def rnd(*s):
        return torch.randn(*s, generator=g) * std

    w = {"model.embed_tokens.weight": rnd(V, C)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = 1 + rnd(C)
        w[p + "post_attention_layernorm.weight"] = 1 + rnd(C)
        w[p + "self_attn.q_proj.weight"] = rnd(H * E, C)
        w[p + "self_attn.k_proj.weight"] = rnd(K * E, C)
        w[p + "self_attn.v_proj.weight"] = rnd(K * E, C)
        w[p + "self_attn.o_proj.weight"] = rnd(C, H * E)
        if has_qkv_bias(cfg):
            w[p + "self_attn.q_proj.bias"] = rnd(H * E)
            w[p + "self_attn.k_proj.bias"] = rnd(K * E)
            w[p + "self_attn.v_proj.bias"] = rnd(K * E)
        if has_o_bias(cfg):
            w[p + "self_attn.o_proj.bias"] = rnd(C)
        w[p + "mlp.gate_proj.weight"] = rnd(F_, C)
        w[p + "mlp.up_proj.weight"] = rnd(F_, C)
        w[p + "mlp.down_proj.weight"] = rnd(C, F_)
    w["model.norm.weight"] = 1 + rnd(C)
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = rnd(V, C)
    return w


def inv_freq(cfg):
    """modeling_rope_utils: default, linear and llama3 inverse frequencies."""
    E = head_dim(cfg)
    base = cfg["rope_theta"]
    inv = 1.0 / (base ** (torch.arange(0, E, 2, dtype=torch.int64).float() / E))
    rs = cfg.get("rope_scaling")
    if not rs:
        return inv
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "linear":
        return inv / rs["factor"]
    assert kind == "llama3", kind
    factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old = rs["original_max_position_embeddings"]
    low_wave, high_wave = old / low, old / high
    wavelen = 2 * math.pi / inv
    inv_l = torch.where(wavelen > low_wave, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
    medium = ~(wavelen < high_wave) * ~(wavelen > low_wave)
    return torch.where(medium, smoothed, inv_l)


def rmsnorm(x, w, eps):
    dt = x.dtype
    x = x.to(torch.float32)
    var = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(var + eps)
    return w * x.to(dt)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(x, n_rep):
    b, kv, t, e = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, kv, n_rep, t, e).reshape(b, kv * n_rep, t, e)


def forward(cfg, w, ids, lora=None, scale=1.0):
    """Logits [B, T, V] of ids [B, T] (int64), differentiable in w. lora: {HF module name (e.g.
    "model.layers.0.self_attn.q_proj"): (A [r, in], B [out, r])} applied as PEFT does:
    x W^T + b + scale (x A^T) B^T."""
    lora = lora or {}

    def lin(x, name, bias=None):
        y = F.linear(x, w[name + ".weight"], w.get(name + ".bias") if bias is None else bias)
        if name in lora:
            a, b = lora[name]
            y = y + scale * F.linear(F.linear(x, a), b)
        return y

    B, T = ids.shape
    C = cfg["hidden_size"]
    H, K, E = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim(cfg)
    eps = cfg["rms_norm_eps"]
    pos = torch.arange(T)[None].float()
    freqs = (inv_freq(cfg)[None, :, None].float() @ pos[:, None, :]).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[:, None], emb.sin()[:, None]  # [1, 1, T, E]
    mask = torch.full((T, T), float("-inf")).triu(1)
    h = F.embedding(ids, w["model.embed_tokens.weight"])
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = rmsnorm(h, w[p + "input_layernorm.weight"], eps)
        q = lin(x, p + "self_attn.q_proj")
        k = lin(x, p + "self_attn.k_proj")
        v = lin(x, p + "self_attn.v_proj")
        q = q.view(B, T, H, E).transpose(1, 2)
        k = k.view(B, T, K, E).transpose(1, 2)
        v = v.view(B, T, K, E).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, H // K), repeat_kv(v, H // K)
        att = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(E) + mask
        att = F.softmax(att, dim=-1, dtype=torch.float32).to(q.dtype)
        o = torch.matmul(att, v).transpose(1, 2).reshape(B, T, H * E)
        h = h + lin(o, p + "self_attn.o_proj")
        x = rmsnorm(h, w[p + "post_attention_layernorm.weight"], eps)
        m = F.silu(lin(x, p + "mlp.gate_proj")) * lin(x, p + "mlp.up_proj")
        h = h + lin(m, p + "mlp.down_proj")
    h = rmsnorm(h, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else w["lm_head.weight"]
    return F.linear(h, head)


def loss(cfg, w, tokens, lora=None, scale=1.0):
    """Mean next-token cross-entropy of tokens [B, T + 1]."""
    logits = forward(cfg, w, tokens[:, :-1], lora, scale)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


# ---- writing the Hugging Face layout (a plain safetensors writer, independent of ctorch) ----

_ST = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}


def write_safetensors(path, tensors, metadata=None):
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        t = t.contiguous()
        if t.dtype == torch.bfloat16:
            raw = t.view(torch.int16).numpy().tobytes()
        else:
            raw = t.numpy().tobytes()
        header[name] = {"dtype": _ST[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def save_hf(d, cfg, w, dtype=torch.float32, shards=1):
    """config.json and model.safetensors, or `shards` files with model.safetensors.index.json."""
    os.makedirs(d, exist_ok=True)
    cfg = dict(cfg)
    cfg["torch_dtype"] = {torch.float32: "float32", torch.float16: "float16",
                          torch.bfloat16: "bfloat16"}[dtype]
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    ws = {k: v.detach().to(dtype) for k, v in w.items()}
    if shards == 1:
        write_safetensors(os.path.join(d, "model.safetensors"), ws, {"format": "pt"})
        return
    names = list(ws)
    per = -(-len(names) // shards)
    wmap, total = {}, 0
    for s in range(shards):
        fn = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: ws[k] for k in names[s * per:(s + 1) * per]}
        write_safetensors(os.path.join(d, fn), part, {"format": "pt"})
        for k, v in part.items():
            wmap[k] = fn
            total += v.numel() * v.element_size()
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wmap}, f, indent=2)


# ---- HF names <-> ctorch names (what ctorch's own reader does in C; used before it exists) ----

def ctorch_config(cfg):
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type", "none")) if rs else "none"
    c = {"vocab_size": cfg["vocab_size"], "context": cfg["max_position_embeddings"],
         "n_layer": cfg["num_hidden_layers"], "d_model": cfg["hidden_size"],
         "n_head": cfg["num_attention_heads"], "n_kv_head": cfg["num_key_value_heads"],
         "d_ff": cfg["intermediate_size"], "rope_base": cfg["rope_theta"],
         "tied": cfg["tie_word_embeddings"], "norm_eps": cfg["rms_norm_eps"],
         "head_dim": head_dim(cfg), "qkv_bias": has_qkv_bias(cfg), "o_bias": has_o_bias(cfg),
         "rope_scaling": kind}
    if kind != "none":
        c["rope_factor"] = rs["factor"]
    if kind == "llama3":
        c.update(rope_low_freq_factor=rs["low_freq_factor"], rope_high_freq_factor=rs["high_freq_factor"],
                 rope_original_context=rs["original_max_position_embeddings"])
    return c


_LAYER = {"input_layernorm.weight": "attention_norm.weight",
          "post_attention_layernorm.weight": "ffn_norm.weight",
          "self_attn.q_proj.weight": "attention.wq.weight", "self_attn.k_proj.weight": "attention.wk.weight",
          "self_attn.v_proj.weight": "attention.wv.weight", "self_attn.o_proj.weight": "attention.wo.weight",
          "self_attn.q_proj.bias": "attention.wq.bias", "self_attn.k_proj.bias": "attention.wk.bias",
          "self_attn.v_proj.bias": "attention.wv.bias", "self_attn.o_proj.bias": "attention.wo.bias",
          "mlp.down_proj.weight": "feed_forward.w_down.weight"}


def to_ctorch(cfg, w):
    out = {"tok_embeddings.weight": w["model.embed_tokens.weight"], "norm.weight": w["model.norm.weight"]}
    if not cfg["tie_word_embeddings"]:
        out["output.weight"] = w["lm_head.weight"]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for hf, ct in _LAYER.items():
            if p + hf in w:
                out[f"layers.{i}.{ct}"] = w[p + hf]
        out[f"layers.{i}.feed_forward.w_gate_up.weight"] = torch.cat(
            (w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]), 0)
    return out


def grads_to_hf(cfg, g):
    """ctorch-named gradients -> HF names (gate/up split back)."""
    out = {"model.embed_tokens.weight": g["tok_embeddings.weight"], "model.norm.weight": g["norm.weight"]}
    if not cfg["tie_word_embeddings"]:
        out["lm_head.weight"] = g["output.weight"]
    F_ = cfg["intermediate_size"]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for hf, ct in _LAYER.items():
            if f"layers.{i}.{ct}" in g:
                out[p + hf] = g[f"layers.{i}.{ct}"]
        gu = g[f"layers.{i}.feed_forward.w_gate_up.weight"]
        out[p + "mlp.gate_proj.weight"], out[p + "mlp.up_proj.weight"] = gu[:F_], gu[F_:]
    return out
