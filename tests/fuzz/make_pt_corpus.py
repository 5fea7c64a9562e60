#!/usr/bin/python3
"""Write the seed corpora of the .pt fuzz targets: files written by PyTorch 2.13 (torch.save, zip
and legacy formats: state dicts, every dtype, including the float8 / uint16-64 / complex32 /
float4 tensors it writes with _rebuild_tensor_v3 over untyped storages, views, nested
containers) and hostile ones (disallowed globals, memo abuse, truncated frames, compressed /
overlapping zips).

Usage: .venv/bin/python tests/fuzz/make_pt_corpus.py OUT_DIR
Writes OUT_DIR/zip (whole files, for fuzz_zip) and OUT_DIR/pickle (legacy files without their
fixed magic / protocol / sys_info prefix, and bare pickles, for fuzz_pickle).
"""
import io
import os
import pickle
import struct
import sys
import zipfile
from collections import OrderedDict

import torch

LEGACY_PREFIX_LEN = 15 + 6  # the magic-number and protocol-version pickles


def checkpoints():
    torch.manual_seed(0)
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    out = {
        "state-dict": torch.nn.Linear(3, 2).state_dict(),
        "views": {"base": base, "t": base.t(), "col": base[:, 2], "exp": base[:1].expand(3, 6)},
        "nested": {"model": {"w": torch.ones(2, 2)}, "opt": [torch.zeros(3), {"step": 1}],
                   "cfg": {"lr": 0.1, "name": "x", "betas": (0.9, 0.99)}, "none": None},
        "param": {"p": torch.nn.Parameter(torch.randn(3))},
        "bare": torch.arange(5, dtype=torch.int16),
        "empty": {"e": torch.zeros(0, 3), "s": torch.tensor(2.5)},
    }
    for dt in [torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32,
               torch.int64, torch.bool, torch.complex64, torch.complex128,
               # written with _rebuild_tensor_v3 and an UntypedStorage
               torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz,
               torch.float8_e8m0fnu, torch.uint16, torch.uint32, torch.uint64, torch.complex32]:
        out["dtype-" + str(dt).split(".")[1]] = {"x": torch.ones(3, dtype=dt)}
    f8 = torch.arange(24.0).reshape(4, 6).to(torch.float8_e5m2)
    out["views-f8"] = {"base": f8, "t": f8.t(), "blk": f8[1:3, 2:5], "u": torch.arange(6).to(torch.uint16)[1:]}
    out["dtype-float4"] = {"x": torch.zeros(2, 3, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)}  # refused
    return out


def save(obj, legacy):
    b = io.BytesIO()
    torch.save(obj, b, _use_new_zipfile_serialization=not legacy)
    return b.getvalue()


class Evil:
    def __reduce__(self):
        return (os.system, ("true",))


def hostile_pickles():
    return {
        "global": pickle.dumps({"w": Evil()}, protocol=2),
        "stack-global": pickle.dumps({"w": Evil()}, protocol=4),
        "reduce-str": b"\x80\x02X\x01\x00\x00\x00a)R.",
        "build-list": b"\x80\x02]}b.",
        "inst": b"(ios\nsystem\n.",
        "memo-unset": b"\x80\x02h\x05.",
        "memo-cycle": b"\x80\x02]q\x00h\x00a.",
        "frame-truncated": b"\x80\x04\x95\xff\x00\x00\x00\x00\x00\x00\x00N.",
        "marks": b"\x80\x02" + b"(" * 100 + b"N.",
        "nesting": b"\x80\x02" + b"]" * 70 + b"a" * 69 + b".",
        "long4-huge": b"\x80\x02\x8b\xff\xff\xff\x7f.",
        "data-types": pickle.dumps({"i": [1, -2, 2**40], "f": 1.5, "s": "é", "b": b"\x00", "t": (1,),
                                    "n": None, "set": {1}, "fs": frozenset([2])}, protocol=4),
    }


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "build-fuzz/seeds-pt"
    zd, pd = os.path.join(out, "zip"), os.path.join(out, "pickle")
    os.makedirs(zd, exist_ok=True)
    os.makedirs(pd, exist_ok=True)
    for name, obj in checkpoints().items():
        z = save(obj, False)
        open(os.path.join(zd, f"v-{name}.pt"), "wb").write(z)
        leg = save(obj, True)
        # fuzz_pickle's input: the legacy file after its magic and protocol pickles, whose own
        # sys_info pickle the harness replaces: strip that too.
        rest = leg[LEGACY_PREFIX_LEN:]
        rest = rest[rest.index(b".") + 1:] if rest.startswith(b"\x80\x02}") else rest
        open(os.path.join(pd, f"v-{name}.pkl"), "wb").write(rest)
    for name, pkl in hostile_pickles().items():
        open(os.path.join(pd, f"h-{name}.pkl"), "wb").write(pkl)
        b = io.BytesIO()
        with zipfile.ZipFile(b, "w", zipfile.ZIP_STORED) as z:
            z.writestr("archive/data.pkl", pkl)
        open(os.path.join(zd, f"h-{name}.pt"), "wb").write(b.getvalue())
    good = save({"w": torch.arange(4.0)}, False)
    b = io.BytesIO()
    src = zipfile.ZipFile(io.BytesIO(good))
    with zipfile.ZipFile(b, "w", zipfile.ZIP_DEFLATED) as z:
        for i in src.infolist():
            z.writestr(i.filename, src.read(i))
    open(os.path.join(zd, "h-compressed.pt"), "wb").write(b.getvalue())
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w", zipfile.ZIP_STORED) as z:
        for i in src.infolist():
            z.writestr(i.filename, src.read(i))
    zz = b.getvalue()
    open(os.path.join(zd, "v-python-zipfile.pt"), "wb").write(zz)
    cd = zz.rindex(b"PK\x01\x02")
    over = bytearray(zz)
    struct.pack_into("<I", over, cd + 42, 0)
    open(os.path.join(zd, "h-overlap.pt"), "wb").write(bytes(over))
    open(os.path.join(zd, "h-truncated.pt"), "wb").write(good[:-10])
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w", zipfile.ZIP_STORED) as z:
        for i in src.infolist():
            info = zipfile.ZipInfo(i.filename)
            z.writestr(info, src.read(i))
    open(os.path.join(zd, "v-zip64.pt"), "wb").write(zip64(src))


def zip64(src):
    """The same archive with zip64 records forced (Python's zipfile writes them for
    force_zip64 streams)."""
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
        for i in src.infolist():
            with z.open(zipfile.ZipInfo(i.filename), "w", force_zip64=True) as w:
                w.write(src.read(i))
    return b.getvalue()


if __name__ == "__main__":
    main()
