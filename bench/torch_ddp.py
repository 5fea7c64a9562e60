"""PyTorch 2.13 baseline of `ctorch bench fsdp`: training steps of bench/torch_train.py's SdpaGPT
(F.scaled_dot_product_attention, eager) on the weights and tokens of `ctorch train --dump-grads`,
with one thread per process:
  single  one process, the whole batch
  ddp     DistributedDataParallel over gloo, 2 ranks (rank r takes rows [r B / 2, (r + 1) B / 2))
  fsdp2   FSDP2: torch.distributed.fsdp.fully_shard on each block and on the model, gloo, 2 ranks
Each is reported with its status; a mode PyTorch cannot run on CPU says "not supported: <why>".
Prints one JSON object:

    .venv/bin/python bench/torch_ddp.py --weights FILE [--steps N] [--modes single,ddp,fsdp2]
"""
import argparse
import os
import queue
import resource
import socket
import statistics
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_common as tc  # noqa: E402
import torch_train  # noqa: E402

MODES = ("single", "ddp", "fsdp2")


def timed_steps(module, model, tokens, tr, steps):
    """Median step time over steps - 1 steps (the first is not timed), and the losses."""
    opt = torch_train.make_optimizer(model, tr)
    eos = tr.get("eos_token", -1)
    ts, losses = [], []
    for i in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = module(tokens, eos, tr.get("z_loss", 0.0), tr.get("label_smoothing", 0.0))
        loss.backward()
        if tr.get("clip", 0) > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), tr["clip"])
        opt.step()
        losses.append(float(loss.detach().full_tensor() if hasattr(loss, "full_tensor") else loss.detach()))
        if i:
            ts.append(time.perf_counter() - t0)
    return statistics.median(ts), losses


def worker(rank, world, port, weights, steps, attention, mode, q):
    try:
        torch.set_num_threads(1)
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
        model, tokens, tr, _ = torch_train.load_sdpa(weights, attention)
        B = tokens.shape[0]
        mine = tokens[rank * B // world:(rank + 1) * B // world]
        if mode == "ddp":
            module = torch.nn.parallel.DistributedDataParallel(model)
        else:
            from torch.distributed.fsdp import fully_shard

            for blk in model.layers:
                fully_shard(blk)
            fully_shard(model)
            module = model
        med, losses = timed_steps(module, model, mine, tr, steps)
        q.put((rank, "ok", med, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, losses))
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001  (reported as the mode's status)
        msg = "%s: %s" % (type(e).__name__, str(e).strip().splitlines()[0][:300] if str(e).strip() else "")
        traceback.print_exc()
        q.put((rank, "not supported: " + msg, 0.0, 0, []))


def distributed(mode, weights, steps, attention, ntok, timeout):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, 2, port, weights, steps, attention, mode, q)) for r in range(2)]
    for p in procs:
        p.start()
    res = []
    try:
        for _ in procs:
            res.append(q.get(timeout=timeout))
    except queue.Empty:
        pass
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
    res.sort()
    if len(res) < 2:
        return {"status": "failed: a rank did not report within %d s" % timeout}
    bad = [r[1] for r in res if r[1] != "ok"]
    if bad:
        return {"status": bad[0]}
    step = max(r[2] for r in res)
    what = ("DistributedDataParallel, gloo" if mode == "ddp"
            else "FSDP2 fully_shard per block + root, gloo")
    return {"status": "ok", "what": what, "nproc": 2, "step_s": step, "tokens_per_s": ntok / step,
            "peak_rss_bytes": max(r[3] for r in res), "peak_rss_bytes_per_rank": [r[3] for r in res],
            "losses_rank0": res[0][4]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", required=True)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--attention", choices=["causal", "mask"], default="causal")
    ap.add_argument("--timeout", type=int, default=600)
    a = ap.parse_args()
    modes = a.modes.split(",")
    for m in modes:
        if m not in MODES:
            ap.error("--modes: unknown mode %r (modes: %s)" % (m, ", ".join(MODES)))
    torch.set_num_threads(1)
    model, tokens, tr, _ = torch_train.load_sdpa(a.weights, a.attention)
    ntok = tokens.shape[0] * (tokens.shape[1] - 1)
    out = tc.header("eager", threads_per_rank=1,
                    model="SdpaGPT (F.scaled_dot_product_attention, F.linear + F.cross_entropy)",
                    attention=torch_train.mask_note(model.cfg, tokens, tr.get("eos_token", -1), a.attention))
    if "single" in modes:
        single, losses = timed_steps(model, model, tokens, tr, a.steps)
        out["single"] = {"status": "ok", "nproc": 1, "step_s": single, "tokens_per_s": ntok / single,
                         "peak_rss_bytes": tc.peak_rss(), "losses": losses}
    del model
    for m in ("ddp", "fsdp2"):
        if m in modes:
            out[m] = distributed(m, a.weights, a.steps, a.attention, ntok, a.timeout)
    tc.dump(out)


if __name__ == "__main__":
    main()
