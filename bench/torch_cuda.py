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


def gemm_cases(torch, dev, repeats, quick):
    out = []
    for case, ta, tb, m, n, k in SHAPES[:4] if quick else SHAPES:
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


def loss_cases(torch, dev, n, repeats):
    import torch.nn.functional as F

    D, V = 4096, 128256
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
            out.append(train_row(torch, dev, tt, tensors, meta, name, batch, dtype, mode, repeats))
            if mode == "compiled":
                torch._dynamo.reset()
            gc.collect()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=8192, help="tokens of the loss case")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--device-index", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="the first four GEMM shapes only")
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
    res["gemm"] = gemm_cases(torch, dev, a.repeats, a.quick)
    res["loss"] = loss_cases(torch, dev, a.n, a.repeats)
    if a.train:
        res["train"] = train_cases(torch, dev, a.train, a.repeats)
    emit(res)


if __name__ == "__main__":
    main()
