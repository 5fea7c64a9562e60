"""Seeds for fuzz_state_dict: state dicts of fuzz_state_dict.c's two tiny models (tied with
q/k/v biases, untied without) under ctorch and Hugging Face names, bare or under a prefix, in
f32 and bf16, as safetensors and torch.save files, plus hostile variants (a foreign tensor, a
missing one, a wrong shape, a tied lm_head that differs).

    python3 tests/fuzz/make_state_dict_corpus.py OUT_DIR
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import hf_reference as ref  # noqa: E402


def configs():
    common = dict(hidden_size=8, intermediate_size=4, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=4, vocab_size=16, max_position_embeddings=8)
    yield "tied", ref.qwen2_config(**common)              # tied, q/k/v biases
    yield "untied", ref.llama_config(**common)            # untied, no biases


def main(out):
    os.makedirs(out, exist_ok=True)
    n = 0
    for tag, cfg in configs():
        w = {k: v.detach() for k, v in ref.random_weights(cfg, seed=1).items()}
        ct = {k: v.detach() for k, v in ref.to_ctorch(cfg, w).items()}
        cases = {
            "hf": w, "ct": ct,
            "hf-prefix": {"model." + k: v for k, v in w.items()},
            "hf-bf16": {k: v.to(torch.bfloat16) for k, v in w.items()},
            "hf-foreign": dict(w, **{"model.layers.0.mlp.frob.weight": torch.ones(2)}),
            "hf-missing": {k: v for k, v in w.items() if k != "model.norm.weight"},
            "ct-shape": dict(ct, **{"norm.weight": torch.ones(3)}),
            "hf-invfreq": dict(w, **{"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(2)}),
        }
        if cfg["tie_word_embeddings"]:
            cases["hf-tied-head"] = dict(w, **{"lm_head.weight": w["model.embed_tokens.weight"]})
            cases["hf-tied-differs"] = dict(w, **{"lm_head.weight": w["model.embed_tokens.weight"] + 1})
        for name, sd in cases.items():
            ref.write_safetensors(os.path.join(out, f"{tag}-{name}.safetensors"), sd)
            torch.save({"model": sd} if "prefix" not in name else sd, os.path.join(out, f"{tag}-{name}.pt"))
            n += 2
    print(f"wrote {n} seeds to {out}")


if __name__ == "__main__":
    main(sys.argv[1])
