#!/usr/bin/env python3
"""PyTorch 2.13 side of `ctorch bench scaling`: the same work as each ctorch case at each thread
count (torch.set_num_threads), written the way a PyTorch user runs it, in one process; one JSON
object on stdout. Run by the ctorch CLI (cli/bench_scaling.c) with the source tree's .venv
python (or $CTORCH_PYTHON); runnable by hand:

    .venv/bin/python bench/torch_scaling.py --threads 1,2 --tiny --no-compile

Cases (shapes come from the CLI; --tiny's defaults below match `ctorch bench scaling --tiny`):
  gemm_f32, gemm_bf16  torch.matmul of two [n, n] matrices (f32; bf16 operands and result)
  lce                  forward + backward of cross_entropy(h W^T, y): the faster at each thread
                       count of F.linear_cross_entropy(options=nn.LinearCrossEntropyOptions())
                       (PyTorch's chunked fused op) and F.cross_entropy(F.linear(h, W), y)
                       (under torch.compile unless --no-compile); both are reported
  flex_fwd             flex_attention forward with a causal block mask (torch.compile'd unless
                       --no-compile), under no_grad
  flex_bwd             its backward alone (torch.autograd.grad on a kept graph); PyTorch 2.13's
                       compiled flex_attention refuses the backward on CPU: the row says so
  rmsnorm              F.rms_norm forward + backward (input and weight gradients), compiled
  swiglu               silu(a) * b of inp = [a | b] forward + backward, compiled
  adamw                torch.optim.AdamW(fused=True) step over one flat f32 parameter
  add                  torch.add(a, b, out=o) over n f32 values: the memory system's own
                       scaling (STREAM's add), the ceiling of the memory-bound rows
  train_step           bench/torch_train.py's SdpaGPT from ctorch's weights file (--weights):
                       forward, backward, clipping, AdamW, the model under torch.compile

torch.compile'd CPU kernels are specialised to the thread count they were compiled under
(inductor keys its cache on it), so each thread count resets dynamo and compiles afresh; the
first call at each count (the warm-up) is reported as first_call_s and excluded from the median.
"""
import argparse
import os
import statistics
import sys
import time
import warnings

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_common as tc  # noqa: E402


def ints(s):
    return [int(x) for x in s.replace(",", " ").split()]


def first_line(e):
    msg = str(e).strip().splitlines()
    return "%s: %s" % (type(e).__name__, (msg[0] if msg else "")[:300])


class Runner:
    def __init__(self, a):
        self.a = a
        self.compile = not a.no_compile

    def maybe_compile(self, fn):
        return torch.compile(fn) if self.compile else fn

    def per_threads(self, make, compiled=False):
        """make() -> (callable to time, extra dict) under the current thread count; called once per
        thread count after torch.set_num_threads and a dynamo reset. Returns seconds, first calls."""
        secs, firsts = [], []
        self.threads_seen = []
        self.repeats_run = []
        for n in self.a.threads:
            torch.set_num_threads(n)
            self.threads_seen.append(torch.get_num_threads())
            if self.compile:
                torch._dynamo.reset()
            fn = make()
            t0 = time.perf_counter()
            fn()
            firsts.append(time.perf_counter() - t0)
            # the median of --repeats timed calls after the warm-up; a call slower than --slow-s
            # (PyTorch's bf16 matmul without AVX512_BF16: ~1 min at 2048^3 on 2 cores) is the
            # figure alone, and an eager warm-up that slow is it (no compile in it); "repeats"
            # says how many calls the figure is
            if not compiled and firsts[-1] >= self.a.slow_s:
                ts = [firsts[-1]]  # an eager call that slow: its first call is the figure
            else:
                t0 = time.perf_counter()
                fn()
                ts = [time.perf_counter() - t0]
            while len(ts) < self.a.repeats and ts[0] < self.a.slow_s:
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
            self.repeats_run.append(len(ts))
            secs.append(statistics.median(ts))
        return secs, firsts

    def mode(self):
        return "compiled" if self.compile else "eager"


def case_gemm(r, dt):
    n = r.a.gemm
    x = torch.randn(n, n).to(dt)
    y = torch.randn(n, n).to(dt)
    secs, first = r.per_threads(lambda: (lambda: torch.matmul(x, y)))
    return {"op": "torch.matmul [%d, %d] x [%d, %d] %s" % (n, n, n, n, str(dt).replace("torch.", "")),
            "mode": "eager", "seconds": secs, "first_call_s": first}


def case_lce(r):
    N, D, V = r.a.lce
    h = (torch.randn(N, D) * 0.5).requires_grad_()
    w = (torch.randn(V, D) * 0.05).requires_grad_()
    y = torch.randint(0, V, (N,))
    opts = torch.nn.LinearCrossEntropyOptions()

    def unfused(h, w, y):
        return F.cross_entropy(F.linear(h, w), y)

    def step_of(loss_fn):
        def step():
            h.grad = None
            w.grad = None
            loss_fn().backward()
        return step

    variants = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s, f = r.per_threads(lambda: step_of(lambda: F.linear_cross_entropy(h, w, y, options=opts)))
        variants["chunked"] = {"op": "F.linear_cross_entropy(options=nn.LinearCrossEntropyOptions())",
                               "mode": "eager", "seconds": s, "first_call_s": f}

        def make():
            fn = r.maybe_compile(unfused)
            return step_of(lambda: fn(h, w, y))

        s, f = r.per_threads(make, r.compile)
        variants["unfused"] = {"op": "F.cross_entropy(F.linear(h, W), y)", "mode": r.mode(), "seconds": s,
                               "first_call_s": f}
    best, names = [], []
    for i in range(len(r.a.threads)):
        k = min(variants, key=lambda v: variants[v]["seconds"][i])
        best.append(variants[k]["seconds"][i])
        names.append(k)
    return {"op": "the faster of %s (chunked) and %s (unfused) at each thread count" % (
        variants["chunked"]["op"], variants["unfused"]["op"]), "mode": "best", "seconds": best, "best": names,
        "variants": variants}


def case_flex(r, backward):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    B, H, L, E, BS = r.a.flex
    q, k, v = (torch.randn(B, H, L, E) for _ in range(3))
    do = torch.randn(B, H, L, E)

    def causal(b, h, qi, kv):
        return qi >= kv

    bm = create_block_mask(causal, B, H, L, L, device="cpu", BLOCK_SIZE=BS)
    op = "%sflex_attention(q, k, v, block_mask=causal) [%d, %d, %d, %d] f32, block %d" % (
        "torch.compile " if r.compile else "", B, H, L, E, BS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager flex_attention warns that it is not compiled
        if not backward:
            def make():
                fa = r.maybe_compile(flex_attention)

                def fwd():
                    with torch.no_grad():
                        return fa(q, k, v, block_mask=bm)
                return fwd

            secs, first = r.per_threads(make, r.compile)
            return {"op": op + ", forward under no_grad", "mode": r.mode(), "seconds": secs, "first_call_s": first}

        def make():
            fa = r.maybe_compile(flex_attention)
            qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
            o = fa(qg, kg, vg, block_mask=bm)
            return lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)

        try:
            secs, first = r.per_threads(make, r.compile)
        except Exception as e:  # noqa: BLE001  (the reason is the result)
            return {"op": op + ", backward (autograd.grad on a kept graph)", "mode": r.mode(),
                    "status": "not supported: " + first_line(e), "seconds": [None] * len(r.a.threads)}
        return {"op": op + ", backward alone (autograd.grad on a kept graph)", "mode": r.mode(), "seconds": secs,
                "first_call_s": first}


def case_rmsnorm(r):
    N, C = r.a.rmsnorm
    x = torch.randn(N, C).requires_grad_()
    w = (1 + 0.1 * torch.randn(C)).requires_grad_()
    do = torch.randn(N, C)

    def f(x, w):
        return F.rms_norm(x, (C,), w, 1e-5)

    def make():
        fn = r.maybe_compile(f)

        def step():
            x.grad = None
            w.grad = None
            fn(x, w).backward(do)
        return step

    secs, first = r.per_threads(make, r.compile)
    return {"op": "F.rms_norm(x [%d, %d], (%d,), w, 1e-5) forward + backward (dx, dw)" % (N, C, C),
            "mode": r.mode(), "seconds": secs, "first_call_s": first}


def case_swiglu(r):
    N, Hd = r.a.swiglu
    inp = torch.randn(N, 2 * Hd).requires_grad_()
    do = torch.randn(N, Hd)

    def f(inp):
        a, b = inp.chunk(2, dim=-1)
        return F.silu(a) * b

    def make():
        fn = r.maybe_compile(f)

        def step():
            inp.grad = None
            fn(inp).backward(do)
        return step

    secs, first = r.per_threads(make, r.compile)
    return {"op": "a, b = inp.chunk(2, -1); F.silu(a) * b, inp [%d, %d], forward + backward" % (N, 2 * Hd),
            "mode": r.mode(), "seconds": secs, "first_call_s": first}


def case_adamw(r):
    P = r.a.adamw
    p = torch.nn.Parameter(torch.randn(P) * 0.02)
    p.grad = torch.randn(P) * 1e-3
    kw = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    try:
        opt = torch.optim.AdamW([p], fused=True, **kw)
        opt.step()
        kind = "fused=True"
    except (RuntimeError, ValueError) as e:
        opt = torch.optim.AdamW([p], foreach=True, **kw)
        kind = "foreach=True (fused refused: %s)" % first_line(e)
    secs, first = r.per_threads(lambda: opt.step)
    return {"op": "torch.optim.AdamW(%s).step() over one flat f32 parameter of %d" % (kind, P), "mode": "eager",
            "seconds": secs, "first_call_s": first}


def case_add(r):
    n = r.a.add
    a, b, o = torch.randn(n), torch.randn(n), torch.empty(n)
    secs, first = r.per_threads(lambda: (lambda: torch.add(a, b, out=o)))
    return {"op": "torch.add(a, b, out=o) over %d f32 values" % n, "mode": "eager", "seconds": secs,
            "first_call_s": first}


def case_train(r):
    import torch_train as tt

    model, tokens, tr, _ = tt.load_sdpa(r.a.weights, "causal")
    opt = tt.make_optimizer(model, tr)
    eos = tr.get("eos_token", -1)
    zl, ls = tr.get("z_loss", 0.0), tr.get("label_smoothing", 0.0)

    def make():
        fwd = r.maybe_compile(model)

        def step():
            opt.zero_grad(set_to_none=True)
            loss = fwd(tokens, eos, zl, ls)
            loss.backward()
            if tr.get("clip", 0) > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), tr["clip"])
            opt.step()
        return step

    secs, first = r.per_threads(make, r.compile)
    return {"op": "bench/torch_train.py SdpaGPT step (F.scaled_dot_product_attention is_causal, F.linear + "
                  "F.cross_entropy, clip, AdamW) from ctorch's weights; attention: "
                  + tt.mask_note(model.cfg, tokens, eos, "causal"),
            "mode": r.mode(), "seconds": secs, "first_call_s": first,
            "tokens": int(tokens.shape[0] * (tokens.shape[1] - 1))}


CASES = ("gemm_f32", "gemm_bf16", "lce", "flex_fwd", "flex_bwd", "rmsnorm", "swiglu", "adamw", "add", "train_step")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=ints, default=[1], help="thread counts, e.g. 1,2,4")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--no-compile", action="store_true", help="everything eager")
    p.add_argument("--slow-s", type=float, default=20.0,
                   help="a timed call slower than this is the figure alone (not a median of --repeats)")
    p.add_argument("--gemm", type=int, default=256)
    p.add_argument("--lce", type=ints, default=[128, 128, 2048], help="N,D,V")
    p.add_argument("--flex", type=ints, default=[1, 2, 256, 32, 64], help="B,H,L,E,block")
    p.add_argument("--rmsnorm", type=ints, default=[256, 128], help="N,C")
    p.add_argument("--swiglu", type=ints, default=[256, 128], help="N,H (inp [N, 2H])")
    p.add_argument("--adamw", type=int, default=1 << 16)
    p.add_argument("--add", type=int, default=1 << 16, help="values of each add operand")
    p.add_argument("--weights", default=None, help="train_step: the weights file ctorch wrote")
    a = p.parse_args()
    torch.manual_seed(0)
    r = Runner(a)
    run = {"gemm_f32": lambda: case_gemm(r, torch.float32), "gemm_bf16": lambda: case_gemm(r, torch.bfloat16),
           "lce": lambda: case_lce(r), "flex_fwd": lambda: case_flex(r, False),
           "flex_bwd": lambda: case_flex(r, True), "rmsnorm": lambda: case_rmsnorm(r),
           "swiglu": lambda: case_swiglu(r), "adamw": lambda: case_adamw(r), "add": lambda: case_add(r), "train_step": lambda: case_train(r)}
    out = tc.header(r.mode())
    out["threads"] = a.threads
    out["compile"] = r.compile
    out["cases"] = {}
    for name in a.cases.split(","):
        if name not in run:
            tc.fail(r.mode(), "unknown case '%s'" % name)
            return
        if name == "train_step" and not a.weights:
            tc.fail(r.mode(), "train_step needs --weights")
            return
        r.threads_seen, r.repeats_run = [], []
        try:
            c = run[name]()
        except Exception as e:  # noqa: BLE001  (one case failing says why; the others still run)
            c = {"op": name, "mode": r.mode(), "status": "failed: " + first_line(e),
                 "seconds": [None] * len(a.threads)}
        c.setdefault("status", "ok")
        c["threads"] = r.threads_seen  # torch.get_num_threads() at each count, as run
        c["repeats"] = r.repeats_run
        out["cases"][name] = c
    tc.dump(out)


if __name__ == "__main__":
    main()
