#!/usr/bin/python3
"""Write the seed corpus of the Hugging Face fuzz targets: config.json files of the supported
architectures (Llama 3 with llama3 rope_scaling, Qwen2, Mistral, SmolLM-like) and hostile
variants, or model.safetensors.index.json files, valid and hostile.

Usage: /usr/bin/python3 tests/fuzz/make_hf_corpus.py fuzz_hf_config|fuzz_hf_index|fuzz_hf_adapter OUT_DIR
"""
import json
import os
import sys

LLAMA3 = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
          "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
          "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
          "max_position_embeddings": 131072, "tie_word_embeddings": True, "vocab_size": 128256,
          "torch_dtype": "bfloat16", "attention_bias": False, "attention_dropout": 0.0,
          "hidden_act": "silu", "mlp_bias": False, "bos_token_id": 128000,
          "eos_token_id": [128001, 128008, 128009], "pretraining_tp": 1, "use_cache": True,
          "initializer_range": 0.02, "transformers_version": "4.43.0"}
QWEN2 = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
         "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
         "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
         "max_position_embeddings": 32768, "tie_word_embeddings": True, "vocab_size": 151936,
         "torch_dtype": "bfloat16", "use_sliding_window": False, "sliding_window": 32768,
         "max_window_layers": 21, "hidden_act": "silu", "bos_token_id": 151643,
         "eos_token_id": 151643, "attention_dropout": 0.0}
MISTRAL = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
           "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
           "max_position_embeddings": 32768, "sliding_window": None, "tie_word_embeddings": False,
           "vocab_size": 32768, "torch_dtype": "bfloat16", "hidden_act": "silu"}
SMOL = {"architectures": ["LlamaForCausalLM"], "hidden_size": 576, "intermediate_size": 1536,
        "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
        "max_position_embeddings": 8192, "rope_scaling": {"type": "linear", "factor": 2.0},
        "vocab_size": 49152, "tie_word_embeddings": True, "rope_theta": 100000}


def v5(c):
    """The same configuration as transformers 5 writes it: dtype, rope_parameters (rope_theta
    inside), layer_types for Qwen2."""
    c = dict(c)
    rp = dict(c.pop("rope_scaling", None) or {"rope_type": "default"})
    rp["rope_theta"] = c.pop("rope_theta", 10000.0)
    rp["rope_type"] = rp.pop("type", rp.get("rope_type"))
    c["rope_parameters"] = rp
    c["dtype"] = c.pop("torch_dtype", "float32")
    if c.get("model_type") == "qwen2":
        c["layer_types"] = ["full_attention"] * c["num_hidden_layers"]
    c["transformers_version"] = "5.25.0"
    return c


def configs():
    out = {"llama3": LLAMA3, "qwen2": QWEN2, "mistral": MISTRAL, "smol": SMOL,
           "llama3-v5": v5(LLAMA3), "qwen2-v5": v5(QWEN2), "mistral-v5": v5(MISTRAL),
           "mistral-v01": dict(MISTRAL, sliding_window=4096, rope_theta=10000.0),
           "qwen2-window": dict(QWEN2, use_sliding_window=True, max_window_layers=0),
           "h-qwen2-mixed": dict(QWEN2, use_sliding_window=True),
           "h-mistral-window1": dict(MISTRAL, sliding_window=1)}
    bad = [("arch", {"architectures": ["GPT2LMHeadModel"]}), ("yarn", {"rope_scaling": {"rope_type": "yarn", "factor": 4}}),
           ("neg", {"hidden_size": -1}), ("huge", {"vocab_size": 2 ** 62}), ("odd_head", {"head_dim": 7}),
           ("kv", {"num_key_value_heads": 3}), ("unknown", {"foo": 1}), ("eps", {"rms_norm_eps": 0}),
           ("lohi", {"rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 4,
                                      "high_freq_factor": 4, "original_max_position_embeddings": 1}}),
           ("bigint", {"pad_token_id": 2 ** 80}), ("bigint-size", {"hidden_size": 2 ** 80}),
           ("sliding", {"layer_types": ["full_attention", "sliding_attention"]}),
           ("rp-yarn", {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}})]
    for name, patch in bad:
        c = dict(LLAMA3)
        c.update(patch)
        out["h-" + name] = c
    return {k: json.dumps(v).encode() for k, v in out.items()} | {"h-text": b"{\"hidden_size\": ", "h-list": b"[1,2]"}


def indexes():
    wm = {f"model.layers.{i}.mlp.up_proj.weight": f"model-0000{i % 3 + 1}-of-00003.safetensors" for i in range(6)}
    out = {"valid": {"metadata": {"total_size": 123}, "weight_map": wm},
           "h-slash": {"weight_map": {"a": "../x.safetensors"}}, "h-dot": {"weight_map": {"a": ".x.safetensors"}},
           "h-ext": {"weight_map": {"a": "x.bin"}}, "h-empty": {"weight_map": {}}, "h-key": {"weight_map": wm, "x": 1},
           "h-type": {"weight_map": {"a": 1}}, "h-meta": {"metadata": [], "weight_map": wm}}
    return {k: json.dumps(v).encode() for k, v in out.items()} | {"h-dup": b'{"weight_map": {"a": "x.safetensors", "a": "y.safetensors"}}'}


def adapters():
    ok = {"base_model_name_or_path": "m", "bias": "none", "fan_in_fan_out": False, "inference_mode": True,
          "init_lora_weights": True, "lora_alpha": 16, "lora_dropout": 0.05, "modules_to_save": None,
          "peft_type": "LORA", "r": 8, "rank_pattern": {}, "alpha_pattern": {}, "use_rslora": False,
          "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
          "task_type": "CAUSAL_LM", "use_dora": False}
    out = {"valid": ok}
    for name, patch in [("dora", {"use_dora": True}), ("regex", {"target_modules": "q_proj"}), ("r0", {"r": 0}),
                        ("alpha", {"lora_alpha": -1}), ("bias", {"bias": "all"}), ("key", {"x": 1}),
                        ("rank_pattern", {"rank_pattern": {"q": 2}}), ("rslora", {"use_rslora": True})]:
        c = dict(ok)
        c.update(patch)
        out["h-" + name] = c
    return {k: json.dumps(v).encode() for k, v in out.items()}


def main():
    target, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    seeds = {"fuzz_hf_config": configs, "fuzz_hf_index": indexes, "fuzz_hf_adapter": adapters}[target]()
    for name, data in seeds.items():
        with open(os.path.join(out, name + ".json"), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
