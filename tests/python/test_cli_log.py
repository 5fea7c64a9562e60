"""The CLI shows the library's log: ct_log_sink_text at WARN on stderr by default, JSON lines
with --log-json (before the command or among its options, never after a `--`). The message
used is the comm layer's security warning of a job without CT_JOB_SECRET (a one-process
`ctorch train --fsdp` serves a loopback store)."""
import json
import os
import subprocess

import pytest



from conftest import cli_path  # noqa: E402,F401  (the one definition)


TINY = ["--vocab", "256", "--classes", "8", "--sentence", "5", "--repeats", "3", "--layers", "1",
        "--d-model", "32", "--heads", "4", "--kv-heads", "2", "--ffn", "48", "--context", "16",
        "--threads", "1", "--quiet", "--steps", "1", "--batch", "4", "--fsdp"]


def train(tmp_path, before=(), after=()):
    env = {k: v for k, v in os.environ.items() if k != "CT_JOB_SECRET"}
    out = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
    r = subprocess.run([cli_path(), *before, "train", *TINY, "--out", str(out), *after],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    return r.stderr.splitlines()


def test_text_lines_at_warn(tmp_path):
    lines = train(tmp_path)
    warn = [l for l in lines if l.startswith("[warn] comm: ")]
    assert warn, lines
    ev = json.loads(warn[0][len("[warn] comm: "):])
    assert ev["event"] == "no_job_secret" and ev["where"] == "store server"
    assert not any(l.startswith("[info]") or l.startswith("[debug]") for l in lines)


@pytest.mark.parametrize("where", ["before", "after"])
def test_log_json(tmp_path, where):
    lines = train(tmp_path, before=["--log-json"] if where == "before" else [],
                  after=["--log-json"] if where == "after" else [])
    recs = [json.loads(l) for l in lines if l.startswith("{")]
    assert recs and not any(l.startswith("[warn]") for l in lines), lines
    for r in recs:
        assert set(r) == {"ts", "level", "component", "msg"} and r["level"] in ("warn", "error")
        assert isinstance(r["ts"], float)
    comm = [json.loads(r["msg"]) for r in recs if r["component"] == "comm"]
    assert any(c["event"] == "no_job_secret" for c in comm), recs


def test_log_json_after_double_dash_is_not_taken(tmp_path):
    # What follows `--` belongs to the program ctorch launch starts: --log-json reaches it.
    env = {k: v for k, v in os.environ.items() if k != "CT_JOB_SECRET"}
    r = subprocess.run([cli_path(), "launch", "--nproc", "1", "--", "/bin/echo", "--log-json"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert "--log-json" in r.stdout, (r.stdout, r.stderr)


def test_help_mentions_log_json():
    r = subprocess.run([cli_path(), "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--log-json" in r.stdout


def test_train_nproc_gives_its_ranks_a_job_secret(tmp_path):
    """`ctorch train --nproc 2` without CT_JOB_SECRET: the launcher it runs makes one for the
    job, so no rank nor the store warns about running without one (the one-process run above
    does)."""
    lines = train(tmp_path, after=["--nproc", "2"])
    assert not any("no_job_secret" in l for l in lines), lines
