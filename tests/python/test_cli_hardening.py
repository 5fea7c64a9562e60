"""Hostile input to the CLI (issue 14): checkpoints whose metadata passes the format checks
but describes something else, output folders of earlier runs, options that would only fail
later. Each case runs the real `ctorch` binary; memory is measured on the child itself
(wait4's ru_maxrss), never time."""
import json
import os
import struct
import subprocess
import sys
import tempfile

import pytest



from conftest import cli_path  # noqa: E402,F401  (the one definition)


# ru_maxrss of a child counts what it held between fork and exec, and a child of pytest
# (torch loaded) starts at ~250 MB: so a small interpreter forks the CLI and reports the
# CLI's own peak through wait4.
_MEASURE = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
_, status, ru = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    f.write("%d %d" % (os.waitstatus_to_exitcode(status), ru.ru_maxrss * 1024))
"""


def run(*args, timeout=300):
    """Run ctorch; return (returncode, stdout, stderr, the CLI process's peak RSS in bytes)."""
    with tempfile.TemporaryDirectory() as d:
        rep = os.path.join(d, "rusage")
        r = subprocess.run([sys.executable, "-c", _MEASURE, rep, cli_path(), *map(str, args)],
                           capture_output=True, text=True, timeout=timeout)
        rc, rss = map(int, open(rep).read().split())
        return rc, r.stdout, r.stderr, rss


def ctorch_ok(*args):
    rc, out, err, _ = run(*args)
    assert rc == 0, f"ctorch {' '.join(map(str, args))} failed ({rc}):\n{err}"
    return out, err


def write_safetensors(path, tensors, metadata):
    """tensors: {name: (dtype, shape, bytes)}; a plain safetensors file."""
    header, data = {"__metadata__": metadata}, b""
    for name, (dt, shape, raw) in tensors.items():
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)


# 2^17 x 1024 embeddings: 512 MiB of parameters (and as much again of gradients) that a
# model built before checking the tensors would allocate and touch.
HUGE = {"vocab_size": 131072, "d_model": 1024, "n_head": 8, "n_kv_head": 8, "n_layer": 2,
        "d_ff": 4096, "context": 256}
TRAIN = {"batch": 1, "seq": 16, "steps": 10}
DATA = {"kind": "builtin", "seed": 1, "vocab_size": 131072, "classes": 8, "successors": 4,
        "zipf": 1.0, "sentence": 5, "repeats": 3}
RSS_BOUND = 96 << 20  # the CLI failing early stays far below this; the model alone is 1 GiB


def huge_checkpoint(tmp_path):
    f = tmp_path / "huge.safetensors"
    write_safetensors(f, {"tok_embeddings.weight": ("F32", [4, 4], bytes(64))},
                      {"format": "ctorch-gpt", "config": json.dumps(HUGE), "train": json.dumps(TRAIN),
                       "data": json.dumps(DATA), "step": "1", "epoch": "0", "data_pos": "0",
                       "rng": "1" * 64})
    assert f.stat().st_size < 4096
    return f


def test_generate_checks_the_tensors_before_building_the_model(tmp_path):
    rc, _, err, rss = run("generate", "--checkpoint", huge_checkpoint(tmp_path), "--tokens", 1)
    assert rc == 1, err
    assert rss < RSS_BOUND, f"peak RSS {rss >> 20} MiB"
    assert "'tok_embeddings.weight' has shape [4, 4], not the configuration's [131072, 1024]" in err, err


def test_resume_checks_the_tensors_before_building_the_model(tmp_path):
    rc, _, err, rss = run("train", "--resume", huge_checkpoint(tmp_path), "--out", tmp_path / "out",
                          "--quiet")
    assert rc == 1, err
    assert rss < RSS_BOUND, f"peak RSS {rss >> 20} MiB"
    assert "'tok_embeddings.weight' has shape [4, 4]" in err, err


# ---- checkpoints whose trainer state passes the format checks but is wrong -----------------

TINY = ["--vocab", 512, "--classes", 8, "--sentence", 5, "--repeats", 3, "--layers", 1, "--d-model", 16,
        "--heads", 2, "--kv-heads", 1, "--ffn", 24, "--context", 16, "--batch", 2]


def read_safetensors(path):
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def with_metadata(src, dst, **changes):
    """Copy a safetensors file with __metadata__ entries changed (tensors byte for byte)."""
    header, data = read_safetensors(src)
    header["__metadata__"].update(changes)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    dst.write_bytes(struct.pack("<Q", len(h)) + h + data)


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    ctorch_ok("train", *TINY, "--steps", 4, "--stop-at", 2, "--quiet", "--out", d)
    return d / "checkpoint.safetensors"


@pytest.mark.parametrize("key,value,needle", [
    ("step", "9223372036854775808", '"step"'),          # was clamped to 2^63-1: the run "finished", rc 0
    ("step", "-3", '"step"'),
    ("rng", "0" * 64, '"rng" is all zero'),              # xoshiro's one invalid state
    ("train", None, "accum must be in [1, 2^20]"),       # accum 2^40 (the CLI caps 2^20)
    ("train", "eval0", "eval_batches must be >= 1"),     # would fail at the first evaluation
])
def test_resume_refuses_bad_trainer_state(tmp_path, small_run, key, value, needle):
    header, _ = read_safetensors(small_run)
    if key == "train":
        tr = json.loads(header["__metadata__"]["train"])
        if value is None:
            tr["accum"] = 1 << 40
        else:
            tr["eval_batches"] = 0
        value = json.dumps(tr)
    bad = tmp_path / "bad.safetensors"
    with_metadata(small_run, bad, **{key: value})
    out = tmp_path / "out"
    rc, _, err, _ = run("train", "--resume", bad, "--out", out, "--quiet")
    assert rc == 1, err
    assert needle in err, err
    assert not (out / "metrics.jsonl").exists()


def test_eval_batches_zero_is_refused_up_front(tmp_path):
    rc, _, err, _ = run("train", *TINY, "--steps", 2, "--eval-batches", 0, "--quiet", "--out", tmp_path / "o")
    assert rc == 2, err
    assert "--eval-batches" in err, err
    assert not (tmp_path / "o" / "metrics.jsonl").exists()


# ---- a fresh run over an earlier one --------------------------------------------------------

def test_fresh_run_refuses_an_earlier_run_unless_overwrite(tmp_path):
    out = tmp_path / "run"
    ctorch_ok("train", *TINY, "--steps", 2, "--quiet", "--out", out)
    ck, metrics = (out / "checkpoint.safetensors").read_bytes(), (out / "metrics.jsonl").read_bytes()
    rc, _, err, _ = run("train", *TINY, "--steps", 3, "--seed", 7, "--quiet", "--out", out)
    assert rc == 1, err
    assert "earlier run" in err and "--overwrite" in err and "checkpoint.safetensors" in err, err
    assert (out / "checkpoint.safetensors").read_bytes() == ck
    assert (out / "metrics.jsonl").read_bytes() == metrics
    # --resume continues it; --overwrite is not a training setting, so resume accepts it
    ctorch_ok("train", "--resume", "--overwrite", "--quiet", "--out", out)
    assert (out / "checkpoint.safetensors").read_bytes() == ck  # the run had ended: nothing to add
    # --overwrite replaces it
    ctorch_ok("train", *TINY, "--steps", 3, "--seed", 7, "--quiet", "--out", out, "--overwrite")
    header, _ = read_safetensors(out / "checkpoint.safetensors")
    assert header["__metadata__"]["step"] == "3"
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert lines[0]["event"] == "start" and lines[-1]["event"] == "end"
    assert [x["step"] for x in lines if "loss" in x and "step" in x] == [1, 2, 3]


@pytest.mark.parametrize("layout", ["sharded", "checkpoint-dir-only", "metrics-only"])
def test_earlier_sharded_run_is_seen_and_overwritten(tmp_path, layout):
    out = tmp_path / "run"
    out.mkdir()
    keep = out / "notes.txt"  # not the run's: never touched
    keep.write_text("mine")
    if layout == "sharded":
        (out / "checkpoint-40").mkdir()
        (out / "checkpoint-40" / "rank0.safetensors").write_bytes(b"x")
        (out / "latest").symlink_to("checkpoint-40")
        needle = "latest"
    elif layout == "checkpoint-dir-only":
        (out / "checkpoint-7").mkdir()
        (out / "checkpoint-7" / "shard").mkdir()
        (out / "checkpoint-7" / "shard" / "rank1.safetensors").write_bytes(b"y")
        needle = "checkpoint-7/"
    else:
        (out / "metrics.jsonl").write_text('{"event": "start"}\n')
        needle = "metrics.jsonl"
    rc, _, err, _ = run("train", *TINY, "--steps", 1, "--quiet", "--out", out)
    assert rc == 1 and needle in err, err
    ctorch_ok("train", *TINY, "--steps", 1, "--quiet", "--out", out, "--overwrite")
    names = sorted(p.name for p in out.iterdir())
    assert names == ["checkpoint.safetensors", "loss.svg", "metrics.jsonl", "notes.txt"], names
    assert keep.read_text() == "mine"


def test_bench_flex_unknown_case_is_an_error():
    for cases, bad in (("bogus", "bogus"), ("flex-sliding,nope", "nope"), ("", "''")):
        rc, out, err, _ = run("bench", "flex", "--cases", cases, "--seq", 64)
        assert rc == 2, (cases, err)
        assert f"unknown case '{bad}'" in err or (bad == "''" and "unknown case ''" in err), err
        assert out == "", out


@pytest.mark.parametrize("key,value,needle", [
    ("step", "9223372036854775808", '"step" must be an integer in [0, 2^63)'),
    ("rng", "0" * 64, '"rng" is all zero'),
])
def test_sharded_resume_refuses_bad_trainer_state(tmp_path, key, value, needle):
    """The sharded checkpoint (DIR/latest -> checkpoint-<step>/index.json) goes through the
    same trainer-state parser as the single file."""
    out = tmp_path / "run"
    ctorch_ok("train", *TINY, "--steps", 4, "--stop-at", 2, "--quiet", "--fsdp", "--out", out)
    index = out / "latest" / "index.json"
    j = json.loads(index.read_text())
    j["metadata"][key] = value
    index.write_text(json.dumps(j))
    rc, _, err, _ = run("train", "--resume", out, "--out", out, "--fsdp", "--quiet")
    assert rc == 1, err
    assert needle in err, err


@pytest.mark.parametrize("lie", ["config-only", "index-too"])
def test_sharded_resume_checks_before_building_the_model(tmp_path, lie):
    """A sharded checkpoint whose index claims a 1 GiB model over shards of a tiny one: refused
    before the model is allocated, whether only the config lies or the index's shapes too."""
    out = tmp_path / "run"
    ctorch_ok("train", *TINY, "--steps", 4, "--stop-at", 2, "--quiet", "--fsdp", "--out", out)
    index = out / "latest" / "index.json"
    j = json.loads(index.read_text())
    cfg = json.loads(j["metadata"]["config"])
    cfg.update(vocab_size=HUGE["vocab_size"], d_model=HUGE["d_model"], n_head=8, n_kv_head=8, d_ff=4096)
    j["metadata"]["config"] = json.dumps(cfg)
    if lie == "index-too":
        for name, e in j["tensors"].items():
            if name.endswith("tok_embeddings.weight"):
                e["shape"] = [HUGE["vocab_size"], HUGE["d_model"]]
    index.write_text(json.dumps(j))
    rc, _, err, rss = run("train", "--resume", out, "--out", out, "--fsdp", "--quiet")
    assert rc == 1, err
    assert rss < RSS_BOUND, f"peak RSS {rss >> 20} MiB"
    assert ("as the configuration has it" if lie == "config-only" else "tok_embeddings.weight") in err, err


# ---- issue 20: launch's second options, an empty --prompt-ids --------------------------------

@pytest.mark.parametrize("opt, value, rule", [
    ("--grace", "-1", ">= 0"), ("--grace", "inf", ">= 0"), ("--timeout", "-1", "> 0"),
    ("--timeout", "nan", "> 0"), ("--timeout", "0", "> 0"), ("--max-time", "-5", "> 0"),
    ("--max-time", "nan", "> 0")])
def test_launch_seconds_out_of_range_are_named(opt, value, rule):
    """These exited 2 without a word: the message names the flag, the value and the rule."""
    rc, out, err, _ = run("launch", "--nproc", 1, opt, value, "--", "true")
    assert rc == 2
    assert f"{opt} {value}" in err and f"seconds {rule} expected" in err, err


def test_generate_empty_prompt_ids_is_the_empty_prompt(tmp_path):
    """An empty --prompt-ids (no ids at all) passed NULL to memcpy (undefined behaviour, caught
    by the sanitised build's test_cli_generate_ids); it is the empty prompt: the model's
    start token, then the same tokens as --prompt ''."""
    ctorch_ok("train", *TINY, "--steps", 1, "--quiet", "--out", tmp_path)
    ck = tmp_path / "checkpoint.safetensors"
    base = ("generate", "--model", ck, "--max-new-tokens", 6, "--greedy", "--ignore-eos", "--json")
    want = json.loads(ctorch_ok(*base, "--prompt", "")[0])
    for ids in ("", " ", " , "):
        got = json.loads(ctorch_ok(*base, "--prompt-ids", ids)[0])
        assert got["prompt_ids"] == want["prompt_ids"] and len(got["prompt_ids"]) == 1, (ids, got)
        assert got["new_ids"] == want["new_ids"] and len(got["new_ids"]) == 6, (ids, got)
