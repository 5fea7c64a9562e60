"""Files ctorch reads (issue 20, items 2 and 3): every input must be a regular file, read
with a bound fitting what it is, and side files copied out of a model directory must not
leak what a link points at.

A FIFO (which blocks an open for reading until a writer comes: forever) or /dev/zero (which
never ends) as config.json, adapter_config.json, tokenizer.json, a tensor file, --data, or the
data file a checkpoint names must fail fast with a message naming the file and "not a regular
file"; every command runs under a timeout as a hang guard. Config JSON over its limit is
refused with the limit named. convert and train refuse a side file (tokenizer_config.json,
...) that links outside the model directory, copy links that stay inside it (the Hugging Face
hub cache's snapshots/<rev> -> blobs/ layout included), and keep each file's permission bits.
Hugging Face directories are written by transformers' save_pretrained, adapters by peft."""
import json
import os
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hf_reference as ref  # noqa: E402
from conftest import ROOT, cli_path  # noqa: E402

HANG = 30  # seconds: every case here answers in well under one; a hang is a failure


def run(*args, timeout=HANG):
    try:
        return subprocess.run([cli_path(), *map(str, args)], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"ctorch {' '.join(map(str, args))} hung (no answer in {timeout} s)")


def py(code, timeout=HANG):
    """Run code in a fresh Python on the binding (a hang there must not hang the suite)."""
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    try:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"python -c {code!r} hung (no answer in {timeout} s)")


def refused(r, path, rule="not a regular file"):
    out = r.stderr + r.stdout
    assert r.returncode != 0, out
    assert str(path) in out and rule in out, out


def plant(path, kind):
    """Replace path by a FIFO or by a link to /dev/zero."""
    if os.path.lexists(path):
        os.unlink(path)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        os.symlink("/dev/zero", path)


KINDS = ["fifo", "devzero"]
TEXT = "the quick brown fox jumps over the lazy dog. " * 40


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A tiny Llama directory (save_pretrained) with a ctorch tokenizer.json."""
    d = tmp_path_factory.mktemp("hf")
    text = d.parent / (d.name + "-text.txt")
    text.write_text(TEXT)
    r = run("tokenizer", "train", "--data", text, "--out", d / "tokenizer.json", "--vocab", 280)
    assert r.returncode == 0, r.stderr
    cfg = ref.llama_config(vocab_size=284, max_position_embeddings=32)
    ref.save_hf(d, cfg, ref.random_weights(cfg, seed=1))
    return d, text


def copy_dir(src, dst):
    os.makedirs(dst)
    for n in os.listdir(src):
        with open(os.path.join(src, n), "rb") as f, open(os.path.join(dst, n), "wb") as g:
            g.write(f.read())


# ---- item 3: not a regular file ---------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_config_json_not_regular(tmp_path, hf_dir, kind):
    d = tmp_path / "m"
    copy_dir(hf_dir[0], d)
    plant(d / "config.json", kind)
    # ct_hf_load (the library's reader) under generate and convert
    refused(run("generate", "--model", d, "--prompt-ids", "1", "--max-new-tokens", 1), d / "config.json")
    r = run("convert", d, tmp_path / "out.safetensors")
    assert r.returncode != 0 and "config.json" in r.stderr, r.stderr


@pytest.fixture(scope="module")
def adapter(tmp_path_factory, hf_dir):
    """A LoRA adapter of hf_dir's model as peft writes it."""
    ad = tmp_path_factory.mktemp("adapter")
    ref.peft_model(ref.load(hf_dir[0]), rank=2, alpha=4, targets="q,v").save_pretrained(str(ad))
    return ad


@pytest.mark.parametrize("kind", KINDS)
def test_adapter_config_not_regular(tmp_path, hf_dir, adapter, kind):
    ad = tmp_path / "adapter"
    copy_dir(adapter, ad)
    r = run("convert", hf_dir[0], tmp_path / "merged", "--merge-lora", ad)
    assert r.returncode == 0, r.stderr
    plant(ad / "adapter_config.json", kind)
    refused(run("convert", hf_dir[0], tmp_path / "m2", "--merge-lora", ad), ad / "adapter_config.json")
    assert not (tmp_path / "m2").exists()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json"])
def test_tokenizer_files_not_regular(tmp_path, hf_dir, kind, name):
    d = tmp_path / "tok"
    d.mkdir()
    (d / "tokenizer.json").write_bytes((hf_dir[0] / "tokenizer.json").read_bytes())
    (d / "tokenizer_config.json").write_text("{}")
    assert run("tokenizer", "encode", "--tokenizer", d, "--text", "the fox").returncode == 0
    plant(d / name, kind)
    refused(run("tokenizer", "encode", "--tokenizer", d, "--text", "the fox"), d / name)
    refused(run("tokenizer", "encode", "--tokenizer", hf_dir[0] / "tokenizer.json", "--file",
                d / name if name == "tokenizer.json" else d / name), d / name)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("ext", [".safetensors", ".pt"])
def test_tensor_file_not_regular(tmp_path, kind, ext):
    p = tmp_path / ("t" + ext)
    torch.save({"w": torch.ones(2)}, p) if ext == ".pt" else ref.write_safetensors(p, {"w": torch.ones(2)})
    assert run("inspect", p).returncode == 0
    plant(p, kind)
    refused(run("inspect", p), p)
    # the library's ct_load itself (through the binding)
    refused(py(f"from ctorch import io; io.SafetensorsFile({str(p)!r})"), p)


@pytest.mark.parametrize("kind", KINDS)
def test_binding_reads_only_regular_files(tmp_path, kind):
    """The binding's own reads (io.detect_format of a path, models.load's config= path) follow
    the library's rule: a FIFO must not hang them, /dev/zero must not be read forever."""
    p = tmp_path / "t.safetensors"
    ref.write_safetensors(p, {"w": torch.ones(2)})
    r = py(f"from ctorch import io; print(io.detect_format({str(p)!r}))")
    assert r.returncode == 0 and "safetensors" in r.stdout, r.stderr
    f = tmp_path / "f.safetensors"
    plant(f, kind)
    refused(py(f"from ctorch import io; io.detect_format({str(f)!r})"), f)
    cfg = tmp_path / "config.json"
    plant(cfg, kind)
    refused(py(f"from ctorch import models; models.load({str(p)!r}, config={str(cfg)!r})"), cfg)


@pytest.mark.parametrize("kind", KINDS)
def test_training_data_not_regular(tmp_path, hf_dir, kind):
    data = tmp_path / "data.txt"
    plant(data, kind)
    refused(run("train", "--data", data, "--steps", 1, "--quiet", "--out", tmp_path / "o"), data)


@pytest.mark.parametrize("kind", KINDS)
def test_checkpoint_data_not_regular(tmp_path, hf_dir, kind):
    """A checkpoint names its --data file; resume reads it again: planted there, refused."""
    data = tmp_path / "data.txt"
    data.write_text(TEXT)
    out = tmp_path / "o"
    r = run("train", "--data", data, "--vocab", 270, "--layers", 1, "--d-model", 16, "--heads", 2,
            "--ffn", 32, "--context", 16, "--batch", 2, "--steps", 4, "--stop-at", 2, "--quiet",
            "--out", out, timeout=120)
    assert r.returncode == 0, r.stderr
    plant(data, kind)
    refused(run("train", "--resume", "--out", out, "--quiet"), data)


def test_config_json_over_its_limit(tmp_path, hf_dir):
    d = tmp_path / "m"
    copy_dir(hf_dir[0], d)
    c = json.load(open(d / "config.json"))
    text = json.dumps(c) + " " * (2 << 20)  # valid JSON, 2 MiB of trailing blanks
    (d / "config.json").write_text(text)
    r = run("generate", "--model", d, "--prompt-ids", "1", "--max-new-tokens", 1)
    refused(r, d / "config.json", rule="more than the 1 MiB allowed")
    assert str(len(text)) in r.stderr, r.stderr
    # the same beside a .pt state dict (the CLI's reader)
    pt = tmp_path / "p" / "model.pt"
    pt.parent.mkdir()
    torch.save({"w": torch.ones(2)}, pt)
    (pt.parent / "config.json").write_text(text)
    r = run("generate", "--model", pt, "--prompt-ids", "1", "--max-new-tokens", 1)
    refused(r, pt.parent / "config.json", rule="more than the 1 MiB allowed")


# ---- item 2: side files through links --------------------------------------------------------

SIDE = ["tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
        "tokenizer.json"]


def train_init(src, text, out):
    return run("train", "--init-from", src, "--data", text, "--seq", 16, "--batch", 2, "--steps", 1,
               "--quiet", "--no-doc-mask", "--eval-every", 0, "--out", out, timeout=120)


@pytest.mark.parametrize("name", SIDE)
def test_side_file_link_leaving_the_directory_is_refused(tmp_path, hf_dir, name):
    src = tmp_path / "src"
    copy_dir(hf_dir[0], src)
    secret = tmp_path / "secret.json"
    secret.write_text('{"private": "key material"}')
    os.chmod(secret, 0o600)
    if name == "tokenizer.json":  # the link must still be a tokenizer for train to get there
        secret.write_bytes((src / "tokenizer.json").read_bytes())
    os.unlink(src / name) if os.path.lexists(src / name) else None
    os.symlink(secret, src / name)
    out = tmp_path / "out"
    r = run("convert", src, out)
    refused(r, src / name, rule="outside the model directory")
    assert not out.exists()
    out2 = tmp_path / "out2"
    r = train_init(src, hf_dir[1], out2)
    refused(r, src / name, rule="outside the model directory")
    assert not (out2 / name).exists()
    # relative links that climb out are the same
    os.unlink(src / name)
    os.symlink(os.path.join("..", "secret.json"), src / name)
    refused(run("convert", src, tmp_path / "out3"), src / name, rule="outside the model directory")


def test_side_file_links_inside_are_copied_and_modes_kept(tmp_path, hf_dir):
    src = tmp_path / "src"
    copy_dir(hf_dir[0], src)
    (src / "sub").mkdir()
    (src / "sub" / "gen.json").write_text('{"do_sample": false}\n')
    os.unlink(src / "generation_config.json")
    os.symlink(os.path.join("sub", "gen.json"), src / "generation_config.json")
    (src / "tokenizer_config.json").write_text('{"model_max_length": 32}\n')
    (src / "special_tokens_map.json").write_text("{}\n")
    modes = {"tokenizer_config.json": 0o600, "special_tokens_map.json": 0o640,
             "generation_config.json": 0o604, "tokenizer.json": 0o644}
    os.chmod(src / "tokenizer_config.json", 0o600)
    os.chmod(src / "special_tokens_map.json", 0o640)
    os.chmod(src / "sub" / "gen.json", 0o604)
    os.chmod(src / "tokenizer.json", 0o644)
    old = os.umask(0o022)
    try:
        r = run("convert", src, tmp_path / "out")
        assert r.returncode == 0, r.stderr
        r = train_init(src, hf_dir[1], tmp_path / "trained")
        assert r.returncode == 0, r.stderr
    finally:
        os.umask(old)
    for out in (tmp_path / "out", tmp_path / "trained"):
        for n, mode in modes.items():
            p = out / n
            assert not os.path.islink(p) and os.path.isfile(p), p
            assert p.read_bytes() == (src / n).read_bytes(), p
            assert os.stat(p).st_mode & 0o7777 == mode, (p, oct(os.stat(p).st_mode))
        assert not [n for n in os.listdir(out) if "tmp" in n], os.listdir(out)


def test_hub_cache_snapshot_links_are_copied(tmp_path, hf_dir):
    """The Hugging Face hub cache keeps a snapshot's files as links into the repository's
    blobs/ folder: that layout converts; a link to another repository's blobs does not."""
    repo = tmp_path / "models--org--tiny"
    snap = repo / "snapshots" / "abc123"
    blobs = repo / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    for n in os.listdir(hf_dir[0]):
        (blobs / ("b-" + n)).write_bytes((hf_dir[0] / n).read_bytes())
        os.symlink(os.path.join("..", "..", "blobs", "b-" + n), snap / n)
    (blobs / "b-gen").write_text('{"do_sample": false}\n')
    os.unlink(snap / "generation_config.json")
    os.symlink(os.path.join("..", "..", "blobs", "b-gen"), snap / "generation_config.json")
    r = run("convert", snap, tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out" / "generation_config.json").read_text() == '{"do_sample": false}\n'
    other = tmp_path / "models--else--x" / "blobs"
    other.mkdir(parents=True)
    (other / "g").write_text("{}")
    os.unlink(snap / "generation_config.json")
    os.symlink(other / "g", snap / "generation_config.json")
    refused(run("convert", snap, tmp_path / "out2"), snap / "generation_config.json",
            rule="outside the model directory")


@pytest.mark.parametrize("kind", KINDS)
def test_side_file_not_regular_is_refused_by_convert(tmp_path, hf_dir, kind):
    src = tmp_path / "src"
    copy_dir(hf_dir[0], src)
    plant(src / "special_tokens_map.json", kind)
    out = tmp_path / "out"
    refused(run("convert", src, out), src / "special_tokens_map.json")
    assert not out.exists()
