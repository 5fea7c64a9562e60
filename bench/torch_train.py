#!/usr/bin/env python3
"""The ctorch GPT in PyTorch 1.13, initialised from a ctorch file, for `ctorch bench train` and
for tests/python/test_train.py (which imports GPT and read_safetensors from here).

    /usr/bin/python3 bench/torch_train.py --weights FILE [--repeats R]

FILE is a safetensors file written by ctorch (a checkpoint, or `ctorch train --dump-grads`, or
the one `ctorch bench train` writes): the parameters under ctorch's names, the "config" and
"train" metadata, and a "tokens" tensor [B, T+1] (the batch: inputs are the first T tokens of
each row, targets the last T). The script trains on that batch with the same step ctorch takes
(forward, backward, gradient clipping, AdamW) and prints one JSON object: median step time,
tokens/s, peak RSS.

The model is written with the ops PyTorch 1.13 has: RMSNorm from its definition, RoPE in the
rotate-half form with f32 frequencies, attention as softmax(q k^T / sqrt(E) + mask) v with the
key/value heads repeated for GQA (1.13 has no scaled_dot_product_attention), SwiGLU, and the
cross-entropy on materialised logits (with z-loss and label smoothing as ctorch defines them).
"""
import argparse
import json
import os
import resource
import statistics
import struct
import time

import numpy as np
import torch
import torch.nn.functional as F

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
    inv = 1.0 / (base ** (torch.arange(0, E, 2, dtype=torch.float32) / E))
    ang = torch.arange(T, dtype=torch.float32)[:, None] * inv[None, :]
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


def peak_rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("CT_NUM_THREADS", os.cpu_count())))
    model, tokens, tr, _ = load(a.weights)
    decay = [p for n, p in model.named().items() if p.dim() >= 2]
    other = [p for n, p in model.named().items() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": tr.get("weight_decay", 0.1)},
                             {"params": other, "weight_decay": 0.0}], lr=tr.get("lr", 3e-3),
                            betas=(tr.get("beta1", 0.9), tr.get("beta2", 0.95)), eps=tr.get("eps", 1e-8))
    eos = tr.get("eos_token", -1)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(tokens, eos, tr.get("z_loss", 0.0), tr.get("label_smoothing", 0.0))
        loss.backward()
        if tr.get("clip", 0) > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), tr["clip"])
        opt.step()
        return float(loss)

    step()
    ts, losses = [], []
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        losses.append(step())
        ts.append(time.perf_counter() - t0)
    ntok = tokens.shape[0] * (tokens.shape[1] - 1)
    med = statistics.median(ts)
    print(json.dumps({"status": "ok", "torch_version": torch.__version__, "threads": torch.get_num_threads(),
                      "step": {"median_s": med, "min_s": min(ts), "max_s": max(ts), "repeats": a.repeats},
                      "tokens_per_s": ntok / med, "peak_rss_bytes": peak_rss(), "losses": losses}))


if __name__ == "__main__":
    main()
