#!/usr/bin/python3
"""Write the seed corpus of the safetensors fuzz targets: small valid files (v-*) and hostile
ones (h-<rule>-*), built with struct + json only, independent of ctorch.

Usage: /usr/bin/python3 tests/fuzz/make_corpus.py [OUT_DIR]
(default: tests/fuzz/corpus/safetensors next to this script). Existing v-* and h-* files are
replaced; regress-* files (inputs that once crashed or broke an invariant) are kept.
"""
import json
import os
import random
import struct
import sys

BITS = {"BOOL": 8, "U8": 8, "I8": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32,
        "U32": 32, "F32": 32, "F64": 64, "I64": 64, "U64": 64, "C64": 64, "F8_E4M3": 8,
        "F8_E5M2": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "F4": 4, "F6_E2M3": 6,
        "F6_E3M2": 6}

rng = random.Random(1234)


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def raw_file(header: bytes, data: bytes = b"", length=None) -> bytes:
    n = len(header) if length is None else length
    return struct.pack("<Q", n) + header + data


def st_file(tensors, metadata=None, pad=True, order=None):
    """tensors: list of (name, dtype, shape); data random; offsets back to back."""
    hdr, data, off = {}, b"", 0
    if metadata is not None:
        hdr["__metadata__"] = metadata
    for name, dt, shape in tensors:
        nb = numel(shape) * BITS[dt] // 8
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + nb]}
        data += bytes(rng.randrange(256) for _ in range(nb))
        off += nb
    h = json.dumps(hdr, separators=(",", ":"), ensure_ascii=False).encode()
    if pad:
        h += b" " * ((8 - len(h) % 8) % 8)
    return raw_file(h, data)


def entry(dt, shape, b, e):
    return {"dtype": dt, "shape": shape, "data_offsets": [b, e]}


def hj(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def corpus():
    c = {}
    # ---- valid
    c["v-every-dtype"] = st_file([(f"t.{d}", d, [2, 4]) for d in BITS], {"format": "pt"})
    c["v-empty"] = raw_file(b"{}      ")
    c["v-metadata-only"] = st_file([], {"a": "b", "\u00e9": "\u4e2d"})
    c["v-zero-rank"] = st_file([("s", "F32", []), ("t", "I64", [])])
    c["v-empty-tensors"] = st_file([("z", "F32", [0, 4]), ("a", "BF16", [0]), ("w", "F16", [3])])
    c["v-misaligned"] = st_file([("pad", "U8", [1]), ("bf", "BF16", [7]), ("f", "F32", [3])], pad=False)
    c["v-nine-dims"] = st_file([("deep", "U8", [1, 1, 1, 1, 1, 2, 1, 1, 1])])
    c["v-unicode"] = st_file([("\u5c42.0.\u6743\u91cd", "F32", [2]), ("emoji\U0001F600", "I8", [3])])
    c["v-subbyte"] = st_file([("f4", "F4", [2, 3]), ("f6a", "F6_E2M3", [4]), ("f6b", "F6_E3M2", [8])])
    c["v-newline"] = raw_file(hj({"a": entry("F32", [1], 0, 4)}) + b"\n", b"\0\0\x80\x3f")
    c["v-unsorted-header"] = raw_file(hj({"b": entry("F32", [1], 4, 8), "a": entry("F32", [1], 0, 4)}),
                                      bytes(8))
    c["v-f8"] = st_file([("e4", "F8_E4M3", [16]), ("e5", "F8_E5M2", [16]), ("bf", "BF16", [8])])
    # ---- hostile: one or more per rule
    ok = entry("F32", [1], 0, 4)
    c["h-file-too-small"] = b"\x05\0\0"
    c["h-header-too-large"] = struct.pack("<Q", 100_000_001) + b"{}"
    c["h-header-huge"] = b"\xff" * 8 + b"{}"
    c["h-header-past-end"] = struct.pack("<Q", 64) + b"{}"
    c["h-header-start"] = raw_file(b" {}")
    c["h-header-empty"] = raw_file(b"")
    c["h-nul-raw"] = raw_file(b'{"a\0":' + hj(ok) + b"}", bytes(4))
    c["h-nul-escape"] = raw_file(b'{"a\\u0000":' + hj(ok) + b"}", bytes(4))
    c["h-utf8-ff"] = raw_file(b'{"a\xff":' + hj(ok) + b"}", bytes(4))
    c["h-utf8-overlong"] = raw_file(b'{"a\xc0\x80":' + hj(ok) + b"}", bytes(4))
    c["h-utf8-surrogate"] = raw_file(b'{"a\xed\xa0\x80":' + hj(ok) + b"}", bytes(4))
    c["h-depth-100"] = raw_file(b'{"__metadata__":' + b"[" * 100 + b"]" * 100 + b"}")
    c["h-depth-5000"] = raw_file(b"{" + b'"a":{' * 5000 + b"}" * 5001)
    c["h-json-truncated"] = raw_file(b'{"a":{"dtype":"F32"')
    c["h-json-trailing"] = raw_file(hj({"a": ok}) + b"{}", bytes(4))
    c["h-json-comma"] = raw_file(b'{"a":' + hj(ok) + b",}", bytes(4))
    c["h-duplicate-tensor"] = raw_file(b'{"a":' + hj(ok) + b',"a":' + hj(entry("F32", [1], 4, 8)) + b"}",
                                       bytes(8))
    c["h-duplicate-field"] = raw_file(b'{"a":{"dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4]}}',
                                      bytes(4))
    c["h-duplicate-metadata"] = raw_file(b'{"__metadata__":{"k":"1","k":"2"}}')
    c["h-entry-not-object"] = raw_file(hj({"a": [1, 2]}))
    c["h-entry-missing"] = raw_file(hj({"a": {"dtype": "F32", "shape": [1]}}), bytes(4))
    c["h-entry-extra-key"] = raw_file(hj({"a": dict(ok, extra=1)}), bytes(4))
    c["h-dtype-unknown"] = raw_file(hj({"a": entry("F7", [1], 0, 4)}), bytes(4))
    c["h-dtype-lowercase"] = raw_file(hj({"a": entry("f32", [1], 0, 4)}), bytes(4))
    c["h-shape-negative"] = raw_file(hj({"a": entry("F32", [-1], 0, 4)}), bytes(4))
    c["h-shape-real"] = raw_file(b'{"a":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}}', bytes(4))
    c["h-shape-string"] = raw_file(hj({"a": entry("F32", ["1"], 0, 4)}), bytes(4))
    c["h-offsets-reversed"] = raw_file(hj({"a": entry("F32", [1], 4, 0)}), bytes(4))
    c["h-offsets-arity"] = raw_file(hj({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0]}}), bytes(4))
    c["h-offsets-huge"] = raw_file(hj({"a": entry("U8", [1], 18446744073709551614, 18446744073709551615)}),
                                   bytes(1))
    c["h-overflow-numel"] = raw_file(hj({"a": entry("F32", [2**32, 2**32, 2**32], 0, 4)}), bytes(4))
    c["h-overflow-bytes"] = raw_file(hj({"a": entry("F32", [2**61], 0, 4)}), bytes(4))
    c["h-overflow-wrap"] = raw_file(hj({"a": entry("U8", [2**62, 4], 0, 0)}))
    c["h-subbyte"] = raw_file(hj({"a": entry("F4", [3], 0, 2)}), bytes(2))
    c["h-size-mismatch"] = raw_file(hj({"a": entry("F32", [2], 0, 4)}), bytes(4))
    c["h-truncated"] = raw_file(hj({"a": entry("F32", [4], 0, 16)}), bytes(9))
    c["h-gap"] = raw_file(hj({"a": ok, "b": entry("F32", [1], 8, 12)}), bytes(12))
    c["h-gap-start"] = raw_file(hj({"b": entry("F32", [1], 4, 8)}), bytes(8))
    c["h-overlap"] = raw_file(hj({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)}), bytes(12))
    c["h-overlap-same"] = raw_file(hj({"a": ok, "b": ok}), bytes(4))
    c["h-trailing"] = raw_file(hj({"a": ok}), bytes(8))
    c["h-polyglot-zip"] = raw_file(hj({"a": ok}), bytes(4) + b"PK\x05\x06" + bytes(18))
    c["h-metadata-int"] = raw_file(b'{"__metadata__":{"k":1}}')
    c["h-metadata-null"] = raw_file(b'{"__metadata__":null}')
    c["h-metadata-nested"] = raw_file(b'{"__metadata__":{"k":{"a":"b"}}}')
    # ---- other formats ctorch recognises, and one it does not
    c["f-torch-zip"] = b"PK\x03\x04" + bytes(22) + b"\x10\0\0\0archive/data.pkl"
    c["f-npz"] = b"PK\x03\x04" + bytes(22) + b"\x05\0\0\0w.npy"
    c["f-gguf"] = b"GGUF\x03\0\0\0" + bytes(16)
    c["f-npy"] = b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }"
    c["f-pickle"] = b"\x80\x02\x8a\x0alZ\xfc\x9cF\xf9 j\xa8P\x19."
    c["f-elf"] = b"\x7fELF\x02\x01\x01" + bytes(9)
    return c


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                             "corpus", "safetensors")
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        if f[:2] in ("v-", "h-", "f-"):
            os.remove(os.path.join(out, f))
    total, files = 0, corpus()
    for name, data in files.items():
        with open(os.path.join(out, name + ".safetensors"), "wb") as f:
            f.write(data)
        total += len(data)
    print(f"wrote {len(files)} files, {total} bytes, to {out}")


if __name__ == "__main__":
    main()
