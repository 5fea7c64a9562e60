#!/usr/bin/env bash
# Build ctorch (Release) and run the main job: the headline benchmarks, each beside its
# baseline from the same run. Installs what is missing first.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
./build/ctorch version
./build/ctorch bench gemm
./build/ctorch bench lce --n 1024 --d 512 --v 128256
