"""`ctorch bench comm` (docs/comm.md): the report's shape, quiet and --contended (one busy
process per core for the measurement), with MPICH's baseline in the same run. No timing decides
anything here: the figures are only checked to be measured."""
import json
import os
import shutil

from conftest import ctorch  # noqa: E402


def report(*extra):
    r = ctorch("bench", "comm", "--sizes", "8,1K", "--repeats", 3, "--json", *extra, timeout=600)
    return json.loads(r.stdout)


def check_rows(d):
    assert set(d["ops"]) == {"all_reduce", "all_gather_single", "reduce_scatter_single"}
    for op, rows in d["ops"].items():
        assert [r["bytes"] for r in rows] == [8, 1024], op
        for r in rows:
            assert r["ctorch"]["time_us"] > 0 and r["ctorch"]["busbw_gbps"] > 0
            assert r["mpi"]["time_us"] > 0, "MPICH's baseline is missing"
            assert r["latency_ratio"] > 0 and r["busbw_ratio"] > 0
    s = d["summary"]
    assert s["all_reduce_8B_latency_vs_mpi"] > 0 and s["all_reduce_8B_min_latency_vs_mpi"] > 0


def test_quiet_report():
    assert shutil.which("mpiexec"), "mpiexec is missing (scripts/setup.sh installs MPICH)"
    d = report()
    assert d["bench"] == "comm" and d["ranks"] == 2 and not d["contended"]
    assert d["busy_processes"] == 0
    assert d["mpi_baseline"].startswith("MPICH")
    check_rows(d)


def test_contended_report():
    d = report("--contended")
    assert d["contended"] and d["busy_processes"] == min(os.cpu_count(), 512)
    check_rows(d)


def test_bad_options():
    for bad in (["--sizes", "8,lots"], ["--repeats", "2"], ["--backend", "carrier-pigeon"]):
        r = ctorch("bench", "comm", *bad, ok=False)
        assert r.returncode != 0 and r.stderr.strip(), bad
