#!/usr/bin/python3
"""Write the seed corpus of fuzz_fsdp_index: sharded checkpoint indexes (index.json of
`ctorch train --fsdp`), valid and hostile (bad ranges, traversal file names, wrong types).

Usage: /usr/bin/python3 tests/fuzz/make_fsdp_corpus.py OUT_DIR
"""
import json
import os
import sys


def index(tensors, world=2, **extra):
    d = {"format": "ctorch-sharded", "world_size": world, "step": 10, "mode": "fsdp",
         "metadata": {"format": "ctorch-gpt-shard", "config": "{\"n_layer\": 1}", "step": "10"},
         "tensors": tensors}
    d.update(extra)
    return d


def tensor(rows, cols, shards):
    return {"shape": [rows, cols] if cols else [rows], "dtype": "F32",
            "shards": [{"file": f, "begin": b, "end": e} for f, b, e in shards]}


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    ok = tensor(10, 4, [("model-00000-of-00002.safetensors", 0, 5),
                        ("model-00001-of-00002.safetensors", 5, 10)])
    seeds = {
        "valid": index({"tok_embeddings.weight": ok, "norm.weight": tensor(4, 0, [
            ("model-00000-of-00002.safetensors", 0, 2), ("model-00001-of-00002.safetensors", 2, 4)])}),
        "empty": index({}),
        "gap": index({"w": tensor(10, 4, [("a.safetensors", 0, 4), ("b.safetensors", 5, 10)])}),
        "overlap": index({"w": tensor(10, 4, [("a.safetensors", 0, 6), ("b.safetensors", 5, 10)])}),
        "past_end": index({"w": tensor(10, 4, [("a.safetensors", 0, 11)])}),
        "negative": index({"w": tensor(10, 4, [("a.safetensors", -1, 10)])}),
        "traversal": index({"w": tensor(2, 2, [("../../etc/passwd", 0, 2)])}),
        "dotdot": index({"w": tensor(2, 2, [("..", 0, 2)])}),
        "huge_shape": index({"w": tensor(1 << 62, 1 << 62, [("a.safetensors", 0, 1)])}),
        "bad_types": {"format": "ctorch-sharded", "world_size": "2", "tensors": [], "metadata": 1},
        "wrong_format": index({}, format="something-else"),
        "world_zero": index({}, world=0),
    }
    for name, d in seeds.items():
        with open(os.path.join(out, name + ".json"), "w") as f:
            json.dump(d, f)
    with open(os.path.join(out, "truncated.json"), "w") as f:
        f.write(json.dumps(seeds["valid"])[:77])
    with open(os.path.join(out, "duplicate_keys.json"), "w") as f:
        f.write('{"format": "ctorch-sharded", "format": "x", "world_size": 1, "tensors": {}, '
                '"metadata": {}}')


if __name__ == "__main__":
    main()
