"""Tokenizers through the CLI (and, below, the Python binding): hostile tokenizer files and
checkpoint metadata give errors, never crashes; bad arguments fail with a message."""
import json
import os
import struct
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cli_path():
    if os.environ.get("CTORCH_CLI"):
        return os.environ["CTORCH_CLI"]
    lib = os.environ.get("CTORCH_LIB")
    if lib:
        return os.path.join(os.path.dirname(lib), "ctorch")
    return os.path.join(ROOT, "build", "ctorch")


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
