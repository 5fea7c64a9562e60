#!/usr/bin/env python3
"""PyTorch 2.13 baseline of `ctorch bench compile`: attention with the same score function as the
compiled mod (ALiBi: score + slope[h] * (kv - q)) under a causal mask, one warm-up and the median
of repeats, printed as one JSON object:
  dense  the reference maths, eager: the full score matrix, masked, softmax, forward + backward
         (the top-level median_s, as before)
  flex   what a 2.13 user writes: torch.compile(flex_attention) with that score_mod and a causal
         block mask, forward (--no-compile: flex_attention eager); its backward is tried, and
         reported as "not supported: ..." where PyTorch refuses it on CPU

    .venv/bin/python bench/torch_compile_baseline.py --seq 2048 --heads 1 --head-dim 64
"""
import argparse
import os
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_common as tc  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-compile", action="store_true", help="flex_attention eager (smoke tests)")
    tc.add_threads_arg(p)
    a = p.parse_args()
    tc.set_threads(a.threads)
    torch.manual_seed(0)
    H, L, E = a.heads, a.seq, a.head_dim
    q, k, v = (torch.randn(1, H, L, E, requires_grad=True) for _ in range(3))
    do = torch.randn(1, H, L, E)
    slope = torch.tensor([2.0 ** (-8.0 * (i + 1) / H) for i in range(H)])

    hh = torch.arange(H).view(1, H, 1, 1)
    qi = torch.arange(L).view(1, 1, L, 1)
    kv = torch.arange(L).view(1, 1, 1, L)

    def dense_step():
        s = (q @ k.transpose(-1, -2)) / E ** 0.5
        s = (s + slope[hh] * (kv - qi)).masked_fill(kv > qi, float("-inf"))
        o = torch.softmax(s, -1) @ v
        torch.autograd.grad(o, (q, k, v), do)

    dense = tc.timed(dense_step, a.repeats)
    out = tc.header("eager dense reference; %s flex_attention" % ("eager" if a.no_compile else "compiled"))
    out.update(dense)  # median_s, min_s, max_s, repeats: the dense forward + backward
    out["dense_fwd_bwd"] = dict(dense, mode="eager", op="softmax(q k^T / sqrt(E) + alibi, causal) v")

    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slope[h] * (kv_idx - q_idx)

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    bm = create_block_mask(causal, 1, H, L, L, device="cpu", BLOCK_SIZE=128)
    fa = flex_attention if a.no_compile else torch.compile(flex_attention)
    qd, kd, vd = (x.detach() for x in (q, k, v))

    def fwd():
        with torch.no_grad():
            return fa(qd, kd, vd, score_mod=alibi, block_mask=bm)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        fwd()
        first = time.perf_counter() - t0
        t = tc.timed_only(fwd, a.repeats)
        try:
            o = fa(q, k, v, score_mod=alibi, block_mask=bm)

            def fwd_bwd():
                torch.autograd.grad(fa(q, k, v, score_mod=alibi, block_mask=bm), (q, k, v), do)

            torch.autograd.grad(o, (q, k, v), do)
            back = {"status": "ok", "fwd_bwd": tc.timed(fwd_bwd, a.repeats)}
        except Exception as e:  # noqa: BLE001  (the reason is the result)
            back = {"status": "not supported: %s: %s" % (type(e).__name__, str(e).strip().splitlines()[0][:300])}
    out["flex_fwd"] = dict(t, mode="eager" if a.no_compile else "compiled", first_call_s=first,
                           op="%s(flex_attention)(score_mod=alibi, block_mask=causal)"
                              % ("eager" if a.no_compile else "torch.compile"))
    out["flex_backward"] = back
    out["peak_rss_bytes"] = tc.peak_rss()
    tc.dump(out)


if __name__ == "__main__":
    main()
