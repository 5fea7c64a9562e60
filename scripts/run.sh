#!/usr/bin/env bash
# Build ctorch (Release) and run the main job: `ctorch train` on the built-in corpus (a
# small GPT through FlexAttention and the fused loss; about 2 minutes on 2 cores), with
# its progress line, held-out loss against the corpus's entropy floor, metrics log and
# loss-curve SVG under out/. Installs what is missing first.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh   # Debian build packages only: the main job needs no Python
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
./build/ctorch version
./build/ctorch train "$@"
