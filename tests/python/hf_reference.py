"""The Hugging Face oracles of the model tests: tiny random Llama / Qwen2 / Mistral models built
by transformers 5.25 (LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM) from small
configurations, saved with save_pretrained (one file or shards, f32 / bf16 / f16), and their
logits, losses, gradients and greedy generation computed by transformers itself; LoRA adapters
made, saved, loaded and merged by peft 0.21. Nothing here re-implements a model.

    cfg = llama_config(...)                 # a config dict (the keys of config.json)
    w = random_weights(cfg, seed)           # {HF tensor name: f32 tensor}
    m = hf_model(cfg, w)                    # the transformers model holding w (f32, eager)
    logits(m, ids); loss(m, tokens)         # [B, T, V]; HF's own causal-LM loss
    greedy(m, ids, n)                       # m.generate(do_sample=False), no EOS stop
    save_hf(dir, cfg, w, dtype, shards)     # save_pretrained (max_shard_size for shards)
    load(dir)                               # AutoModelForCausalLM.from_pretrained, in f32

The name mapping ctorch's reader does in C (ctorch_config, to_ctorch, grads_to_hf) is kept to
build models.Model instances from the same weights.
"""
import copy
import json
import os

# no network, ever: configurations are built here and models come from local directories
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import peft  # noqa: E402
import safetensors.torch  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import (AutoModelForCausalLM, LlamaConfig, MistralConfig,  # noqa: E402
                          Qwen2Config)

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()
assert transformers.__version__ == "5.25.0", transformers.__version__
assert peft.__version__ == "0.21.2", peft.__version__

ATTN = "eager"  # the reference attention: softmax(q k^T / sqrt(E) + mask) v in f32


def llama_config(**kw):
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32,
         "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 8, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
         "rope_scaling": None, "max_position_embeddings": 64, "tie_word_embeddings": False,
         "vocab_size": 96, "attention_bias": False, "hidden_act": "silu", "bos_token_id": 1,
         "eos_token_id": 2}
    c.update(kw)
    return c


def qwen2_config(**kw):
    c = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 32,
         "intermediate_size": 40, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 1, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
         "rope_scaling": None, "max_position_embeddings": 64, "tie_word_embeddings": True,
         "vocab_size": 80, "hidden_act": "silu", "use_sliding_window": False,
         "sliding_window": None, "max_window_layers": 2, "bos_token_id": 1, "eos_token_id": 2}
    c.update(kw)
    return c


def mistral_config(**kw):
    c = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 32,
         "intermediate_size": 56, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 8, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
         "max_position_embeddings": 64, "tie_word_embeddings": False, "vocab_size": 88,
         "hidden_act": "silu", "sliding_window": None, "bos_token_id": 1, "eos_token_id": 2}
    c.update(kw)
    return c


_CONFIGS = {"llama": LlamaConfig, "qwen2": Qwen2Config, "mistral": MistralConfig}


def head_dim(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def has_qkv_bias(cfg):
    return cfg["model_type"] == "qwen2" or bool(cfg.get("attention_bias"))


def has_o_bias(cfg):
    return cfg["model_type"] != "qwen2" and bool(cfg.get("attention_bias"))


def hf_config(cfg):
    """The transformers configuration object of a config dict (its own constructor: rope_scaling
    and rope_theta become transformers 5's rope_parameters)."""
    kw = {k: copy.deepcopy(v) for k, v in cfg.items()  # transformers rewrites what it is given
          if k not in ("architectures", "model_type", "torch_dtype", "dtype")}
    c = _CONFIGS[cfg["model_type"]](**kw)
    c.architectures = list(cfg["architectures"])
    return c


def random_weights(cfg, seed=0, std=0.2):
    """{HF name: f32 tensor}: every tensor of the model, normal(0, std) (norm weights 1 + that),
    so biases and norms are nonzero and logits vary."""
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


def hf_model(cfg, w, dtype=torch.float32):
    """The transformers model of cfg holding the weights w (every one of them, strictly)."""
    m = AutoModelForCausalLM.from_config(hf_config(cfg), attn_implementation=ATTN, dtype=torch.float32)
    sd = {k: v.detach().clone() for k, v in w.items()}
    if cfg["tie_word_embeddings"]:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    m.load_state_dict(sd, strict=True)
    if cfg["tie_word_embeddings"]:
        assert m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr()
    return m.to(dtype).eval()


def load(d, dtype=torch.float32):
    """A directory (HF's or one ctorch wrote) through transformers, its weights widened to f32."""
    return AutoModelForCausalLM.from_pretrained(str(d), dtype=dtype, attn_implementation=ATTN).eval()


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def loss(model, tokens):
    """transformers' own causal-LM loss of tokens [B, T + 1] (mean next-token cross-entropy),
    differentiable in the model's parameters."""
    return model(input_ids=tokens, labels=tokens).loss


def grads(model):
    """{HF name: gradient} of every parameter (a tied head is the embedding's)."""
    return {k: p.grad for k, p in model.named_parameters() if p.grad is not None}


def greedy(model, ids, n):
    """transformers' generate(do_sample=False) for n new tokens, never stopping at EOS."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices, many steps: threads only add waiting
    try:
        with torch.no_grad():
            return model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                  eos_token_id=None, pad_token_id=0, attention_mask=torch.ones_like(ids))
    finally:
        torch.set_num_threads(threads)


def save_hf(d, cfg, w, dtype=torch.float32, shards=1):
    """save_pretrained of the model holding w, in dtype: model.safetensors, or (shards > 1) about
    that many files (max_shard_size) with model.safetensors.index.json."""
    m = hf_model(cfg, w, dtype)
    kw = {}
    if shards > 1:
        total = sum(v.numel() for v in w.values()) * torch.finfo(dtype).bits // 8
        kw["max_shard_size"] = max(total // shards + 1, 1)
    m.save_pretrained(str(d), **kw)
    names = [f for f in os.listdir(d) if f.endswith(".safetensors")]
    assert (len(names) > 1) == (shards > 1), names
    return m


def write_safetensors(path, tensors, metadata=None):
    """A plain safetensors file (the safetensors library's writer)."""
    safetensors.torch.save_file({k: v.detach().clone().contiguous() for k, v in tensors.items()}, str(path),
                                metadata=metadata)


# ---- LoRA through peft ------------------------------------------------------------------------

MODULES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj",
           "up": "up_proj", "down": "down_proj"}


def peft_model(model, rank, alpha, targets, seed=0, std=0.3):
    """get_peft_model on a transformers model (targets "q,v,..."), every lora_A and lora_B set to
    normal(0, std) (lora_B nonzero, unlike PEFT's initialisation, so the adapters matter)."""
    cfg = peft.LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, bias="none",
                          task_type="CAUSAL_LM", target_modules=[MODULES[t] for t in targets.split(",")])
    pm = peft.get_peft_model(model, cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for k, p in pm.named_parameters():
            if "lora_" in k:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    return pm.eval()


def peft_state_dict(pm):
    """The adapter tensors under the names PEFT saves them (as adapter_model.safetensors)."""
    return {k: v.detach().clone() for k, v in peft.get_peft_model_state_dict(pm).items()}


def set_peft_state_dict(pm, sd):
    r = peft.set_peft_model_state_dict(pm, sd)
    assert not r.unexpected_keys, r.unexpected_keys


def peft_grads(pm):
    """{PEFT saved name: gradient} of the adapters."""
    return {k.replace(".default.weight", ".weight"): p.grad for k, p in pm.named_parameters()
            if "lora_" in k and p.grad is not None}


def load_adapter(model, adapter_dir):
    """PeftModel.from_pretrained of an adapter directory on a transformers base model."""
    return peft.PeftModel.from_pretrained(model, str(adapter_dir)).eval()


# ---- HF names <-> ctorch names (what ctorch's own reader does in C) -------------------------

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


def config_dict(d):
    return json.load(open(os.path.join(d, "config.json")))
