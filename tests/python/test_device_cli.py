"""`--device` of `ctorch train` / `ctorch generate` and the CUDA line of `ctorch version`, on the
CPU (this suite's machines): --device cpu is the default's run bit for bit; a GPU that cannot be
used (no libctorch_cuda.so, no GPU, a bad CTORCH_CUDA_LIB) is exit status 1 with the reason,
never a crash; a malformed device is exit status 2 naming the accepted forms; --fsdp / --dp on
a GPU are refused by name. Where a GPU is usable the failure cases use an index past the GPUs
the machine has instead (docs/cuda.md)."""
import os
import re
import subprocess

import pytest

from conftest import TINY, cli_path, ctorch

FORMS = "cpu, cuda, cuda:N"


def run(*args, env=None, timeout=300):
    e = dict(os.environ)
    if env:
        e.update(env)
    return subprocess.run([cli_path(), *map(str, args)], capture_output=True, text=True, timeout=timeout, env=e)


def no_crash(r):
    """Exited (no signal) and said nothing of a crash."""
    assert r.returncode >= 0, f"killed by signal {-r.returncode}:\n{r.stderr}"
    for bad in ("Segmentation", "Aborted", "core dumped", "AddressSanitizer", "runtime error:"):
        assert bad not in r.stderr, r.stderr


def cuda_line():
    lines = [l for l in ctorch("version").stdout.splitlines() if l.startswith("cuda:")]
    assert len(lines) == 1, lines
    return lines[0]


def gpu_usable(line):
    """Whether `ctorch version`'s cuda line names a GPU that opened ("cuda: N GPU(s); cuda:0 ...")."""
    return re.match(r"cuda: \d+ GPU\(s\); cuda:0 ", line) is not None


def the_reason(line):
    """The why of a cuda line that names no usable GPU (the text the CLI's failures carry)."""
    for key in ("not loaded: ", "no usable GPU: ", "does not open: "):
        if key in line:
            return line.split(key, 1)[1].strip()
    raise AssertionError(f"the cuda line names neither a GPU nor why not: {line}")


def test_version_has_a_cuda_line():
    line = cuda_line()
    if not gpu_usable(line):
        assert the_reason(line), line


def test_device_cpu_is_the_default_bit_for_bit(tmp_path):
    a, b = tmp_path / "default", tmp_path / "cpu"
    ctorch("train", *TINY, "--steps", 3, "--quiet", "--out", a)
    ctorch("train", *TINY, "--steps", 3, "--quiet", "--out", b, "--device", "cpu")
    ca, cb = (p / "checkpoint.safetensors" for p in (a, b))
    assert ca.read_bytes() == cb.read_bytes()

    def losses(p):  # a step's record less its timings and memory figures
        rows = [l for l in (p / "metrics.jsonl").read_text().splitlines() if '"loss"' in l and '"event"' not in l]
        return [re.sub(r'"(step_s|elapsed_s|cpu|mem_bytes)":[^,}]*', "", l) for l in rows]

    la, lb = losses(a), losses(b)
    assert len(la) == 3 and la == lb


def gpu_failure_case(line):
    """(device, texts its failure must name): cuda itself without a usable GPU, else an index
    past the machine's GPUs."""
    if gpu_usable(line):
        return "cuda:1023", ["cuda:1023", "GPU(s)"]
    return "cuda", ["cuda:0", the_reason(line)]


def test_train_on_an_unusable_gpu_fails_with_the_reason(tmp_path):
    dev, texts = gpu_failure_case(cuda_line())
    out = tmp_path / "run"
    r = run("train", *TINY, "--steps", 2, "--quiet", "--out", out, "--device", dev)
    no_crash(r)
    assert r.returncode == 1, r.stderr
    for t in texts:
        assert t in r.stderr, (t, r.stderr)
    assert not (out / "checkpoint.safetensors").exists()


@pytest.fixture(scope="module")
def full_causal(tmp_path_factory):
    """A checkpoint of TINY with full causal attention (what a GPU runs), 2 steps."""
    d = tmp_path_factory.mktemp("full-causal")
    ctorch("train", *TINY, "--steps", 2, "--quiet", "--out", d)
    return d / "checkpoint.safetensors"


def test_generate_on_an_unusable_gpu_fails_with_the_reason(full_causal):
    dev, texts = gpu_failure_case(cuda_line())
    r = run("generate", "--model", full_causal, "--max-new-tokens", 4, "--device", dev)
    no_crash(r)
    assert r.returncode == 1, r.stderr
    for t in texts:
        assert t in r.stderr, (t, r.stderr)
    assert r.stdout == "", r.stdout


def test_what_a_gpu_does_not_run_is_refused_by_name(tmp_path):
    """A window with dense attention (causal only there): refused before any GPU is opened.
    (Compiled mods run on GPUs: tests/python/test_cuda_emu_train.py.)"""
    r = run("train", *TINY, "--window", 6, "--dense-attention", "--steps", 1, "--quiet", "--out",
            tmp_path / "run2", "--device", "cuda")
    no_crash(r)
    assert r.returncode == 1 and "--window" in r.stderr and "FlexAttention" in r.stderr, r.stderr


@pytest.mark.parametrize("what", ["missing", "not a library", "no entry point"])
def test_a_bad_ctorch_cuda_lib_is_named(tmp_path, what):
    if what == "missing":
        lib = tmp_path / "nowhere" / "libctorch_cuda.so"
    elif what == "not a library":
        lib = tmp_path / "libctorch_cuda.so"
        lib.write_bytes(b"\x7fELF but not really" + bytes(200))
    else:  # a real shared library without ct_backend_cuda_entry: the C library itself
        lib = next(p for p in ("/lib/x86_64-linux-gnu/libm.so.6", "/lib/aarch64-linux-gnu/libm.so.6",
                               "/usr/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib/aarch64-linux-gnu/libm.so.6",
                               "/lib64/libm.so.6") if os.path.exists(p))
    env = {"CTORCH_CUDA_LIB": str(lib)}
    line = [l for l in run("version", env=env).stdout.splitlines() if l.startswith("cuda:")]
    assert len(line) == 1 and line[0].startswith("cuda: not loaded: ") and str(lib) in line[0], line
    r = run("train", *TINY, "--steps", 2, "--quiet", "--out", tmp_path / "run", "--device", "cuda", env=env)
    no_crash(r)
    assert r.returncode == 1 and str(lib) in r.stderr and "not loaded" in r.stderr, r.stderr
    if what == "no entry point":
        assert "ct_backend_cuda_entry" in r.stderr, r.stderr


@pytest.mark.parametrize("dev", ["bogus", "", "gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:01", "cuda:1024",
                                 "cuda:99999999999", "cpu:0", "CUDA", "cuda:0 "])
def test_a_malformed_device_is_exit_2_naming_the_forms(tmp_path, full_causal, dev):
    r = run("train", *TINY, "--steps", 1, "--quiet", "--out", tmp_path / "run", "--device", dev)
    no_crash(r)
    assert r.returncode == 2 and FORMS in r.stderr and "--device" in r.stderr, r.stderr
    r = run("generate", "--model", full_causal, "--device", dev)
    no_crash(r)
    assert r.returncode == 2 and FORMS in r.stderr and "--device" in r.stderr, r.stderr


@pytest.mark.parametrize("mode", ["--fsdp", "--dp"])
def test_distributed_training_on_a_gpu_is_refused_by_name(tmp_path, mode):
    r = run("train", *TINY, "--steps", 1, "--quiet", "--out", tmp_path / "run", "--device", "cuda", mode,
            "--nproc", 2, timeout=120)
    no_crash(r)
    assert r.returncode == 1, r.stderr
    assert mode in r.stderr and "CPU only" in r.stderr, r.stderr
    assert not (tmp_path / "run" / "checkpoint.safetensors").exists()
