#!/usr/bin/python3
"""Write the seed corpus of fuzz_checkpoint: tiny ctorch-gpt checkpoints (tied and untied,
f32 / bf16 / f8 tensors, with AdamW moments and trainer state) and hostile variants: a few-KB
file whose config describes gigabytes, shapes off by one, integer tensors, a missing moment,
a step past int64, an all-zero rng, accum past the cap.

Usage: /usr/bin/python3 tests/fuzz/make_checkpoint_corpus.py OUT_DIR
"""
import json
import os
import struct
import sys

ELEM = {"F32": 4, "BF16": 2, "F8_E4M3": 1, "I32": 4}


def tensors(cfg):
    """Names and shapes of the parameters, in the model's order (src/model/gpt.c)."""
    C, H, K, F = cfg["d_model"], cfg["n_head"], cfg["n_kv_head"], cfg["d_ff"]
    E = C // H
    out = [("tok_embeddings.weight", [cfg["vocab_size"], C])]
    if not cfg.get("tied", True):
        out.append(("output.weight", [cfg["vocab_size"], C]))
    for l in range(cfg["n_layer"]):
        p = f"layers.{l}."
        out += [(p + "attention.wq.weight", [H * E, C]), (p + "attention.wk.weight", [K * E, C]),
                (p + "attention.wv.weight", [K * E, C]), (p + "attention.wo.weight", [C, H * E]),
                (p + "feed_forward.w_gate_up.weight", [2 * F, C]), (p + "feed_forward.w_down.weight", [C, F])]
    for l in range(cfg["n_layer"]):
        out += [(f"layers.{l}.attention_norm.weight", [C]), (f"layers.{l}.ffn_norm.weight", [C])]
    return out + [("norm.weight", [C])]


def image(entries, meta):
    """A safetensors image of (name, dtype, shape) entries (data: a byte pattern)."""
    header, data = {"__metadata__": meta}, b""
    for name, dt, shape in entries:
        n = ELEM[dt]
        for s in shape:
            n *= s
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + n]}
        data += bytes((i * 37 + 11) & 0x3f for i in range(n))  # small finite values in every dtype
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


TINY = {"vocab_size": 8, "context": 4, "n_layer": 1, "d_model": 4, "n_head": 2, "n_kv_head": 1, "d_ff": 3}
TRAIN = {"batch": 1, "seq": 2, "steps": 3, "accum": 1, "eval_batches": 1}
STATE = {"step": "2", "epoch": "0", "data_pos": "4", "rng": "0123456789abcdef" * 4}


def checkpoint(cfg=TINY, dt="F32", moments=True, meta=None, drop=None, shape_fix=None, as_int=None):
    entries = []
    for name, shape in tensors(cfg):
        for prefix in ("", "optimizer.exp_avg.", "optimizer.exp_avg_sq.") if moments else ("",):
            nm = prefix + name
            if nm == drop:
                continue
            sh = list(shape)
            if nm == shape_fix:
                sh[0] += 1
            entries.append((nm, "I32" if nm == as_int else dt, sh))
    m = {"format": "ctorch-gpt", "config": json.dumps(cfg), "train": json.dumps(TRAIN), **STATE}
    m.update(meta or {})
    return image(entries, m)


def seeds():
    huge = dict(TINY, vocab_size=1 << 20, d_model=1024, n_head=8, n_kv_head=8, n_layer=64, d_ff=65536)
    yield "tiny", checkpoint()
    yield "untied", checkpoint(dict(TINY, tied=False, n_layer=2))
    yield "bf16", checkpoint(dt="BF16", moments=False)
    yield "f8", checkpoint(dt="F8_E4M3", moments=False)
    yield "huge-config", image([("tok_embeddings.weight", "F32", [2, 2])],
                               {"format": "ctorch-gpt", "config": json.dumps(huge)})
    yield "shape-off", checkpoint(shape_fix="layers.0.attention.wk.weight")
    yield "int-tensor", checkpoint(as_int="norm.weight")
    yield "missing-moment", checkpoint(drop="optimizer.exp_avg_sq.norm.weight")
    yield "step-past-int64", checkpoint(meta={"step": "9223372036854775808"})
    yield "rng-zero", checkpoint(meta={"rng": "0" * 64})
    yield "accum-2e40", checkpoint(meta={"train": json.dumps(dict(TRAIN, accum=1 << 40))})
    yield "not-gpt", checkpoint(meta={"format": "other"})


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, data in seeds():
        with open(os.path.join(out, name + ".safetensors"), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
