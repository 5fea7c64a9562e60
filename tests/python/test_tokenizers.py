"""Tokenizers through the CLI and the Python binding: hostile tokenizer files and checkpoint
metadata give errors, never crashes; bad arguments fail with a message; real GPT-2, Llama 3 and
Qwen2 vocabularies give Hugging Face tokenizers' ids and text."""
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


# ---- real tokenizers against Hugging Face tokenizers -------------------------------------------
# The vocabularies are real ones that PyPI packages ship (GPT-2's from openai-whisper, Llama 3's
# from llama-models, Qwen's from dashscope), fetched and turned into encoder.json + vocab.bpe and
# tokenizer.json files by scripts/fetch_test_deps.sh (scripts/test.sh runs it) into
# build/test-deps. The oracle is Hugging Face `tokenizers` reading the same files: ctorch's ids
# (the Python binding and `ctorch tokenizer encode`) and its decoded text must equal its own on
# licence texts, this repository's docs and generated multilingual text.
import functools  # noqa: E402
import glob  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import unicodedata  # noqa: E402

import pytest  # noqa: E402
import tokenizers as hf  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "python"))
import ctorch.tokenizers as ctt  # noqa: E402

assert hf.__version__ == "0.23.3", f"the oracle is tokenizers 0.23.3 (scripts/requirements-test.txt), not {hf.__version__}"
DEPS = os.environ.get("CTORCH_TEST_DEPS", os.path.join(ROOT, "build", "test-deps"))
STYLES = {"gpt2": "gpt2-hf", "llama3": "llama3", "qwen2": "qwen2"}

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
    "<|begin_of_text|>x<|im_start|>user\nhi<|im_end|>\n<|eot_id|><|end_of_text|><|endof",
    "a" * 300, " " * 500 + "x", "ab" * 200 + " " + "\n" * 70, "x\u0085y", "\x00\x07\x7f\x1b[0m",
    "\ufeffBOM \u200bzero\u200cwidth \u2028line\u2029para \x0bvt\x0cff", " \n \r\n\t \n",
    # letters and digits newer than Python's Unicode (the library's regex engine has Unicode 16.0):
    # Kaktovik numerals (15.0), CJK extension H (15.0), Garay digits, Tje, Todhri (16.0)
    "a\U0001d2c0b \U0001d2c0\U0001d2c01 \U0001d2c0 \U0001d2c1\U0001d2c2\U0001d2c3\U0001d2c4",
    "x\U00031350\U00031351y \U00010d40\U00010d41\U00010d42\U00010d43 \u1c89\u1c8a a\U000105c0b",
]


def dep(*parts):
    p = os.path.join(DEPS, *parts)
    assert os.path.isfile(p), f"{p} is missing: run bash scripts/fetch_test_deps.sh (scripts/test.sh does)"
    return p


def license_texts():
    files = sorted(f for f in glob.glob("/usr/share/common-licenses/*") if os.path.isfile(f))
    assert files, "no /usr/share/common-licenses texts"
    return [open(f, encoding="utf-8").read() for f in files]


def doc_texts():
    files = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    assert files, "no docs/*.md"
    return [open(f, encoding="utf-8").read() for f in files]


def _words(r):
    """Generators of one 'word' each: scripts, emoji, combining marks, digits, whitespace runs,
    contractions, punctuation."""
    def pick(lo, hi, n):
        return "".join(chr(r.randint(lo, hi)) for _ in range(n))

    emoji = ["\U0001F600", "\U0001F44D\U0001F3FD", "\U0001F468\u200d\U0001F469\u200d\U0001F467",
             "\U0001F1EF\U0001F1F5", "\u2764\ufe0f", "1\ufe0f\u20e3", "\U0001F9D1\U0001F3FF\u200d\U0001F4BB",
             "\U0001FAE0", "\u263A", "\U0001F3F3\ufe0f\u200d\U0001F308"]
    ws = [" ", "  ", " " * 7, "\t", "\t\t ", "\n", "\n\n", "\n\n\n\n", "\r\n", " \n", "  \n  ", "\u00a0",
          "\u3000", "\u2028", "\u0085", "\u200b", "\ufeff", "\x0b", "\x0c", "\u2003\u2009", "\r"]
    contr = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'LL", "'D", "\u2019s", "'x", "''"]
    latin = ["the", "The", "THE", "caf\u00e9", "\u00fcber", "stra\u00dfe", "\u00c5ngstr\u00f6m", "na\u00efve",
             "\u0395\u03bb\u03bb\u03ac\u03b4\u03b1", "\u041c\u043e\u0441\u043a\u0432\u0430", "\u0141\u00f3d\u017a",
             "ti\u1ebfng", "Vi\u1ec7t", "\u0130stanbul", "\u0131\u015f\u0131k", "\ufb01le", "\u2126hm"]
    marks = [lambda: r.choice("aeiouxyzAEN") + pick(0x300, 0x36F, r.randint(1, 3)),
             lambda: r.choice(["\u0928\u092e\u0938\u094d\u0924\u0947", "\u0939\u093f\u0928\u094d\u0926\u0940",
                               "\u0645\u064e\u0631\u0652\u062d\u064e\u0628\u064b\u0627",
                               "\u05e9\u05b8\u05c1\u05dc\u05d5\u05b9\u05dd",
                               "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22",
                               "\u1100\u1161\u11a8", "e\u0301\u0323", "\u0b47\u0b3e"]),
             lambda: unicodedata.normalize("NFD", r.choice(latin))]
    digits = [lambda: str(r.randint(0, 10 ** r.randint(1, 12))),
              lambda: f"{r.randint(0, 999)}.{r.randint(0, 99999)}",
              lambda: f"{r.randint(1, 999)},{r.randint(0, 999):03d},{r.randint(0, 999):03d}",
              lambda: pick(0x660, 0x669, r.randint(1, 6)), lambda: pick(0x966, 0x96F, r.randint(1, 6)),
              lambda: pick(0xFF10, 0xFF19, r.randint(1, 5)), lambda: r.choice(["\u00b2", "\u00bd", "\u2167",
                                                                                  "\u2460\u2461", "x\u00b3"]),
              lambda: "v" + str(r.randint(0, 99)) + "." + str(r.randint(0, 9)) + "rc" + str(r.randint(0, 9))]
    return {
        "cjk": [lambda: pick(0x4E00, 0x9FFF, r.randint(1, 8)), lambda: pick(0x3041, 0x3096, r.randint(1, 6)),
                lambda: pick(0x30A1, 0x30FA, r.randint(1, 6)) + r.choice(["\u3002", "\u3001", "\u300c", ""]),
                lambda: pick(0xAC00, 0xD7A3, r.randint(1, 4)), lambda: pick(0x20000, 0x2A6DF, r.randint(1, 2))],
        "emoji": [lambda: "".join(r.choice(emoji) for _ in range(r.randint(1, 3)))],
        "marks": marks,
        "digits": digits,
        "ws": [lambda: r.choice(ws)],
        "contr": [lambda: r.choice(latin + ["I", "you", "they", "we", "don", "it", "O"]) + r.choice(contr),
                  lambda: r.choice(contr) + r.choice(latin)],
        "latin": [lambda: r.choice(latin), lambda: pick(0x61, 0x7A, r.randint(1, 12)),
                  lambda: pick(0x400, 0x4FF, r.randint(1, 8)), lambda: pick(0x600, 0x64A, r.randint(1, 7))],
        "punct": [lambda: r.choice(["...", "!?", "(", ")", "\u2014", "\u2013", "\u00ab", "\u00bb", "\u201c",
                                    "\u201d", "\"", "#@$%^&*", "--", "://", "<|endoftext|>", "<|im_end|>",
                                    "<|eot_id|>", "<|endof", "|>", "\\n", "\u00bf", "\u3010", "\u2022",
                                    "\x00", "\x7f", "'", "`", "~~"])],
    }


@functools.lru_cache(maxsize=None)
def generated(seed, with_marks):
    """A deterministic multilingual text (about 4 KB) mixing the word kinds of _words."""
    r = random.Random(seed)
    kinds = _words(r)
    if not with_marks:
        del kinds["marks"]
    names = sorted(kinds)
    out, n = [], 0
    while n < 4000:
        w = r.choice(kinds[r.choice(names)])()
        sep = r.choice([" ", " ", " ", "", "\n", r.choice(kinds["ws"])()])
        out.append(w + sep)
        n += len(w) + len(sep)
    return "".join(out)


@functools.lru_cache(maxsize=None)
def corpus(with_marks=True):
    """Licence texts, docs/*.md, 40 generated texts (half without combining marks), TRICKY."""
    gen = [generated(s, with_marks and s % 2 == 0) for s in range(40)]
    texts = license_texts() + doc_texts() + gen + TRICKY
    assert sum(len(t.encode()) for t in texts) >= 200_000
    return texts


# Qwen2's NFC normalizer (Hugging Face's holds Unicode 9.0 data: marks added later are starters
# to it, neither reordered nor joined): composition, reordering by class, singletons,
# exclusions, Hangul jamo, marks after added tokens, long runs of marks.
NFC_CASES = [
    "cafe\u0301 e\u0301\u0323 \u1e0b\u0323 q\u0307\u0323 a\u0316\u0301\u0300\u0345",
    "\u212b \u2126 \u212a \u0958 \u2adc \u0344 \u0f73 \u1f82 \u0387 \u037e",
    "\u1100\u1161 \u1100\u1161\u11a8 \uac00\u11a8 \u1100\u1161\u0301\u11a8 \u11a8\u1161",
    "\u08cc\u302b \U0001d243\u1df9 \u089f\u031d \u0301\u1dfa a\u0c3c\u0301",
    "<|im_end|>\u0301e<|endoftext|>\u0316\u0301 x\u0338 =\u0338 <\u0338",
    "\u0915\u093c \u0928\u093c\u094d \u0627\u0653 \u05e9\u05bc\u05c1 \u0e01\u0e38\u0e48",
    "o" + "\u0301\u0316\u0345\u0334" * 40, "\u0301" * 70 + "e",
]


def first_diff(a, b):
    k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return k, a[max(0, k - 3):k + 5], b[max(0, k - 3):k + 5]


def check_same(tok, oracle, texts, what, special=True):
    """ctorch's ids == Hugging Face's for each text (with or without the template's BOS); the
    library's ids."""
    out = []
    for t in texts:
        want = oracle.encode(t, add_special_tokens=special).ids
        got = tok.encode(t, add_special_tokens=special)
        assert got == want, (what, t[:60], len(t), first_diff(got, want))
        out.append(want)
    return out


def check_decode(tok, oracle, id_lists, what):
    for ids in id_lists:
        want = oracle.decode(ids, skip_special_tokens=False)
        assert tok.decode(ids) == want, (what, ids[:20])


def random_ids(n_vocab, seed, n=300):
    r = random.Random(seed)
    return [[r.randrange(n_vocab) for _ in range(r.randint(1, 12))] for _ in range(n)]


@functools.lru_cache(maxsize=None)
def loaded(style):
    d = os.path.join(DEPS, STYLES[style])
    oracle = hf.Tokenizer.from_file(dep(STYLES[style], "tokenizer.json"))
    return ctt.load(d), oracle, d


def test_gpt2_pair_matches_hf():
    """GPT-2's own layout (encoder.json + vocab.bpe): Hugging Face's BPE reading the same two
    files with GPT-2's ByteLevel pre-tokenizer and <|endoftext|> special is the oracle."""
    enc, bpe = dep("gpt2", "encoder.json"), dep("gpt2", "vocab.bpe")
    oracle = hf.Tokenizer(hf.models.BPE.from_file(enc, bpe))
    oracle.pre_tokenizer = hf.pre_tokenizers.ByteLevel(add_prefix_space=False)
    oracle.decoder = hf.decoders.ByteLevel()
    oracle.add_special_tokens([hf.AddedToken("<|endoftext|>", special=True, normalized=False)])
    assert oracle.encode("Hello world<|endoftext|>").ids == [15496, 995, 50256]  # GPT-2's known ids
    tok = ctt.load(os.path.dirname(enc))  # the folder
    assert tok.format == "gpt2-bpe" and tok.vocab_size == 50257 == oracle.get_vocab_size()
    assert tok.eos_id == 50256 and tok.bos_id == 50256 and not tok.add_bos
    texts = corpus()
    ids = check_same(tok, oracle, texts, "gpt2 pair")
    check_decode(tok, oracle, ids + random_ids(50257, 1), "gpt2 pair")
    for t in texts:
        assert tok.decode(tok.encode(t)) == t
    # either file of the pair names the other
    for f in (enc, bpe):
        assert ctt.load(f).encode(texts[1]) == oracle.encode(texts[1]).ids


@pytest.mark.parametrize("style", ["gpt2", "llama3", "qwen2"])
def test_hf_tokenizer_json_matches_hf(style, tmp_path):
    tok, oracle, d = loaded(style)
    assert tok.format == "hf-bpe" and tok.vocab_size == oracle.get_vocab_size()
    texts = corpus()
    ids = check_same(tok, oracle, texts, style, special=False)
    check_same(tok, oracle, texts[-len(TRICKY):] + texts[:3], style)  # BOS where the template has it
    # vocabulary tokens as texts of their own: every 7th, and (Llama 3) each token that no merge
    # makes, which only ignore_merges reaches
    vocab = sorted(oracle.get_vocab(with_added_tokens=False).items(), key=lambda kv: kv[1])
    pick = {i for i in range(0, len(vocab), 7)}
    if style == "llama3":
        made = {"".join(m) for m in json.load(open(os.path.join(d, "tokenizer.json"), encoding="utf-8"))["model"]["merges"]}
        unmade = {i for tk, i in vocab if len(tk) > 1 and tk not in made}
        assert len(unmade) == 678
        pick |= unmade
    words = [oracle.decode([i]) for i in sorted(pick)]
    words = [w for w in words if "\ufffd" not in w]
    want = [e.ids for e in oracle.encode_batch(words, add_special_tokens=False)]
    got = [tok.encode(w, add_special_tokens=False) for w in words]
    bad = [(w, g, x) for w, g, x in zip(words, got, want) if g != x]
    assert not bad, (style, len(bad), bad[:5])
    check_decode(tok, oracle, ids + random_ids(tok.vocab_size, 2), style)
    for t, i in zip(texts, ids):
        assert tok.decode(i) == (oracle.normalizer.normalize_str(t) if style == "qwen2" else t)
    V = {"gpt2": 50256, "llama3": 128000, "qwen2": 151643}[style]
    if style == "gpt2":
        assert tok.eos_id == V and tok.bos_id is None and not tok.add_bos
    if style == "llama3":
        assert tok.bos_id == V and tok.add_bos and tok.eos_id == V + 1  # tokenizer_config.json
        c = tmp_path / "llama3"
        c.mkdir()
        os.symlink(os.path.join(d, "tokenizer.json"), c / "tokenizer.json")
        (c / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<|eot_id|>"}}))
        again = ctt.load(c)
        assert again.eos_id == V + 9 and again.bos_id == V
        del again
        assert tok.encode("hi")[0] == V and tok.encode("hi", add_special_tokens=False)[0] != V
        assert tok.encode("<|eot_id|>", add_special_tokens=False) == [V + 9]
    if style == "qwen2":
        assert tok.bos_id is None and not tok.add_bos and tok.eos_id == V + 2
        check_same(tok, oracle, NFC_CASES, style)
    # the JSON round-trips through the checkpoint form (to_json / from_json)
    tok.save(tmp_path / f"{style}-saved.json")
    again = ctt.load(tmp_path / f"{style}-saved.json")
    assert (again.bos_id, again.eos_id, again.add_bos) == (tok.bos_id, tok.eos_id, tok.add_bos)
    assert again.encode(texts[0]) == oracle.encode(texts[0]).ids


@pytest.mark.parametrize("style", ["gpt2-pair", "gpt2", "llama3", "qwen2"])
def test_cli_encode_decode_matches_hf(style, tmp_path):
    """`ctorch tokenizer encode --file` on the licence texts and docs (no BOS: the CLI prints
    the text's own tokens) and `decode --ids`, against Hugging Face."""
    if style == "gpt2-pair":
        src = os.path.dirname(dep("gpt2", "vocab.bpe"))
        oracle = loaded("gpt2")[1]  # the same vocabulary and merges
    else:
        _, oracle, src = loaded(style)
    text = "\n".join(license_texts() + [generated(7, False)])
    if style == "qwen2":
        text += "\n".join(NFC_CASES)
    f = tmp_path / "text.txt"
    f.write_bytes(text.encode())
    want = oracle.encode(text, add_special_tokens=False).ids
    r = ctorch("tokenizer", "encode", "--tokenizer", src, "--file", f)
    got = [int(x) for x in r.stdout.split()]
    assert got == want, (style, first_diff(got, want))
    ids = want[:3000] + random_ids(oracle.get_vocab_size(), 3, 20)[0]
    r = subprocess.run([cli_path(), "tokenizer", "decode", "--tokenizer", src, "--ids", " ".join(map(str, ids))],
                       capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout[:-1].decode("utf-8", errors="replace") == oracle.decode(ids, skip_special_tokens=False)
    r = ctorch("tokenizer", "encode", "--tokenizer", src, "--text", "Hello world<|endoftext|>")
    assert [int(x) for x in r.stdout.split()] == oracle.encode("Hello world<|endoftext|>", add_special_tokens=False).ids


def test_bench_tokenizer_baseline_is_hf_tokenizers():
    """`ctorch bench tokenizer` runs bench/tokenizers_baseline.py (Hugging Face tokenizers, its
    version named) on the same GPT-2 files and text, and counts the same tokens as ctorch;
    without the test stack's python it says "not installed". (No timing is asserted.)"""
    src = os.path.dirname(dep("gpt2", "vocab.bpe"))
    args = ["bench", "tokenizer", "--tokenizer", src, "--mb", 1, "--baseline-kb", 64, "--repeats", 3, "--json"]
    j = json.loads(ctorch(*args).stdout)
    base = j["baseline_hf_tokenizers"]
    assert base["status"] == "ok" and base["tokenizers_version"] == hf.__version__, base
    assert base["layout"] == "encoder.json + vocab.bpe" and 60_000 < base["bytes"] <= 65536
    assert base["tokens"] == base["ctorch_tokens"] > 0
    assert [c["name"] for c in j["cases"]] == ["ctorch-bpe (own, 4096)", "gpt2 (ctorch)"]
    env = dict(os.environ, CTORCH_PYTHON=os.path.join(str(DEPS), "no-such-python"))
    r = subprocess.run([cli_path(), *map(str, args)], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["baseline_hf_tokenizers"]["status"] == "not installed"
