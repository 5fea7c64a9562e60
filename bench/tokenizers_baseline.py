#!/usr/bin/env python3
"""The baseline of `ctorch bench tokenizer`: Hugging Face `tokenizers` encoding the same text
with the same vocabulary, one thread, timed like the C side (a cold first encode, then the
median of repeats, wall and the process's CPU time), printed as one JSON object that names the
tokenizers version. Runnable by hand:

    .venv/bin/python bench/tokenizers_baseline.py --tokenizer build/test-deps/gpt2 --text FILE

--tokenizer is a tokenizer.json (or a folder holding one), or GPT-2's encoder.json + vocab.bpe
(either file, or their folder), as ctorch reads them.
"""
import argparse
import json
import os
import statistics
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def load(hf, path):
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, "tokenizer.json")):
        return hf.Tokenizer.from_file(os.path.join(path, "tokenizer.json")), "tokenizer.json"
    if os.path.isfile(path) and not path.endswith((".bpe", "encoder.json")):
        return hf.Tokenizer.from_file(path), "tokenizer.json"
    enc, bpe = os.path.join(folder, "encoder.json"), os.path.join(folder, "vocab.bpe")
    t = hf.Tokenizer(hf.models.BPE.from_file(enc, bpe))
    t.pre_tokenizer = hf.pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = hf.decoders.ByteLevel()
    t.add_special_tokens([hf.AddedToken("<|endoftext|>", special=True, normalized=False)])
    return t, "encoder.json + vocab.bpe"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--text", required=True, help="a UTF-8 text file")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    try:
        import tokenizers as hf
    except ImportError as e:
        print(json.dumps({"status": "not installed", "why": f"tokenizers: {e} (scripts/setup.sh --python)"}))
        return
    try:
        tok, layout = load(hf, a.tokenizer)
    except Exception as e:  # noqa: BLE001  (reported, not raised: the C side prints it)
        print(json.dumps({"status": "failed", "why": f"{a.tokenizer}: {e}"}))
        return
    with open(a.text, encoding="utf-8") as f:
        text = f.read()

    def run():
        return tok.encode(text, add_special_tokens=False).ids

    t0 = time.perf_counter()
    ids = run()
    cold = time.perf_counter() - t0
    wall, cpu = [], []
    for _ in range(max(1, a.repeats)):
        t0, c0 = time.perf_counter(), time.process_time()
        run()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    print(json.dumps({
        "status": "ok", "library": "tokenizers", "tokenizers_version": hf.__version__, "layout": layout,
        "bytes": len(text.encode("utf-8")), "tokens": len(ids), "cold_s": cold,
        "median_s": statistics.median(wall), "cpu_median_s": statistics.median(cpu),
        "min_s": min(wall), "max_s": max(wall), "repeats": len(wall)}))


if __name__ == "__main__":
    main()
