"""`ctorch telemetry`'s GPU section (NVML) against NVML's own Python binding (pynvml, from
nvidia-ml-py) reading the same library: the fake NVML built with the tests (fake_nvml.so,
tests/c/fake_nvml.c: two GPUs, the second refusing power and temperature) and, where this
machine has one, the real libnvidia-ml. Without NVML, or with a file that is not NVML, no GPU
is listed, nothing is invented, and gpu_status says why."""
import ctypes
import json
import os
import subprocess

import pynvml

from conftest import ROOT, cli_path

FIELDS = ["name", "memory_used_bytes", "memory_total_bytes", "utilisation_pct", "memory_utilisation_pct",
          "power_w", "sm_mhz", "memory_mhz", "temperature_c"]


def fake_nvml():
    lib = os.environ.get("CTORCH_LIB")
    d = os.path.dirname(lib) if lib else os.path.join(ROOT, "build")
    path = os.path.join(d, "fake_nvml.so")
    assert os.path.isfile(path), f"{path} missing: it is built with the library (CMake target fake_nvml)"
    return path


def telemetry(*args, nvml=None, **env_extra):
    """Run `ctorch telemetry ARGS` with CTORCH_NVML_LIB=nvml (unset when None); (stdout, stderr)."""
    env = {k: v for k, v in os.environ.items() if k not in ("CTORCH_NVML_LIB", "FAKE_NVML_COUNT",
                                                           "FAKE_NVML_INIT_ERROR")}
    if nvml is not None:
        env["CTORCH_NVML_LIB"] = nvml
    env.update(env_extra)
    if "--watch" not in args:
        args = (*args, "--watch", "0.05", "--count", "1")  # one sample, without the 0.5 s default wait
    r = subprocess.run([cli_path(), "telemetry", *args], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, f"ctorch telemetry {args} failed ({r.returncode}): {r.stderr}"
    assert r.stderr == "", r.stderr
    return r.stdout, r.stderr


def telemetry_json(**kw):
    out, _ = telemetry("--json", **kw)
    return json.loads(out)


def pynvml_view(lib):
    """Every GPU as pynvml reads it from `lib` (a path; None: its own search for the real NVML),
    in ctorch's JSON terms: a refused query is None."""
    pynvml.nvmlLib = ctypes.CDLL(lib) if lib else None
    pynvml.nvmlInit()
    try:
        def ask(f, *a):
            try:
                return f(*a)
            except pynvml.NVMLError:
                return None

        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = ask(pynvml.nvmlDeviceGetMemoryInfo, h)
            util = ask(pynvml.nvmlDeviceGetUtilizationRates, h)
            mw = ask(pynvml.nvmlDeviceGetPowerUsage, h)
            gpus.append({
                "index": i,
                "name": ask(pynvml.nvmlDeviceGetName, h),
                "memory_used_bytes": mem.used if mem else None,
                "memory_total_bytes": mem.total if mem else None,
                "utilisation_pct": util.gpu if util else None,
                "memory_utilisation_pct": util.memory if util else None,
                "power_w": mw / 1000 if mw is not None else None,
                "sm_mhz": ask(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM),
                "memory_mhz": ask(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_MEM),
                "temperature_c": ask(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU),
            })
        return gpus
    finally:
        pynvml.nvmlShutdown()
        pynvml.nvmlLib = None


def test_fake_nvml_every_field():
    fake = fake_nvml()
    want = pynvml_view(fake)
    # the fake's shape, so both paths (answered, refused) are exercised
    assert len(want) == 2 and want[1]["power_w"] is None and want[1]["temperature_c"] is None
    assert all(v is not None for v in want[0].values())
    got = telemetry_json(nvml=fake)
    assert got["gpu_status"] is None
    assert got["gpus"] == want
    # the rest of the sample is still there
    assert got["memory"]["rss_bytes"] > 0 and got["cpu"]["count"] >= 1

    text, _ = telemetry(nvml=fake)
    lines = text.splitlines()
    g1 = lines.index("gpu1                  Fake GPU B")
    assert "gpu0                  Fake GPU A" in lines
    assert "  power               123.5 W" in lines
    assert "  SM clock            1980 MHz" in lines and "  memory clock        3201 MHz" in lines
    assert "  memory (used/total) 1.1 GiB / 140.4 GiB" in lines
    assert lines[g1 + 4] == "  power               unavailable"
    assert lines[g1 + 7] == "  temperature         unavailable"
    assert not any(line.startswith("GPUs") for line in lines)


def test_fake_nvml_watch():
    out, _ = telemetry("--json", "--watch", "0.1", "--count", "2", nvml=fake_nvml())
    samples = [json.loads(line) for line in out.splitlines()]
    assert len(samples) == 2 and all(len(s["gpus"]) == 2 for s in samples)


def test_fake_nvml_failures():
    fake = fake_nvml()
    # nvmlInit refused: NVML's own words for the code, as pynvml gives them
    pynvml.nvmlLib = ctypes.CDLL(fake)
    os.environ["FAKE_NVML_INIT_ERROR"] = "9"
    try:
        pynvml.nvmlInit()
        raise AssertionError("the fake's nvmlInit should have failed")
    except pynvml.NVMLError as e:
        words = str(e)
    finally:
        del os.environ["FAKE_NVML_INIT_ERROR"]
        pynvml.nvmlLib = None
    assert words == "Driver Not Loaded"
    j = telemetry_json(nvml=fake, FAKE_NVML_INIT_ERROR="9")
    assert j["gpus"] == [] and j["gpu_status"] == f"NVML initialisation failed: {words} (NVML error 9)"
    text, _ = telemetry(nvml=fake, FAKE_NVML_INIT_ERROR="9")
    assert f"GPUs                  unavailable: NVML initialisation failed: {words}" in text
    assert "gpu0" not in text

    j = telemetry_json(nvml=fake, FAKE_NVML_COUNT="0")
    assert j["gpus"] == [] and j["gpu_status"] == "NVML lists no GPU"

    # more GPUs than a sample holds (16): the first 16, and a note saying so
    j = telemetry_json(nvml=fake, FAKE_NVML_COUNT="20")
    assert [g["index"] for g in j["gpus"]] == list(range(16))
    assert j["gpu_status"] == "NVML lists 20 GPUs; the first 16 are shown"


def test_without_fake_nvml():
    """NVML as this machine has it: the real library through pynvml when it loads, else none."""
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        have = True
    except OSError:
        have = False
    j = telemetry_json()
    text, _ = telemetry()
    if not have:
        assert j["gpus"] == [] and j["gpu_status"].startswith("NVML not found: ")
        assert "libnvidia-ml.so.1" in j["gpu_status"]
        assert "GPUs                  unavailable: NVML not found: " in text and "gpu0" not in text
        return
    want = pynvml_view(None)
    assert len(j["gpus"]) == min(len(want), 16)
    for g, w in zip(j["gpus"], want):
        # fixed figures equal; moving ones present exactly when NVML gives them, and plausible
        for k in ("index", "name", "memory_total_bytes"):
            assert g[k] == w[k], (k, g, w)
        for k in FIELDS:
            assert (g[k] is None) == (w[k] is None), (k, g, w)
        if g["memory_used_bytes"] is not None:
            assert 0 <= g["memory_used_bytes"] <= g["memory_total_bytes"]
        for k in ("utilisation_pct", "memory_utilisation_pct"):
            assert g[k] is None or 0 <= g[k] <= 100
        for k in ("power_w", "sm_mhz", "memory_mhz"):
            assert g[k] is None or g[k] >= 0
        assert g["temperature_c"] is None or 0 < g["temperature_c"] < 130


def test_not_nvml(tmp_path):
    """Files that are not NVML: a clear reason naming CTORCH_NVML_LIB, no GPU, no crash."""
    missing = str(tmp_path / "nope.so")
    j = telemetry_json(nvml=missing)
    assert j["gpus"] == []
    assert j["gpu_status"].startswith(f"NVML could not be loaded from CTORCH_NVML_LIB={missing}: ")

    text_file = tmp_path / "libnvidia-ml.so.1"
    text_file.write_text("not a shared library\n" * 10)
    j = telemetry_json(nvml=str(text_file))
    assert j["gpus"] == [] and j["gpu_status"].startswith(f"NVML could not be loaded from CTORCH_NVML_LIB={text_file}")

    # a real shared library without NVML's entry points: libctorch itself
    lib = os.environ.get("CTORCH_LIB") or os.path.join(ROOT, "build", "libctorch.so")
    j = telemetry_json(nvml=lib)
    assert j["gpus"] == [] and j["gpu_status"] == f"NVML library {lib} lacks nvmlInit_v2 (not NVML, or an NVML too old)"

    # a name that is not ASCII: the reason stays printable ASCII (valid JSON, one line)
    odd = str(tmp_path / "nvml-\u00e9\u6f22.so")
    out, _ = telemetry("--json", nvml=odd)
    assert len(out.splitlines()) == 1
    status = json.loads(out)["gpu_status"]
    assert status.isascii() and status.isprintable() and "nvml-" in status
