"""Make the in-tree package importable, and fail (never skip) when the oracle is missing."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

import torch  # noqa: E402,F401  (PyTorch is the oracle: an ImportError here fails the run)

# Compiled mods (docs/compile.md) cache their kernels: never in the user's real cache.
import tempfile  # noqa: E402

os.environ["CT_CACHE_DIR"] = tempfile.mkdtemp(prefix="ctorch-test-cache-")


# ---- the command line, shared by the CLI tests ------------------------------------------------
import subprocess  # noqa: E402

import pytest  # noqa: E402


def cli_path():
    """The ctorch executable under test: $CTORCH_CLI, else beside $CTORCH_LIB, else build/."""
    if os.environ.get("CTORCH_CLI"):
        return os.environ["CTORCH_CLI"]
    lib = os.environ.get("CTORCH_LIB")
    if lib:
        return os.path.join(os.path.dirname(lib), "ctorch")
    return os.path.join(ROOT, "build", "ctorch")


def ctorch(*args, ok=True, timeout=300):
    """Run `ctorch ARGS...` (arguments str()'d); with ok, its exit status must be 0."""
    r = subprocess.run([cli_path(), *map(str, args)], capture_output=True, text=True, timeout=timeout)
    if ok:
        assert r.returncode == 0, f"ctorch {' '.join(map(str, args))} failed ({r.returncode}):\n{r.stderr}"
    return r


# A tiny built-in corpus (512 tokens, documents of a 5-word sentence x 3 = 16 tokens) and model.
TINY = ["--vocab", 512, "--classes", 8, "--sentence", 5, "--repeats", 3, "--layers", 2, "--d-model", 32,
        "--heads", 4, "--kv-heads", 2, "--ffn", 48, "--context", 32, "--batch", 3]


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """The output directory of one tiny training run (TINY, a 6-token window, 30 steps), made
    once per session; tests read it and must not write into it."""
    d = tmp_path_factory.mktemp("tiny-run")
    ctorch("train", *TINY, "--window", 6, "--steps", 30, "--quiet", "--out", d)
    return d
