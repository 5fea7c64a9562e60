#!/usr/bin/env python3
"""Python baselines for `ctorch bench io`, on the file the benchmark wrote, timed like the C side
(one warm-up, median of repeats), printed as one JSON object naming the torch, numpy and
safetensors versions:
- what a Python program without the safetensors package does (struct + json for the header,
  numpy.memmap for the data, torch for bf16 -> f32, write() + os.replace to save);
- what a PyTorch 2.13 user does: the safetensors package's safetensors.torch.load_file (every
  tensor read into memory) and save_file.
Runnable by hand:

    .venv/bin/python bench/io_baseline.py --file x.safetensors --out y.safetensors
"""
import argparse
import json
import mmap
import os
import statistics
import struct
import sys
import time
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_common as tc  # noqa: E402

# torch warns that the memmap is read-only; the baseline only reads it.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


def timed(fn, repeats):
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts), "repeats": repeats}


def header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        hdr = json.loads(f.read(n))
    hdr.pop("__metadata__", None)
    return n, hdr


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--file", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--repeats", type=int, default=3)
    tc.add_threads_arg(p)
    a = p.parse_args()
    tc.set_threads(a.threads)
    out = tc.header("eager", numpy_version=np.__version__)
    size = os.path.getsize(a.file)

    def open_file():
        n, hdr = header(a.file)
        return np.memmap(a.file, dtype=np.uint8, mode="r"), n, hdr

    def read_checksum():
        mm, n, hdr = open_file()
        s = 0
        for t in hdr.values():
            b, e = t["data_offsets"]
            s += int(mm[8 + n + b: 8 + n + e].view(np.uint64).sum(dtype=np.uint64))
        return s

    out["open"] = timed(open_file, a.repeats)
    out["read_checksum"] = timed(read_checksum, a.repeats)
    out["read_checksum"]["gb_per_s"] = size / out["read_checksum"]["median_s"] * 1e-9
    def convert():
        mm, n, hdr = open_file()
        total = 0
        for t in hdr.values():
            b, e = t["data_offsets"]
            x = torch.from_numpy(np.asarray(mm[8 + n + b: 8 + n + e]).view(np.int16))
            total += x.view(torch.bfloat16).float().numel()
        return total

    out["convert_bf16_f32"] = timed(convert, a.repeats)
    out["convert_bf16_f32"]["gb_per_s"] = 2 * size / out["convert_bf16_f32"]["median_s"] * 1e-9

    # the safetensors package, as a PyTorch user reads and writes these files
    import safetensors
    import safetensors.torch as st

    out["safetensors_version"] = safetensors.__version__
    loaded = {}

    def load_file():
        loaded.clear()
        loaded.update(st.load_file(a.file))

    out["safetensors_load_file"] = timed(load_file, a.repeats)
    out["safetensors_load_file"]["gb_per_s"] = size / out["safetensors_load_file"]["median_s"] * 1e-9

    def save_file():
        st.save_file(loaded, a.out + ".st")

    out["safetensors_save_file"] = timed(save_file, a.repeats)
    out["safetensors_save_file"]["gb_per_s"] = size / out["safetensors_save_file"]["median_s"] * 1e-9
    os.unlink(a.out + ".st")
    loaded.clear()

    mm, n, hdr = open_file()
    arrays = {k: np.array(mm[8 + n + t["data_offsets"][0]: 8 + n + t["data_offsets"][1]]) for k, t in hdr.items()}

    def save():
        h, off, meta = {}, 0, {}
        for k, v in arrays.items():
            h[k] = dict(hdr[k], data_offsets=[off, off + v.nbytes])
            off += v.nbytes
        hb = json.dumps(h, separators=(",", ":")).encode()
        hb += b" " * (-len(hb) % 8)
        tmp = a.out + ".tmp"
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(hb)) + hb)
            for v in arrays.values():
                f.write(v.data)
        os.replace(tmp, a.out)

    out["save_no_fsync"] = timed(save, a.repeats)
    out["save_no_fsync"]["gb_per_s"] = size / out["save_no_fsync"]["median_s"] * 1e-9
    os.unlink(a.out)
    tc.dump(out)


if __name__ == "__main__":
    main()
