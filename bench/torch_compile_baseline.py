#!/usr/bin/env python3
"""PyTorch 1.13 baseline of `ctorch bench compile`: dense reference attention with the same
score function as the compiled mod (ALiBi: score + slope[h] * (kv - q), causal mask), forward
and backward, one warm-up and the median of repeats, printed as one JSON object. PyTorch 1.13
has no flex_attention; this is the maths it would run eagerly (the full score matrix).

    /usr/bin/python3 bench/torch_compile_baseline.py --seq 2048 --heads 1 --head-dim 64
"""
import argparse
import json
import os
import statistics
import time

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    torch.set_num_threads(int(os.environ.get("CT_NUM_THREADS", os.cpu_count())))
    torch.manual_seed(0)
    H, L, E = a.heads, a.seq, a.head_dim
    q, k, v = (torch.randn(1, H, L, E, requires_grad=True) for _ in range(3))
    do = torch.randn(1, H, L, E)
    slope = torch.tensor([2.0 ** (-8.0 * (i + 1) / H) for i in range(H)])

    def score_mod(s, b, h, qi, kv):
        return s + slope[h] * (kv - qi)

    h = torch.arange(H).view(1, H, 1, 1)
    qi = torch.arange(L).view(1, 1, L, 1)
    kv = torch.arange(L).view(1, 1, 1, L)

    def step():
        s = (q @ k.transpose(-1, -2)) / E ** 0.5
        s = score_mod(s, 0, h, qi, kv).masked_fill(kv > qi, float("-inf"))
        o = torch.softmax(s, -1) @ v
        torch.autograd.grad(o, (q, k, v), do)

    step()
    ts = []
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        step()
        ts.append(time.perf_counter() - t0)
    print(json.dumps({"status": "ok", "torch_version": torch.__version__, "threads": torch.get_num_threads(),
                      "median_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts),
                      "repeats": a.repeats}))


if __name__ == "__main__":
    main()
