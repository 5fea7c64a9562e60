"""Shared pieces of the PyTorch baselines of `ctorch bench` (bench/*.py): the thread count,
the timing protocol of docs/benchmarks.md (one warm-up, median of repeats), peak RSS, and the
tracked peak that PyTorch exposes on CPU (torch.profiler's memory events).

Every baseline prints one JSON object holding at least
    {"status": "ok", "torch_version": torch.__version__, "threads": torch.get_num_threads(),
     "mode": "eager" | "compiled" | ...}
"""
import json
import os
import resource
import statistics
import sys
import tempfile
import time

import torch


def add_threads_arg(parser):
    parser.add_argument("--threads", type=int, default=0,
                        help="torch.set_num_threads (default: $CT_NUM_THREADS, else the online CPUs, "
                             "which is how ctorch picks its count)")


def set_threads(n):
    """Use ctorch's thread count: the CLI passes ct_num_threads(); by hand, CT_NUM_THREADS, else
    the number of online CPUs (ctorch's default, src/core/threads.c)."""
    if not n:
        env = os.environ.get("CT_NUM_THREADS", "")
        n = int(env) if env.strip().isdigit() and int(env) >= 1 else (os.cpu_count() or 1)
    torch.set_num_threads(n)
    return torch.get_num_threads()


def header(mode, **extra):
    out = {"status": "ok", "torch_version": torch.__version__, "threads": torch.get_num_threads(),
           "mode": mode}
    out.update(extra)
    return out


def timed(fn, repeats):
    """One warm-up call, then `repeats` timed calls: median, min, max (seconds)."""
    fn()
    return timed_only(fn, repeats)


def timed_only(fn, repeats):
    ts = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts), "repeats": len(ts)}


def peak_rss():
    """Peak resident set size of this process in bytes (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class _quiet_stderr:
    """The profiler writes start/stop lines and allocator warnings on fd 2: silence them."""

    def __enter__(self):
        sys.stderr.flush()
        self.saved = os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
        return self

    def __exit__(self, *exc):
        sys.stderr.flush()
        os.dup2(self.saved, 2)
        os.close(self.saved)
        return False


def profiled_peak_bytes(fn):
    """Peak of the CPU allocator's allocated bytes during one call of fn, counted from the start
    of the call (torch.profiler with profile_memory=True: its "[memory]" events carry the running
    "Total Allocated"). PyTorch has no max_memory_allocated() for CPU; this is what it exposes.
    Blocks allocated before the call are not counted, and their frees do not lower the count."""
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr():
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
        fd, path = tempfile.mkstemp(suffix=".json", prefix="ctorch-bench-prof-")
        os.close(fd)
        try:
            prof.export_chrome_trace(path)
            with open(path) as f:
                trace = json.load(f)
        finally:
            os.unlink(path)
    peak = 0
    for e in trace.get("traceEvents", []):
        if e.get("name") == "[memory]":
            peak = max(peak, int(e.get("args", {}).get("Total Allocated", 0)))
    return peak


def dump(out):
    json.dump(out, sys.stdout)
    print()


def fail(mode, why, **extra):
    """A baseline that cannot run prints a status naming the reason (never a traceback alone)."""
    out = header(mode, **extra)
    out["status"] = why
    dump(out)
