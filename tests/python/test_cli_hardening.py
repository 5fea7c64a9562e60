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

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cli_path():
    if os.environ.get("CTORCH_CLI"):
        return os.environ["CTORCH_CLI"]
    lib = os.environ.get("CTORCH_LIB")
    if lib:
        return os.path.join(os.path.dirname(lib), "ctorch")
    return os.path.join(ROOT, "build", "ctorch")


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
