#!/usr/bin/python3
"""Write the seed corpus of fuzz_token_ids: two bytes of vocabulary size (little-endian, + 1;
ff ff: 2^31) then the text of `ctorch generate --prompt-ids`, valid and hostile.

Usage: /usr/bin/python3 tests/fuzz/make_corpus_ids.py OUT_DIR
"""
import os
import sys

SEEDS = {
    "v-spaces": (1000, b"1 2 3"),
    "v-commas": (1000, b"0,5,999"),
    "v-mixed": (50000, b" 12,\t7\n 49999 ,, 0 "),
    "v-zeros": (10, b"000 0009"),
    "v-empty": (10, b""),
    "v-seps-only": (10, b" ,\t\n\r"),
    "v-big-vocab": (None, b"2147483647 0 1"),
    "h-out-of-range": (100, b"1 100 2"),
    "h-negative": (100, b"-3"),
    "h-plus": (100, b"+3"),
    "h-letters": (100, b"1 x 2"),
    "h-hex": (100, b"0x10"),
    "h-overflow": (None, b"99999999999999999999999"),
    "h-nul": (100, b"1\x002"),
    "h-float": (100, b"1.5"),
}


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, (vocab, text) in SEEDS.items():
        head = b"\xff\xff" if vocab is None else (vocab - 1).to_bytes(2, "little")
        with open(os.path.join(out, name), "wb") as f:
            f.write(head + text)


if __name__ == "__main__":
    main()
