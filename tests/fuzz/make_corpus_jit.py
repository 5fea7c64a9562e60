#!/usr/bin/python3
"""Write the seed corpus of fuzz_jit_expr: one file per expression, the first byte 'M' (odd:
mask mod) or 'S' (even: score mod), then the expression text.

Usage: /usr/bin/python3 tests/fuzz/make_corpus_jit.py OUT_DIR
"""
import os
import sys

MASKS = [
    "q >= kv", "q >= kv && q - kv <= 256", "kv < 17 || q >= kv", "doc[q] == doc[kv]",
    "(q - kv) % 2 == 0 && abs(q - kv) <= 8", "q - kv <= 8 * (h + 1) && kv <= q",
    "q / 7 == kv / 7", "b == 1 ? q >= kv : kv >= q", "((q & 15) ^ (kv | 3)) < 9 || !(q != kv)",
    "where(q > 40, kv * 2, kv + 100) >= q + (q % 5 == 0)", "~(q < kv) & true",
    "doc[doc[q] + 1] != -1", "min(q, kv) > max(b, h) - 1", "clamp(q - kv, -3, 3) == 0",
    "(q % -3) + (q / -2) < 0", "q * 9223372036854775807 > kv", "int(float(q) / 2.5) == kv",
]
SCORES = [
    "score", "score + bias[h, q - kv + 16]", "30 * tanh(score / 30)",
    "score + bias[h][clamp(q - kv, -16, 16) + 16] * (kv - q)", "exp(score) / (1 + exp(score))",
    "sigmoid(score) * log(abs(score) + 1) + sqrt(score * score)", "min(score, 2.0) + max(score, -1e30)",
    "where(doc[q] == doc[kv], score, score - 1000)", "score % 1.5 + floor(score)",
    "q % 2 == 0 ? score * 2 : -score", "score * bias[0, 0] * bias[0, 0]",
]


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for i, e in enumerate(MASKS):
        with open(os.path.join(out, f"m-{i:02d}"), "wb") as f:
            f.write(b"M" + e.encode())
    for i, e in enumerate(SCORES):
        with open(os.path.join(out, f"s-{i:02d}"), "wb") as f:
            f.write(b"S" + e.encode())


if __name__ == "__main__":
    main()
