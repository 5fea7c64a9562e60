"""PyTorch's figures beside `ctorch bench cuda`, on the same GPU: GEMM TFLOP/s (f32 with TF32
off, bf16 with f32 output) at the shapes ctorch times, and the linear + cross-entropy loss at
N x D=4096 x V=128256 bf16, forward + backward, unfused (F.linear + F.cross_entropy) and under
torch.compile: median time (CUDA synchronised wall clock, one warm-up, then --repeats) and
peak memory above the inputs and gradient buffers (torch.cuda.max_memory_allocated); and the
training steps ctorch timed (--train MODEL:WEIGHTS:B:DTYPE:MODES, one per row): bench/
torch_train.py's SdpaGPT (imported, not copied) loaded from the weights file `ctorch bench cuda`
wrote (ctorch's initial parameters), on the GPU, F.scaled_dot_product_attention is_causal,
F.linear + F.cross_entropy, clip_grad_norm_ 1, AdamW(fused=True) with ctorch's options; f32
(TF32 off, as ctorch's f32) or bf16 under torch.autocast("cuda", dtype=torch.bfloat16); eager
and/or torch.compile(model) (MODES "eager", "compiled" or "eager+compiled"): tokens/s (median
of --repeats steps after two warm-up steps, each read back and synchronised) and
torch.cuda.max_memory_allocated from before the model moved to the GPU.

FlexAttention rows (--flex NAME:B:H:L:E:WINDOW:BLOCK, one per ctorch row, bf16, q / k / v
[B, H, L, E] uniform in [-1, 1)): the mask kv <= q, with WINDOW > 0 also q - kv <= WINDOW
(a causal sliding window), as a BlockMask of BLOCK (create_block_mask on the GPU, built once):
torch.compile(flex_attention) with it; F.scaled_dot_product_attention with the same mask as a
boolean [L, L] tensor; causal flash SDPA (sdpa_kernel(SDPBackend.FLASH_ATTENTION), is_causal:
for a window the causal attention, a reference, not the same result). Each: the forward (no
grad), the forward + backward (out.backward(dout) into q, k, v) with
torch.use_deterministic_algorithms off, and again with it on; median of --repeats after two
warm-up runs (the first compiles), and torch.cuda.max_memory_allocated above what was
allocated before the mask and the inputs. What fails (out of memory, a backend that refuses the
shape or determinism) is the row's "error", never a figure. --flex-on-cpu runs these rows on
the CPU with flex_attention uncompiled, a check of the script where no GPU is.

$CTORCH_BENCH_DEADLINE (seconds since the epoch; scripts/test-cuda.sh sets it from its time
budget): past it, training and flex entries not yet started are not run and say so, so that the
JSON still comes back with what was measured.

--tiny: small GEMM shapes (cli/bench_cuda.c's --tiny); --sections: gemm, loss (comma-separated,
"none" for neither; default both).

Prints one JSON object. Without torch, or without a CUDA device, it says so
({"status": "not installed" | "no cuda", "reason": ...}) and never invents figures.
"""
import argparse
import json
import statistics
import sys
import time

# The shapes of cli/bench_cuda.c (case, trans_a, trans_b, M, N, K), in its order.
SHAPES = [
    ("square 4096", False, False, 4096, 4096, 4096),
    ("qkv forward", False, True, 8192, 2304, 768),
    ("qkv dinput", False, False, 8192, 768, 2304),
    ("qkv dweight", True, False, 2304, 768, 8192),
    ("attn proj forward", False, True, 8192, 768, 768),
    ("mlp up forward", False, True, 8192, 3072, 768),
    ("mlp down forward", False, True, 8192, 768, 3072),
    ("mlp down dinput", False, False, 8192, 3072, 768),
    ("mlp down dweight", True, False, 768, 3072, 8192),
    ("lm head forward", False, True, 8192, 50304, 768),
    ("lm head dinput", False, False, 8192, 768, 50304),
    ("lm head dweight", True, False, 50304, 768, 8192),
]
TINY_SHAPES = [
    ("tiny square 96", False, False, 96, 96, 96),
    ("tiny nt", False, True, 64, 72, 40),
    ("tiny tn", True, False, 40, 48, 64),
]


def past_deadline():
    """The entry to record instead of running one, past $CTORCH_BENCH_DEADLINE; else None."""
    import os

    d = os.environ.get("CTORCH_BENCH_DEADLINE")
    try:
        if d and time.time() > float(d):
            return {"error": f"not run: past CTORCH_BENCH_DEADLINE ({d}, the caller's time budget)"}
    except ValueError:
        return {"error": f"not run: CTORCH_BENCH_DEADLINE={d!r} is not a number of seconds"}
    return None


def emit(obj):
    print(json.dumps(obj))
    sys.exit(0)


def timed(torch, fn, repeats, warm=1):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    xs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        xs.append(time.perf_counter() - t0)
    return statistics.median(xs)


def gemm_cases(torch, dev, repeats, quick, tiny=False):
    out = []
    for case, ta, tb, m, n, k in TINY_SHAPES if tiny else SHAPES[:4] if quick else SHAPES:
        for dtype in ("f32", "bf16"):
            row = {"case": case, "dtype": dtype, "m": m, "n": n, "k": k}
            try:
                dt = torch.float32 if dtype == "f32" else torch.bfloat16
                g = torch.Generator(device=dev).manual_seed(1)
                a = torch.rand((k, m) if ta else (m, k), device=dev, generator=g).to(dt)
                b = torch.rand((n, k) if tb else (k, n), device=dev, generator=g).to(dt)
                a = a.t() if ta else a
                b = b.t() if tb else b
                c = torch.empty((m, n), device=dev, dtype=torch.float32)
                if dtype == "f32":
                    fn = lambda: torch.matmul(a, b, out=c)  # noqa: E731
                else:
                    # bf16 operands, f32 result (ctorch's contract): out_dtype where torch has it
                    fn = lambda: torch.mm(a, b, out_dtype=torch.float32)  # noqa: E731
                    try:
                        fn()
                    except TypeError:
                        fn = lambda: torch.matmul(a, b).float()  # noqa: E731
                        row["note"] = "bf16 result converted to f32 (no out_dtype)"
                t = timed(torch, fn, repeats, warm=2)
                row["median_s"] = t
                row["tflops"] = 2.0 * m * n * k / t / 1e12
                del a, b, c
            except Exception as e:  # a shape that does not fit or a missing kernel: say so
                row["error"] = f"{type(e).__name__}: {e}"
            out.append(row)
            torch.cuda.empty_cache()
    return out


def loss_cases(torch, dev, n, repeats, D=4096, V=128256):
    import torch.nn.functional as F

    g = torch.Generator(device=dev).manual_seed(2)
    h = (torch.rand((n, D), device=dev, generator=g) * 2 - 1).to(torch.bfloat16).requires_grad_()
    w = ((torch.rand((V, D), device=dev, generator=g) * 2 - 1) * 0.05).to(torch.bfloat16).requires_grad_()
    y = torch.randint(0, V, (n,), device=dev, generator=g)

    def step(f):
        def run():
            h.grad = None
            w.grad = None
            f(h, w, y).backward()
        return run

    def unfused(h_, w_, y_):
        return F.cross_entropy(F.linear(h_, w_).float(), y_)

    out = []
    for name, f in (("unfused", unfused), ("compiled", None)):
        row = {"case": name}
        try:
            if f is None:
                f = torch.compile(unfused)
            run = step(f)
            run()  # allocates the gradient buffers (and compiles)
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            row["median_s"] = timed(torch, run, repeats)
            row["peak_above_inputs_bytes"] = torch.cuda.max_memory_allocated() - base
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"
        out.append(row)
        torch.cuda.empty_cache()
    return out


def train_row(torch, dev, tt, tensors, meta, name, batch, dtype, mode, repeats):
    """One training-step row (see the module's docstring); its tensors die with the call."""
    row = {"model": name, "batch": batch, "dtype": dtype, "mode": mode}
    cuda = dev.type == "cuda"
    try:
        cfg = json.loads(meta["config"])
        tr = json.loads(meta.get("train", "{}"))
        B, T = batch, cfg["context"]
        row["seq"] = T
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(dev)
        model = tt.SdpaGPT(cfg, tensors, "causal").to(dev)
        opt = tt.make_optimizer(model, tr, fused=True)
        g = torch.Generator(device=dev).manual_seed(3)
        tokens = torch.randint(0, cfg["vocab_size"], (B, T + 1), device=dev, generator=g)
        fwd = torch.compile(model) if mode == "compiled" else model
        clip = tr.get("clip", 1.0)
        sync = torch.cuda.synchronize if cuda else (lambda: None)

        def step():
            opt.zero_grad(set_to_none=True)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dtype == "bf16"):
                loss = fwd(tokens)
            loss.backward()
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            return float(loss.detach())  # one read-back per step, as ctorch's

        t0 = time.perf_counter()
        losses = [step(), step()]  # warm-up (and compilation)
        sync()
        row["warmup_s"] = time.perf_counter() - t0
        xs = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            losses.append(step())
            sync()
            xs.append(time.perf_counter() - t0)
        med = statistics.median(xs)
        row.update(median_s=med, min_s=min(xs), max_s=max(xs), repeats=repeats, tokens_per_s=B * T / med,
                   loss_first=losses[0], loss_last=losses[-1])
        if cuda:
            row["max_memory_allocated"] = torch.cuda.max_memory_allocated(dev)
    except Exception as e:  # out of memory, a compiler failure: say so, keep going
        msg = str(e).strip().splitlines()
        row["error"] = f"{type(e).__name__}: {msg[0] if msg else ''}"
    return row


def train_cases(torch, dev, specs, repeats):
    """The training-step rows: one per (spec, mode) of --train MODEL:WEIGHTS:B:DTYPE:MODES."""
    import gc
    import os

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch_train as tt

    out = []
    loaded = (None, None)
    for spec in specs:
        parts = spec.split(":")
        modes = parts[4].split("+") if len(parts) == 5 else []
        if len(parts) != 5 or parts[3] not in ("f32", "bf16") or not parts[2].isdigit() or \
                not modes or any(m not in ("eager", "compiled") for m in modes):
            out.append({"spec": spec, "error": "expected MODEL:WEIGHTS:B:f32|bf16:eager|compiled|eager+compiled"})
            continue
        name, path, batch, dtype = parts[0], parts[1], int(parts[2]), parts[3]
        if loaded[0] != path:
            loaded = (None, None)
            try:
                loaded = (path, tt.read_safetensors(path))
            except Exception as e:
                out.extend({"model": name, "batch": batch, "dtype": dtype, "mode": m,
                            "error": f"reading {path}: {type(e).__name__}: {e}"} for m in modes)
                continue
        tensors, meta = loaded[1]
        for mode in modes:
            late = past_deadline()
            if late:
                out.append({"model": name, "batch": batch, "dtype": dtype, "mode": mode, **late})
                continue
            out.append(train_row(torch, dev, tt, tensors, meta, name, batch, dtype, mode, repeats))
            if mode == "compiled":
                torch._dynamo.reset()
            gc.collect()
    return out


def first_line(e):
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0][:300] if msg else ''}"


def flex_row(torch, dev, name, B, H, L, E, W, bs, repeats, compiled):
    """One flex row (see the module's docstring); its tensors die with the call."""
    import contextlib
    import warnings

    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    row = {"case": name, "B": B, "H": H, "L": L, "E": E, "window": W, "block_size": bs, "dtype": "bf16"}

    def mask_mod(b, h, q, kv):
        keep = q >= kv
        if W:
            keep = keep & (q - kv <= W)
        return keep

    if cuda:
        torch.cuda.empty_cache()
        sync()
        base = torch.cuda.memory_allocated(dev)
    t0 = time.perf_counter()
    bm = create_block_mask(mask_mod, None, None, L, L, device=dev, BLOCK_SIZE=bs)
    sync()
    row["mask_create_s"] = time.perf_counter() - t0
    g = torch.Generator(device=dev).manual_seed(5)
    q, k, v, dout = ((torch.rand((B, H, L, E), device=dev, generator=g) * 2 - 1).to(torch.bfloat16)
                     for _ in range(4))
    fa = torch.compile(flex_attention, dynamic=False) if compiled else flex_attention

    def flex_fn(q_, k_, v_):
        return fa(q_, k_, v_, block_mask=bm)

    dense = {}

    def sdpa_mask_fn(q_, k_, v_):
        if "mask" not in dense:  # the boolean [L, L] mask, made once (with the first call)
            i = torch.arange(L, device=dev)
            dense["mask"] = mask_mod(None, None, i[:, None], i[None, :])
        return F.scaled_dot_product_attention(q_, k_, v_, attn_mask=dense["mask"])

    def flash_fn(q_, k_, v_):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q_, k_, v_, is_causal=True)

    methods = (("flex_compiled", "torch.compile(flex_attention)" if compiled else "flex_attention (eager)", flex_fn),
               ("sdpa_bool_mask", "F.scaled_dot_product_attention(attn_mask=bool [L, L])", sdpa_mask_fn),
               ("sdpa_causal_flash", "F.scaled_dot_product_attention(is_causal=True), FLASH_ATTENTION"
                + (" (causal, not the window)" if W else ""), flash_fn))
    for key, op, fn in methods:
        m = {"op": op}
        qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))

        def fwd():
            with torch.no_grad():
                fn(q, k, v)

        def fwd_bwd():
            qg.grad = kg.grad = vg.grad = None
            fn(qg, kg, vg).backward(dout)

        for pas, run, det in (("fwd", fwd, False), ("fwd_bwd", fwd_bwd, False),
                              ("fwd_bwd_deterministic", fwd_bwd, True)):
            r = past_deadline()
            if r:
                m[pas] = r
                continue
            r = {}
            try:
                torch.use_deterministic_algorithms(det)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # eager flex_attention (the CPU check) warns
                    t0 = time.perf_counter()
                    run()
                    run()
                    sync()
                    r["first_calls_s"] = time.perf_counter() - t0  # two warm-up calls, the compilation
                    if cuda:
                        torch.cuda.reset_peak_memory_stats(dev)
                    xs = []
                    for _ in range(repeats):
                        t0 = time.perf_counter()
                        run()
                        sync()
                        xs.append(time.perf_counter() - t0)
                r.update(median_s=statistics.median(xs), min_s=min(xs), max_s=max(xs), repeats=repeats)
                if cuda:
                    r["peak_bytes"] = torch.cuda.max_memory_allocated(dev) - base
            except Exception as e:  # out of memory, a refused backend or determinism: say so
                r = {"error": first_line(e)}
            finally:
                torch.use_deterministic_algorithms(False)
                qg.grad = kg.grad = vg.grad = None
            m[pas] = r
            if cuda:
                torch.cuda.empty_cache()
        row[key] = m
        dense.clear()
        del qg, kg, vg
    if compiled:
        torch._dynamo.reset()
    return row


def flex_cases(torch, dev, specs, repeats, compiled=True):
    """The flex rows: one per --flex NAME:B:H:L:E:WINDOW:BLOCK, in order."""
    import gc

    out = []
    for spec in specs:
        parts = spec.split(":")
        if len(parts) != 7 or not all(p.isdigit() for p in parts[1:]) or \
                min(int(p) for p in parts[1:5] + parts[6:]) < 1:
            out.append({"spec": spec, "error": "expected NAME:B:H:L:E:WINDOW:BLOCK (positive sizes, WINDOW >= 0)"})
            continue
        B, H, L, E, W, bs = map(int, parts[1:])
        try:
            out.append(flex_row(torch, dev, parts[0], B, H, L, E, W, bs, repeats, compiled))
        except Exception as e:  # the block mask or the inputs did not fit: say so
            out.append({"case": parts[0], "B": B, "H": H, "L": L, "E": E, "window": W, "block_size": bs,
                        "error": first_line(e)})
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=8192, help="tokens of the loss case")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--device-index", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="the first four GEMM shapes only")
    ap.add_argument("--tiny", action="store_true", help="small GEMM shapes (the emulated device's)")
    ap.add_argument("--loss-d", type=int, default=4096, help="hidden size D of the loss case")
    ap.add_argument("--loss-v", type=int, default=128256, help="vocabulary V of the loss case")
    ap.add_argument("--sections", default="gemm,loss", help="gemm, loss (comma-separated) or none")
    ap.add_argument("--flex", action="append", default=[], metavar="NAME:B:H:L:E:WINDOW:BLOCK",
                    help="a flex row (see above); repeatable")
    ap.add_argument("--flex-on-cpu", action="store_true",
                    help="run the --flex rows alone on the CPU, flex_attention uncompiled (a check of this "
                         "script where no GPU is: its figures are the CPU's, not a baseline)")
    ap.add_argument("--train", action="append", default=[], metavar="MODEL:WEIGHTS:B:DTYPE:MODES",
                    help="a training-step row (see above); repeatable")
    ap.add_argument("--train-on-cpu", action="store_true",
                    help="run the --train rows alone on the CPU (a check of this script where no GPU is: "
                         "its figures are the CPU's, not a baseline)")
    a = ap.parse_args()
    try:
        import torch
    except Exception as e:
        emit({"status": "not installed", "reason": f"import torch failed: {type(e).__name__}: {e}"})
    if a.flex_on_cpu:
        emit({"status": "cpu check", "torch_version": torch.__version__,
              "flex": flex_cases(torch, torch.device("cpu"), a.flex, a.repeats, compiled=False)})
    if a.train_on_cpu:
        emit({"status": "cpu check", "torch_version": torch.__version__,
              "train": train_cases(torch, torch.device("cpu"), a.train, a.repeats)})
    if not torch.cuda.is_available():
        emit({"status": "no cuda", "reason": f"torch {torch.__version__} sees no CUDA device "
              f"(built with CUDA {torch.version.cuda})", "torch_version": torch.__version__})
    if a.device_index >= torch.cuda.device_count():
        emit({"status": "no cuda", "reason": f"device index {a.device_index} of {torch.cuda.device_count()}",
              "torch_version": torch.__version__})
    dev = torch.device("cuda", a.device_index)
    torch.cuda.set_device(dev)
    torch.backends.cuda.matmul.allow_tf32 = False  # f32 GEMMs in f32, as ctorch's
    torch.backends.cudnn.allow_tf32 = False
    res = {"status": "ok", "torch_version": torch.__version__, "cuda_version": torch.version.cuda,
           "device": torch.cuda.get_device_name(dev), "repeats": a.repeats}
    sections = set(a.sections.split(","))
    if "gemm" in sections:
        res["gemm"] = gemm_cases(torch, dev, a.repeats, a.quick, a.tiny)
    if "loss" in sections:
        res["loss"] = loss_cases(torch, dev, a.n, a.repeats, a.loss_d, a.loss_v)
    if a.train:
        res["train"] = train_cases(torch, dev, a.train, a.repeats)
    if a.flex:
        res["flex"] = flex_cases(torch, dev, a.flex, a.repeats)
    emit(res)


if __name__ == "__main__":
    main()
