#!/usr/bin/env python3
"""PyTorch 2.13 baselines for `ctorch bench gemm | lce | flex`, written as a PyTorch 2.13 user
would write them: the same shapes, timed the same way (one warm-up, median of repeats), one JSON
object on stdout. Run by the ctorch CLI with the source tree's .venv python (or $CTORCH_PYTHON)
and ctorch's thread count; runnable by hand:

    .venv/bin/python bench/torch_baseline.py gemm --m 2048 --n 2048 --k 2048
    .venv/bin/python bench/torch_baseline.py lce --mode chunked --n 2048 --d 1024 --v 128256
    .venv/bin/python bench/torch_baseline.py flex --case flex-sliding --seq 4096 --window 64

gemm   torch.matmul, f32 and bf16 operands.
lce    forward + backward of the loss of h W^T against y, one --mode per process (its peak RSS
       is its own):
         chunked           F.linear_cross_entropy(..., options=nn.LinearCrossEntropyOptions())
                           (the "auto" defaults; the JSON names what they resolved to)
         reference         F.linear_cross_entropy(..., options=None) (the reference path)
         unfused           F.cross_entropy(F.linear(h, W), y), eager
         unfused-compiled  the same function under torch.compile
flex   torch.compile(flex_attention) forward with the same mask (causal sliding window or
       causal) and block size; --eager runs flex_attention uncompiled (smoke tests). The
       backward is tried: PyTorch 2.13 refuses it on CPU, reported as "not supported: ...".
"""
import argparse
import os
import sys
import time
import warnings

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_common as tc  # noqa: E402

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def gemm(a):
    out = tc.header("eager", shape={"m": a.m, "n": a.n, "k": a.k}, op="torch.matmul")
    flops = 2.0 * a.m * a.n * a.k
    for name in ("f32", "bf16"):
        x = torch.randn(a.m, a.k).to(DTYPES[name])
        y = torch.randn(a.k, a.n).to(DTYPES[name])
        t = tc.timed(lambda: torch.matmul(x, y), a.repeats)
        t["gflops"] = flops / t["median_s"] * 1e-9
        out[name] = t
    out["gflops"] = out["f32"]["gflops"]  # the f32 figure, as before
    tc.dump(out)


LCE_MODES = ("chunked", "reference", "unfused", "unfused-compiled")


def lce(a):
    dt = DTYPES[a.dtype]
    mode = a.mode
    h = (torch.randn(a.n, a.d) * 0.5).to(dt).requires_grad_()
    w = (torch.randn(a.v, a.d) * 0.05).to(dt).requires_grad_()
    y = torch.randint(0, a.v, (a.n,))
    inputs = sum(t.numel() * t.element_size() for t in (h, w, y))
    extra = {"op": None, "shape": {"n": a.n, "d": a.d, "v": a.v}, "dtype": a.dtype,
             "label_smoothing": a.label_smoothing}
    if mode in ("chunked", "reference"):
        opts = torch.nn.LinearCrossEntropyOptions() if mode == "chunked" else None
        extra["op"] = "F.linear_cross_entropy(options=%s)" % (
            "nn.LinearCrossEntropyOptions()" if opts else "None")

        def loss_fn():
            return F.linear_cross_entropy(h, w, y, label_smoothing=a.label_smoothing, options=opts)

        if opts is not None:
            # what "auto" resolves to here (the op resolves it the same way at call time)
            r = opts._adjust(a.n, a.d, a.v, dt, h.device)
            extra["resolved"] = {"acc_policy": r.acc_policy, "chunking_method": r.chunking_method,
                                 "batch_chunk_size": r.batch_chunk_size, "acc_dtype": str(r.acc_dtype),
                                 "chunks": -(-a.n // r.batch_chunk_size)}
    else:
        extra["op"] = "F.cross_entropy(F.linear(h, W).float(), y)"

        def unfused(h, w, y):
            return F.cross_entropy(F.linear(h, w).float(), y, label_smoothing=a.label_smoothing)

        fn = torch.compile(unfused) if mode == "unfused-compiled" else unfused

        def loss_fn():
            return fn(h, w, y)

    def step():
        h.grad = None
        w.grad = None
        loss_fn().backward()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        step()  # the warm-up (and compilation)
        first = time.perf_counter() - t0
    # a chunked call that falls back to the reference path says so with a warning
    notes = sorted({str(c.message)[:300] for c in caught if "linear_cross_entropy" in str(c.message)
                    or "LinearCrossEntropy" in str(c.message) or "reference" in str(c.message)})
    warnings.filterwarnings("ignore")  # said once, in the JSON
    t = tc.timed_only(step, a.repeats)
    rss = tc.peak_rss()
    extra_peak = tc.profiled_peak_bytes(step)
    out = tc.header("compiled" if mode == "unfused-compiled" else "eager", case=mode, **extra)
    out.update(t, first_call_s=first, gflops=6.0 * a.n * a.d * a.v / t["median_s"] * 1e-9,
               peak_rss_bytes=rss, input_bytes=inputs, peak_tracked_extra_bytes=extra_peak,
               peak_tracked_bytes=inputs + extra_peak,
               tracked_by="torch.profiler profile_memory: CPU allocator bytes allocated during one "
                          "step (gradients included) + the inputs")
    if notes:
        out["warnings"] = notes
    if any("options`` ignored" in n for n in notes):  # e.g. label smoothing: the reference path ran
        out["resolved"] = "reference path (the chunked path refused these arguments; see warnings)"
    tc.dump(out)


FLEX_CASES = ("flex-sliding", "flex-causal")


def flex(a):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    dt = DTYPES[a.dtype]
    W = a.window
    if a.case == "flex-sliding":
        def mask_mod(b, h, q, kv):
            return (q >= kv) & (q - kv <= W)
    else:
        def mask_mod(b, h, q, kv):
            return q >= kv
    B, H, L, E = a.batch, a.heads, a.seq, a.head_dim
    mode = "eager" if a.eager else "compiled"
    extra = {"case": a.case, "op": "%s(flex_attention)" % ("torch.compile" if not a.eager else "eager"),
             "shape": {"batch": B, "heads": H, "seq": L, "head_dim": E, "window": W, "block_size": a.block_size},
             "dtype": a.dtype}
    t0 = time.perf_counter()
    bm = create_block_mask(mask_mod, B, H, L, L, device="cpu", BLOCK_SIZE=a.block_size)
    create_s = time.perf_counter() - t0
    q, k, v = (torch.randn(B, H, L, E).to(dt) for _ in range(3))
    fa = flex_attention if a.eager else torch.compile(flex_attention)

    def fwd():
        with torch.no_grad():
            return fa(q, k, v, block_mask=bm)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager flex_attention warns that it is not compiled
        t0 = time.perf_counter()
        fwd()
        first = time.perf_counter() - t0
        t = tc.timed_only(fwd, a.repeats)
        rss = tc.peak_rss()
        extra_peak = tc.profiled_peak_bytes(fwd)
        # the backward: PyTorch 2.13 refuses it on CPU; time it if it runs
        qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))
        do = torch.randn(B, H, L, E).to(dt)
        try:
            o = fa(qg, kg, vg, block_mask=bm)

            def bwd():
                torch.autograd.grad(fa(qg, kg, vg, block_mask=bm), (qg, kg, vg), do)

            torch.autograd.grad(o, (qg, kg, vg), do)
            back = {"status": "ok", "fwd_bwd": tc.timed(bwd, a.repeats)}
        except Exception as e:  # noqa: BLE001  (the reason is the result)
            back = {"status": "not supported: %s: %s" % (type(e).__name__, str(e).strip().splitlines()[0][:300])}
    inputs = 3 * B * H * L * E * q.element_size()
    kept = sum(min(i, W) + 1 for i in range(L)) if a.case == "flex-sliding" else L * (L + 1) // 2
    out = tc.header(mode, **extra)
    out.update(fwd=t, first_call_s=first, mask_create_s=create_s,
               gflops_fwd=4.0 * E * B * H * kept / t["median_s"] * 1e-9, peak_rss_bytes=rss,
               input_bytes=inputs, peak_tracked_extra_bytes=extra_peak,
               peak_tracked_bytes=inputs + extra_peak, backward=back)
    tc.dump(out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("bench", choices=["gemm", "lce", "flex"])
    p.add_argument("--m", type=int, default=2048)
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--k", type=int, default=2048)
    p.add_argument("--d", type=int, default=1024)
    p.add_argument("--v", type=int, default=128256)
    p.add_argument("--dtype", default="f32", choices=sorted(DTYPES))
    p.add_argument("--label-smoothing", type=float, default=0.0)
    p.add_argument("--mode", default="chunked", choices=LCE_MODES)
    p.add_argument("--case", default="flex-sliding", choices=FLEX_CASES)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--eager", action="store_true", help="flex: flex_attention without torch.compile")
    p.add_argument("--repeats", type=int, default=3)
    tc.add_threads_arg(p)
    a = p.parse_args()
    tc.set_threads(a.threads)
    torch.manual_seed(0)
    {"gemm": gemm, "lce": lce, "flex": flex}[a.bench](a)


if __name__ == "__main__":
    main()
