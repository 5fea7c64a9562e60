"""The pool's default thread count (src/core/threads.c), read from `ctorch version`: the online
CPUs; divided by the ranks on this host when a launcher says so (LOCAL_WORLD_SIZE from
`ctorch launch` / torchrun, MPI_LOCALNRANKS from MPICH, OMPI_COMM_WORLD_LOCAL_SIZE from Open
MPI), at least 1; CT_NUM_THREADS wins; values that are not a positive integer are ignored."""
import os
import re
import subprocess

import pytest

from conftest import cli_path  # noqa: E402,F401  (the one definition)

RANK_VARS = ("LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE")


def threads(**env):
    e = {k: v for k, v in os.environ.items() if k not in RANK_VARS and k != "CT_NUM_THREADS"}
    e.update(env)
    r = subprocess.run([cli_path(), "version"], capture_output=True, text=True, timeout=60, env=e)
    assert r.returncode == 0, r.stderr
    m = re.search(r"(\d+) threads", r.stdout)
    assert m, r.stdout
    return int(m.group(1))


CPUS = min(os.sysconf("SC_NPROCESSORS_ONLN"), 256)


def test_default_is_the_online_cpus():
    assert threads() == CPUS


@pytest.mark.parametrize("var", RANK_VARS)
def test_ranks_on_the_host_share_the_cores(var):
    assert threads(**{var: "2"}) == max(1, CPUS // 2)
    assert threads(**{var: str(CPUS * 4)}) == 1
    assert threads(**{var: "1"}) == CPUS


@pytest.mark.parametrize("bad", ["", "0", "-2", "x", "2x", "99999999999"])
def test_bad_rank_counts_are_ignored(bad):
    assert threads(LOCAL_WORLD_SIZE=bad) == CPUS


def test_ct_num_threads_wins():
    assert threads(CT_NUM_THREADS="3", LOCAL_WORLD_SIZE="2") == 3
