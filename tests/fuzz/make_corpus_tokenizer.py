#!/usr/bin/python3
"""Write the seed corpus of fuzz_tokenizer: small tokenizer files of every format, valid (v-*)
and hostile (h-*), each prefixed by the reader byte (0: JSON, 1: GPT-2 pair split at a NUL).

Usage: /usr/bin/python3 tests/fuzz/make_corpus_tokenizer.py OUT_DIR
"""
import json
import os
import sys

LLAMA3 = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
          "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
QWEN2 = LLAMA3.replace("\\p{N}{1,3}", "\\p{N}")


def byte_char(b):
    if 33 <= b <= 126 or 161 <= b <= 172 or b >= 174:
        return chr(b)
    n = b if b <= 32 else 33 + b - 127 if b <= 160 else 67
    return chr(256 + n)


def vocab():
    v = {byte_char(b): b for b in range(256)}
    extra = ["he", "ll", "llo", "\u0120w", "or", "\u0120wor", "ld", "\u0120t", "he", "\u0120the"]
    for e in extra:
        if e not in v:
            v[e] = len(v)
    return v


MERGES = ["h e", "l l", "ll o", "\u0120 w", "o r", "\u0120w or", "l d", "\u0120 t", "\u0120t he"]


def hf(pre, merges_as_lists=False, **extra):
    v = vocab()
    tok = {"version": "1.0", "normalizer": None, "pre_tokenizer": pre,
           "added_tokens": [{"id": len(v), "content": "<s>", "special": True},
                            {"id": len(v) + 1, "content": "<|endoftext|>", "special": True}],
           "decoder": {"type": "ByteLevel"},
           "model": {"type": "BPE", "vocab": v,
                     "merges": [m.split(" ") for m in MERGES] if merges_as_lists else MERGES}}
    tok.update(extra)
    return tok


def split(pattern):
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]}


def doubling(n):
    merges = [[65, 65]] + [[255 + i, 255 + i] for i in range(1, n)]
    return {"format": "ctorch-bpe", "version": 1, "vocab_size": 257 + n, "eos": "<|endoftext|>",
            "merges": merges}


def j(obj):
    return b"\0" + json.dumps(obj, ensure_ascii=False).encode()


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    bl = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}
    c = {
        "v-ctorch": j({"format": "ctorch-bpe", "version": 1, "vocab_size": 260, "eos": "<|endoftext|>",
                       "merges": [[104, 101], [256, 108], [257, 111]]}),
        "v-ctorch-empty": j({"format": "ctorch-bpe", "version": 1, "vocab_size": 257, "merges": []}),
        "v-hf-gpt2": j(hf(bl)),
        "v-hf-llama3": j(hf(split(LLAMA3), True, post_processor={
            "type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                                     {"Sequence": {"id": "A", "type_id": 0}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [len(vocab())], "tokens": ["<s>"]}}})),
        "v-hf-qwen2-nfc": j(hf(split(QWEN2), normalizer={"type": "NFC"})),
        "v-hf-no-regex": j(hf(dict(bl, use_regex=False))),
        "h-doubling-63": j(doubling(63)),
        "h-doubling-33": j(doubling(33)),
        "h-hf-bad-regex": j(hf(split("\\w+"))),
        "h-hf-gap": j(dict(hf(bl), added_tokens=[{"id": 9999, "content": "<s>"}])),
        "h-hf-merge": j(dict(hf(bl), model=dict(hf(bl)["model"], merges=["h x"]))),
        "h-not-json": b"\0{\"model\": ",
    }
    v = vocab()
    enc = json.dumps(dict(v, **{"<|endoftext|>": len(v)}), ensure_ascii=False).encode()
    bpe = ("#version: 0.2\n" + "\n".join(MERGES) + "\n").encode()
    c["v-gpt2-pair"] = b"\1" + enc + b"\0" + bpe
    c["h-gpt2-bad-line"] = b"\1" + enc + b"\0" + b"#version: 0.2\nh e l\n"
    for name, data in c.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
