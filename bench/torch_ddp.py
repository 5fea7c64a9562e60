"""PyTorch 1.13 baseline of `ctorch bench fsdp`: training steps of bench/torch_train.py's GPT on
the weights and tokens of `ctorch train --dump-grads`, in one process and as DDP over gloo with
2 ranks of one thread each (rank r takes rows [r B / 2, (r + 1) B / 2) of the batch). Prints one
JSON object. Debian's torch 1.13 on Python 3.11 cannot import torch.distributed.fsdp, so DDP is
the distributed baseline."""
import argparse
import json
import os
import resource
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_train  # noqa: E402


def make_opt(model, tr):
    decay = [p for n, p in model.named().items() if p.dim() >= 2]
    other = [p for n, p in model.named().items() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": tr.get("weight_decay", 0.1)},
                              {"params": other, "weight_decay": 0.0}], lr=tr.get("lr", 3e-3),
                             betas=(tr.get("beta1", 0.9), tr.get("beta2", 0.95)), eps=tr.get("eps", 1e-8))


def timed_steps(module, model, tokens, tr, steps):
    opt = make_opt(model, tr)
    eos = tr.get("eos_token", -1)
    ts = []
    for i in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = module(tokens, eos)
        loss.backward()
        if tr.get("clip", 0) > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), tr["clip"])
        opt.step()
        if i:  # the first step is not timed
            ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def worker(rank, world, port, weights, steps, q):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model, tokens, tr, _ = torch_train.load(weights)
    B = tokens.shape[0]
    mine = tokens[rank * B // world:(rank + 1) * B // world]
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    med = timed_steps(ddp, model, mine, tr, steps)
    q.put((rank, med, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024))
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", required=True)
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(1)
    model, tokens, tr, _ = torch_train.load(a.weights)
    ntok = tokens.shape[0] * (tokens.shape[1] - 1)
    single = timed_steps(model, model, tokens, tr, a.steps)
    del model
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, 2, port, a.weights, a.steps, q)) for r in range(2)]
    for p in procs:
        p.start()
    res = sorted(q.get(timeout=600) for _ in procs)
    for p in procs:
        p.join()
    step = max(r[1] for r in res)
    print(json.dumps({"status": "ok", "torch_version": torch.__version__, "threads_per_rank": 1,
                      "single_step_s": single, "single_tokens_per_s": ntok / single,
                      "ddp_step_s": step, "ddp_tokens_per_s": ntok / step,
                      "ddp_peak_rss_bytes": max(r[2] for r in res),
                      "ddp_peak_rss_bytes_per_rank": [r[2] for r in res]}))


if __name__ == "__main__":
    main()
