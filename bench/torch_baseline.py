#!/usr/bin/env python3
"""PyTorch baselines for `ctorch bench`: the same shapes, timed the same way (one warm-up,
median of repeats), printed as one JSON object. Run by the ctorch CLI; runnable by hand:

    /usr/bin/python3 bench/torch_baseline.py gemm --m 2048 --n 2048 --k 2048
    /usr/bin/python3 bench/torch_baseline.py lce --n 2048 --d 1024 --v 128256
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def timed(fn, repeats):
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts), "repeats": repeats}


def peak_rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main():
    p = argparse.ArgumentParser()
    p.add_argument("bench", choices=["gemm", "lce"])
    p.add_argument("--m", type=int, default=2048)
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--k", type=int, default=2048)
    p.add_argument("--d", type=int, default=1024)
    p.add_argument("--v", type=int, default=128256)
    p.add_argument("--dtype", default="f32")
    p.add_argument("--label-smoothing", type=float, default=0.0)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    torch.set_num_threads(int(os.environ.get("CT_NUM_THREADS", os.cpu_count())))
    torch.manual_seed(0)
    out = {"status": "ok", "torch_version": torch.__version__, "threads": torch.get_num_threads()}
    if a.bench == "gemm":
        x, y = torch.randn(a.m, a.k), torch.randn(a.k, a.n)
        t = timed(lambda: torch.matmul(x, y), a.repeats)
        out.update(t, gflops=2.0 * a.m * a.n * a.k / t["median_s"] * 1e-9)
    else:
        dt = torch.bfloat16 if a.dtype == "bf16" else torch.float32
        rss0 = peak_rss()
        h = (torch.randn(a.n, a.d) * 0.5).to(dt).requires_grad_()
        w = (torch.randn(a.v, a.d) * 0.05).to(dt).requires_grad_()
        y = torch.randint(0, a.v, (a.n,))

        def step():
            h.grad = None
            w.grad = None
            loss = F.cross_entropy(F.linear(h, w).float(), y, label_smoothing=a.label_smoothing)
            loss.backward()

        t = timed(step, a.repeats)
        out.update(t, gflops=6.0 * a.n * a.d * a.v / t["median_s"] * 1e-9, peak_rss_bytes=peak_rss(),
                   rss_before_bytes=rss0)
    json.dump(out, sys.stdout)
    print()


if __name__ == "__main__":
    main()
