#!/usr/bin/python3
"""Write the seed corpus of the comm fuzz targets (fuzz_store_frames, fuzz_comm_handshake):
well-formed store frames of every command, hostile ones (lengths over the caps, truncated
fields, zero-length frames, NUL in keys), handshake messages of the right and wrong sizes and
magics, and server replies with honest and lying lengths. Built with struct only.

Usage: /usr/bin/python3 tests/fuzz/make_comm_corpus.py OUT_DIR
"""
import os
import struct
import sys

MAX_VAL = 16 << 20
out = sys.argv[1] if len(sys.argv) > 1 else "comm-seeds"
os.makedirs(out, exist_ok=True)


def field(b):
    return struct.pack("<I", len(b)) + b


def frame(cmd, *fields):
    body = bytes([cmd]) + b"".join(field(f) for f in fields)
    return struct.pack("<I", len(body)) + body


def put(name, data):
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)


SET, GET, CHECK, ADD, CAS, DEL = 1, 2, 3, 4, 5, 6
frames = [
    frame(SET, b"k", b"v"),
    frame(GET, b"k"),
    frame(CHECK, b"k"),
    frame(ADD, b"n", struct.pack("<q", 5)),
    frame(CAS, b"k", b"", b"x"),
    frame(CAS, b"k", b"v", b"w"),
    frame(DEL, b"k"),
]
put("v-session", b"\x00" + b"".join(frames) + frame(GET, b"k") + frame(GET, b"n"))
for i, fr in enumerate(frames):
    put("v-frame-%d" % i, b"\x00" + fr)
put("h-zero-len", b"\x00" + struct.pack("<I", 0))
put("h-huge-len", b"\x00" + struct.pack("<I", 0xFFFFFFF0) + b"\x01")
put("h-field-over", b"\x00" + struct.pack("<I", 9) + b"\x01" + struct.pack("<I", 0xFFFFFFFF) + b"kkkk")
put("h-value-over-cap", b"\x00" + struct.pack("<I", 1 + 5 + 4) + b"\x01" + field(b"k") + struct.pack("<I", MAX_VAL + 1))
put("h-key-nul", b"\x00" + frame(SET, b"a\x00b", b"v"))
put("h-key-empty", b"\x00" + frame(SET, b"", b"v"))
put("h-add-short", b"\x00" + frame(ADD, b"n", b"123"))
put("h-bad-cmd", b"\x00" + frame(99, b"k"))
put("h-many-gets", b"\x00" + frame(SET, b"k", b"x" * 4000) + frame(GET, b"k") * 200)
# unauthenticated: a wrong proof, the old protocol, a short one
put("u-proof", b"\x01" + bytes(64))
put("u-old-frames", b"\x01" + frame(SET, b"stranger", b"x") * 4)
put("u-short", b"\x01" + bytes(10))
# replies to the client
put("r-ok", b"\x02" + struct.pack("<IB", 6, 0) + field(b"v"))
put("r-missing", b"\x02" + struct.pack("<IB", 1, 1))
put("r-lying", b"\x02" + struct.pack("<IB", 0xFFFFFFF0, 0) + struct.pack("<I", 0xFFFFFFF0 - 5))
put("r-mismatch", b"\x02" + struct.pack("<IB", 10, 0) + struct.pack("<I", 2) + b"ab")
put("r-badstatus", b"\x02" + struct.pack("<IB", 1, 7))
# handshakes (fuzz_comm_handshake reads the raw bytes)
RANK, STORE = 0x31727463, 0x31747363
put("hs-challenge-rank", struct.pack("<II", RANK, 1) + bytes(range(32)))
put("hs-challenge-store", struct.pack("<II", STORE, 1) + bytes(range(32)))
put("hs-challenge-v2", struct.pack("<II", RANK, 2) + bytes(32))
put("hs-hello", struct.pack("<II", RANK, 1) + bytes(32) + bytes(32))
put("hs-hello-short", struct.pack("<II", RANK, 1) + bytes(20))
put("hs-old-hello", struct.pack("<IIQ", 0x6374686C, 1, 0x1234567890ABCDEF))
