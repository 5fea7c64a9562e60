#!/usr/bin/env python3
"""The ctorch GPT in PyTorch, initialised from a ctorch file, for `ctorch bench train` (and
bench/torch_ddp.py) and for the tests (tests/python/test_train.py and others import GPT, load,
read_safetensors, attention_mask, rmsnorm and rope from here).

    .venv/bin/python bench/torch_train.py --weights FILE [--mode eager|compiled]
                     [--attention causal|mask] [--dtype f32|bf16] [--repeats R] [--threads N]

FILE is a safetensors file written by ctorch (a checkpoint, or `ctorch train --dump-grads`, or
the one `ctorch bench train` writes): the parameters under ctorch's names, the "config" and
"train" metadata, and a "tokens" tensor [B, T+1] (the batch: inputs are the first T tokens of
each row, targets the last T). The script trains on that batch with the same step ctorch takes
(forward, backward, gradient clipping, AdamW) and prints one JSON object: median step time,
tokens/s, peak RSS, the tracked peak PyTorch exposes on CPU. --dtype bf16 runs the forward
(and so the loss) under torch.autocast("cpu", dtype=torch.bfloat16), the mixed precision a
PyTorch 2.13 user turns on for bf16 training (f32 parameters, gradients and AdamW state; the
backward outside the context, as the autocast docs recommend), the counterpart of `ctorch train
--dtype bf16`.

Two models of the same maths:
- GPT: the reference of the tests, written from definitions (RMSNorm, rotate-half RoPE with f32
  frequencies, softmax(q k^T / sqrt(E) + mask) v with the key/value heads repeated for GQA under
  the exact mask of ctorch's model: causal, the sliding window, the documents; SwiGLU; the
  cross-entropy on materialised logits with z-loss and label smoothing as ctorch defines them).
- SdpaGPT: the benchmark's model, as a PyTorch 2.13 user writes it: a module per block (so FSDP2
  can shard block by block), F.rms_norm, F.scaled_dot_product_attention with enable_gqa and
  is_causal=True (--attention causal, the default: the window and the document mask are then
  NOT applied, and the JSON says so) or the exact boolean mask (--attention mask), F.linear +
  F.cross_entropy for the head; eager or under torch.compile (--mode compiled).
"""
import argparse
import json
import os
import statistics
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_common as tc  # noqa: E402

_DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I32": np.int32, "I64": np.int64,
           "U8": np.uint8, "I8": np.int8, "I16": np.int16, "BOOL": np.bool_}


def read_safetensors(path):
    """(dict name -> numpy array, dict metadata) of a safetensors file (plain reader)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        a = np.frombuffer(data, dtype=_DTYPES[e["dtype"]], count=(end - b) // np.dtype(_DTYPES[e["dtype"]]).itemsize,
                          offset=base + b)
        out[name] = a.reshape(e["shape"]).copy()
    return out, meta


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, base):
    """x [B, T, H, E]: rotate-half RoPE at positions 0 .. T-1 (frequencies in f32, as HF)."""
    T, E = x.shape[1], x.shape[3]
    inv = 1.0 / (base ** (torch.arange(0, E, 2, dtype=torch.float32, device=x.device) / E))
    ang = torch.arange(T, dtype=torch.float32, device=x.device)[:, None] * inv[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[None, :, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[None, :, None, :]
    x1, x2 = x[..., :E // 2], x[..., E // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def attention_mask(inp, window, eos):
    """Boolean [B, 1, T, T]: causal, within the window, within the document."""
    B, T = inp.shape
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    keep = j <= i
    if window:
        keep = keep & (i - j <= window)
    keep = keep[None].expand(B, T, T)
    if eos is not None and eos >= 0:
        doc = torch.cat([torch.zeros(B, 1, dtype=torch.long), (inp[:, :-1] == eos).long().cumsum(1)], 1)
        keep = keep & (doc[:, :, None] == doc[:, None, :])
    return keep[:, None]


class GPT(torch.nn.Module):
    def __init__(self, cfg, tensors):
        super().__init__()
        self.cfg = cfg
        self.p = torch.nn.ParameterDict()
        for name, a in tensors.items():
            if name.startswith("grad.") or name.startswith("optimizer.") or name == "tokens":
                continue
            self.p[name.replace(".", "__")] = torch.nn.Parameter(torch.from_numpy(np.array(a, dtype=np.float32)))

    def w(self, name):
        return self.p[name.replace(".", "__")]

    def named(self):
        return {k.replace("__", "."): v for k, v in self.p.items()}

    def forward(self, tokens, eos=-1, z_loss=0.0, label_smoothing=0.0):
        c = self.cfg
        inp, tgt = tokens[:, :-1], tokens[:, 1:]
        B, T = inp.shape
        H, K, C = c["n_head"], c["n_kv_head"], c["d_model"]
        E = C // H
        mask = attention_mask(inp, c["window"], eos)
        h = F.embedding(inp, self.w("tok_embeddings.weight"))
        for l in range(c["n_layer"]):
            pre = f"layers.{l}."
            a = rmsnorm(h, self.w(pre + "attention_norm.weight"), c["norm_eps"])
            q = rope((a @ self.w(pre + "attention.wq.weight").t()).view(B, T, H, E), c["rope_base"])
            k = rope((a @ self.w(pre + "attention.wk.weight").t()).view(B, T, K, E), c["rope_base"])
            v = (a @ self.w(pre + "attention.wv.weight").t()).view(B, T, K, E)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            k = k.repeat_interleave(H // K, dim=1)
            v = v.repeat_interleave(H // K, dim=1)
            s = (q @ k.transpose(-1, -2)) * (1.0 / E ** 0.5)
            s = s.masked_fill(~mask, float("-inf"))
            o = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, T, H * E)
            h = h + o @ self.w(pre + "attention.wo.weight").t()
            f = rmsnorm(h, self.w(pre + "ffn_norm.weight"), c["norm_eps"])
            g, u = (f @ self.w(pre + "feed_forward.w_gate_up.weight").t()).chunk(2, -1)
            h = h + (F.silu(g) * u) @ self.w(pre + "feed_forward.w_down.weight").t()
        h = rmsnorm(h, self.w("norm.weight"), c["norm_eps"])
        W = self.w("tok_embeddings.weight") if c["tied"] else self.w("output.weight")
        logits = (h @ W.t()).view(B * T, -1)
        loss = F.cross_entropy(logits, tgt.reshape(-1), label_smoothing=label_smoothing)
        if z_loss:
            loss = loss + z_loss * torch.logsumexp(logits, -1).pow(2).mean()
        return loss


def load(path):
    """(model, tokens [B, T+1] int64, train options dict, metadata) from a ctorch file."""
    tensors, meta = read_safetensors(path)
    cfg = json.loads(meta["config"])
    train = json.loads(meta.get("train", "{}"))
    model = GPT(cfg, tensors)
    tokens = torch.from_numpy(tensors["tokens"].astype(np.int64)) if "tokens" in tensors else None
    return model, tokens, train, meta


class Block(torch.nn.Module):
    """One transformer block of SdpaGPT, its parameters under ctorch's names (dots as "__")."""

    def __init__(self, cfg, tensors, pre):
        super().__init__()
        self.cfg = cfg
        for n in ("attention_norm.weight", "attention.wq.weight", "attention.wk.weight", "attention.wv.weight",
                  "attention.wo.weight", "ffn_norm.weight", "feed_forward.w_gate_up.weight",
                  "feed_forward.w_down.weight"):
            self.register_parameter(n.replace(".", "__"),
                                    torch.nn.Parameter(torch.from_numpy(np.array(tensors[pre + n], dtype=np.float32))))

    def forward(self, h, mask, causal):
        c = self.cfg
        B, T, C = h.shape
        H, K = c["n_head"], c["n_kv_head"]
        E = C // H
        eps = c["norm_eps"]
        a = F.rms_norm(h, (C,), self.attention_norm__weight, eps)
        q = rope(F.linear(a, self.attention__wq__weight).view(B, T, H, E), c["rope_base"]).transpose(1, 2)
        k = rope(F.linear(a, self.attention__wk__weight).view(B, T, K, E), c["rope_base"]).transpose(1, 2)
        v = F.linear(a, self.attention__wv__weight).view(B, T, K, E).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=None if causal else mask, is_causal=causal,
                                           enable_gqa=H != K)
        h = h + F.linear(o.transpose(1, 2).reshape(B, T, C), self.attention__wo__weight)
        f = F.rms_norm(h, (C,), self.ffn_norm__weight, eps)
        g, u = F.linear(f, self.feed_forward__w_gate_up__weight).chunk(2, -1)
        return h + F.linear(F.silu(g) * u, self.feed_forward__w_down__weight)


class SdpaGPT(torch.nn.Module):
    """The model of GPT, written with PyTorch 2.13's ops (see the module's docstring)."""

    def __init__(self, cfg, tensors, attention="causal"):
        super().__init__()
        self.cfg = cfg
        self.causal = attention == "causal"
        self.tok_embeddings = torch.nn.Parameter(
            torch.from_numpy(np.array(tensors["tok_embeddings.weight"], dtype=np.float32)))
        self.layers = torch.nn.ModuleList(Block(cfg, tensors, f"layers.{l}.") for l in range(cfg["n_layer"]))
        self.norm = torch.nn.Parameter(torch.from_numpy(np.array(tensors["norm.weight"], dtype=np.float32)))
        self.output = None
        if not cfg["tied"]:
            self.output = torch.nn.Parameter(torch.from_numpy(np.array(tensors["output.weight"], dtype=np.float32)))

    def forward(self, tokens, eos=-1, z_loss=0.0, label_smoothing=0.0):
        c = self.cfg
        inp, tgt = tokens[:, :-1], tokens[:, 1:]
        B, T = inp.shape
        mask = None if self.causal else attention_mask(inp, c["window"], eos)
        h = F.embedding(inp, self.tok_embeddings)
        for blk in self.layers:
            h = blk(h, mask, self.causal)
        h = F.rms_norm(h, (c["d_model"],), self.norm, c["norm_eps"])
        logits = F.linear(h, self.tok_embeddings if self.output is None else self.output).view(B * T, -1)
        loss = F.cross_entropy(logits, tgt.reshape(-1), label_smoothing=label_smoothing)
        if z_loss:
            loss = loss + z_loss * torch.logsumexp(logits, -1).pow(2).mean()
        return loss


def mask_note(cfg, tokens, eos, attention):
    """What the PyTorch model's attention masks, beside ctorch's model (causal, window, documents)."""
    if attention == "mask":
        return "the model's mask: causal, sliding window, documents (boolean attn_mask)"
    skipped = []
    if cfg.get("window"):
        skipped.append("the sliding window of %d" % cfg["window"])
    if eos is not None and eos >= 0 and bool((tokens[:, :-1] == eos).any()):
        skipped.append("the document mask")
    if not skipped:
        return "causal (is_causal=True), the model's mask"
    return "causal only (is_causal=True): %s not applied" % " and ".join(skipped)


def make_optimizer(model, tr, **kw):
    """ctorch's AdamW (decay on matrices only) from its train options; kw go to AdamW (fused=...)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": tr.get("weight_decay", 0.1)},
                              {"params": other, "weight_decay": 0.0}], lr=tr.get("lr", 3e-3),
                             betas=(tr.get("beta1", 0.9), tr.get("beta2", 0.95)), eps=tr.get("eps", 1e-8), **kw)


def load_sdpa(path, attention="causal"):
    """(SdpaGPT, tokens [B, T+1] int64, train options dict, metadata) from a ctorch file."""
    tensors, meta = read_safetensors(path)
    cfg = json.loads(meta["config"])
    train = json.loads(meta.get("train", "{}"))
    tokens = torch.from_numpy(tensors["tokens"].astype(np.int64)) if "tokens" in tensors else None
    return SdpaGPT(cfg, tensors, attention), tokens, train, meta


def state_bytes(model, opt):
    """Bytes of the parameters and the optimizer's state tensors."""
    n = sum(p.numel() * p.element_size() for p in model.parameters())
    for st in opt.state.values():
        n += sum(t.numel() * t.element_size() for t in st.values() if torch.is_tensor(t))
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--mode", choices=["eager", "compiled"], default="eager",
                    help="compiled: torch.compile(model); the optimizer step stays eager")
    ap.add_argument("--attention", choices=["causal", "mask"], default="causal")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32",
                    help='bf16: the forward under torch.autocast("cpu", dtype=torch.bfloat16)')
    tc.add_threads_arg(ap)
    a = ap.parse_args()
    tc.set_threads(a.threads)
    model, tokens, tr, _ = load_sdpa(a.weights, a.attention)
    opt = make_optimizer(model, tr)
    eos = tr.get("eos_token", -1)
    fwd = torch.compile(model) if a.mode == "compiled" else model
    zl, ls = tr.get("z_loss", 0.0), tr.get("label_smoothing", 0.0)
    bf16 = a.dtype == "bf16"

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = fwd(tokens, eos, zl, ls)
        loss.backward()
        if tr.get("clip", 0) > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), tr["clip"])
        opt.step()
        return float(loss.detach())

    t0 = time.perf_counter()
    losses = [step()]  # the warm-up (and compilation)
    first = time.perf_counter() - t0
    ts, cpu = [], []
    for _ in range(a.repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        losses.append(step())
        ts.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    rss = tc.peak_rss()
    extra = tc.profiled_peak_bytes(step)
    state = state_bytes(model, opt)
    ntok = tokens.shape[0] * (tokens.shape[1] - 1)
    med = statistics.median(ts)
    out = tc.header(a.mode, model="SdpaGPT (F.scaled_dot_product_attention, F.linear + F.cross_entropy)",
                    attention=mask_note(model.cfg, tokens, eos, a.attention), dtype=a.dtype,
                    autocast='torch.autocast("cpu", dtype=torch.bfloat16)' if bf16 else None)
    out.update(step={"median_s": med, "min_s": min(ts), "max_s": max(ts), "repeats": a.repeats},
               step_cpu_s=statistics.median(cpu), first_step_s=first, tokens_per_s=ntok / med, peak_rss_bytes=rss,
               state_bytes=state, peak_tracked_bytes=state + extra,
               tracked_by="parameters + AdamW state + torch.profiler profile_memory's peak over one step",
               losses=losses)
    tc.dump(out)


if __name__ == "__main__":
    main()
