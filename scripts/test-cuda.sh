#!/usr/bin/env bash
# The CUDA backend's tests on a lent GPU machine (docs/cuda.md), in two halves:
#
#   bash scripts/test-cuda.sh pack   here (a machine with nvcc, no GPU needed): builds with
#                                    CTORCH_CUDA=ON (Release) and packs what must travel into
#                                    dist/cuda-pack/ (one xz tarball: the binaries, libctorch.so,
#                                    libctorch_cuda.so and the shared libraries they need beyond
#                                    glibc / libstdc++ / the driver: Jansson, OpenSSL's libcrypto,
#                                    MPICH and its transports, OpenBLAS and its Fortran runtime)
#   bash scripts/test-cuda.sh run    there, from the repository root with dist/cuda-pack present:
#                                    nvidia-smi -L, ctorch version, test_cuda_abi, test_backend_ops
#                                    (a GPU is required: no SKIPPED), ctorch train --device cuda
#                                    against --device cpu (when the CLI has --device), and
#                                    ctorch bench cuda --json beside PyTorch; every step under its
#                                    own timeout, all within 8 minutes. Logs go to $OUT when set
#                                    (the device tool brings $OUT back), else dist/cuda-run-logs.
#
# The device tool call (it carries ignored paths only when named):
#   run(carry=["dist/cuda-pack"], command="bash scripts/test-cuda.sh run", timeout_s=540)
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PACK_DIR=$ROOT/dist/cuda-pack
BUILD=${CT_CUDA_BUILD:-$ROOT/build-cuda-pack}

die() { echo "test-cuda.sh: $*" >&2; exit 1; }

# ---- pack --------------------------------------------------------------------------------------
do_pack() {
  set -e
  command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || die "pack: nvcc not found (CUDA toolkit needed to build libctorch_cuda.so)"
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCTORCH_CUDA=ON >/dev/null
  local targets="ctorch_cli ctorch test_backend_ops"
  grep -q "test_cuda_abi" "$BUILD/Makefile" 2>/dev/null && targets="$targets test_cuda_abi"
  grep -q "ctorch_cuda" "$BUILD/Makefile" 2>/dev/null && targets="$targets ctorch_cuda"
  cmake --build "$BUILD" -j"$(nproc)" --target $targets
  [ -f "$BUILD/libctorch_cuda.so" ] || die "pack: $BUILD/libctorch_cuda.so was not built (is CTORCH_CUDA on? see cmake's message)"

  local stage
  stage=$(mktemp -d)
  mkdir -p "$stage/bin" "$stage/lib"
  cp "$BUILD/ctorch" "$BUILD/test_backend_ops" "$stage/bin/"
  [ -f "$BUILD/test_cuda_abi" ] && cp "$BUILD/test_cuda_abi" "$stage/bin/"
  cp -P "$BUILD"/libctorch.so* "$BUILD/libctorch_cuda.so" "$stage/lib/"
  # OpenBLAS is dlopen()ed (src/ops/blas.c): add it by name, then the closure of every ldd.
  local seeds=("$stage"/bin/* "$stage/lib/libctorch_cuda.so")
  local ob
  ob=$(ldconfig -p | awk '/libopenblas\.so\.0 .*x86-64/ {print $NF; exit}')
  [ -n "$ob" ] && seeds+=("$ob")
  # Kept out: glibc's own libraries, the C++ runtime, the GPU driver (all on the device image).
  local skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|librt\.so|libpthread\.so|libutil\.so|libresolv\.so|libstdc\+\+\.so|libgcc_s\.so|libcuda\.so|libnvidia)'
  local todo=("${seeds[@]}") seen=" " f dep
  while [ ${#todo[@]} -gt 0 ]; do
    f=${todo[0]}; todo=("${todo[@]:1}")
    while read -r dep; do
      [ -n "$dep" ] || continue
      case "$seen" in *" $dep "*) continue ;; esac
      seen="$seen$dep "
      basename "$dep" | grep -Eq "$skip" && continue
      cp -L "$dep" "$stage/lib/$(basename "$dep")"
      todo+=("$dep")
    done < <(ldd "$f" 2>/dev/null | awk '/=> \// {print $3}')
  done
  [ -n "$ob" ] && cp -L "$ob" "$stage/lib/libopenblas.so.0"
  strip --strip-unneeded "$stage"/lib/*.so* "$stage"/bin/* 2>/dev/null || true
  ( cd "$stage" && find . -type f | sort > MANIFEST && git -C "$ROOT" rev-parse HEAD > COMMIT 2>/dev/null || true )
  rm -rf "$PACK_DIR"
  mkdir -p "$PACK_DIR"
  tar -C "$stage" -cJf "$PACK_DIR/cuda-pack.tar.xz" .
  rm -rf "$stage"
  local bytes
  bytes=$(stat -c %s "$PACK_DIR/cuda-pack.tar.xz")
  echo "packed $PACK_DIR/cuda-pack.tar.xz: $((bytes / 1048576)) MiB ($(tar -tJf "$PACK_DIR/cuda-pack.tar.xz" | grep -c '/lib/') libraries)"
  [ "$bytes" -lt $((64 * 1048576)) ] || die "pack: the pack is over the device tool's 64 MiB carry limit"
}

# ---- run ---------------------------------------------------------------------------------------
BUDGET=${CT_CUDA_BUDGET_S:-470}   # the whole run, seconds (8 minutes less a margin)
T0=$(date +%s)
FAILS=0
LOGS=""
SUMMARY=""

left() { echo $((BUDGET - ($(date +%s) - T0))); }

# step NAME LIMIT_S CMD...: runs CMD with the smaller of LIMIT_S and the budget left, logs it.
step() {
  local name=$1 limit=$2
  shift 2
  local l
  l=$(left)
  [ "$l" -lt "$limit" ] && limit=$l
  if [ "$limit" -le 5 ]; then
    echo "== $name: not run (the 8-minute budget is spent)"
    SUMMARY="$SUMMARY$name: not run (budget)\n"
    FAILS=$((FAILS + 1))
    return
  fi
  echo "== $name (limit ${limit}s)"
  local t=$(date +%s) rc
  timeout --kill-after=5 "$limit" "$@" > "$LOGS/$name.log" 2>&1
  rc=$?
  cat "$LOGS/$name.log"
  local took=$(( $(date +%s) - t ))
  if [ $rc -eq 0 ]; then
    SUMMARY="$SUMMARY$name: ok (${took}s)\n"
  else
    [ $rc -eq 124 ] && echo "== $name: timed out after ${limit}s"
    SUMMARY="$SUMMARY$name: FAILED rc=$rc (${took}s)\n"
    FAILS=$((FAILS + 1))
  fi
}

# cuBLASLt: $CTORCH_CUBLASLT_LIB, else the device's PyTorch wheels (nvidia/*), else CUDA's paths.
find_cublaslt() {
  if [ -n "${CTORCH_CUBLASLT_LIB:-}" ] && [ -f "$CTORCH_CUBLASLT_LIB" ]; then echo "$CTORCH_CUBLASLT_LIB"; return; fi
  local py f
  for py in "${CTORCH_PYTHON:-}" python3 python; do
    [ -n "$py" ] && command -v "$py" >/dev/null || continue
    f=$("$py" - <<'EOF' 2>/dev/null
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except Exception:
    roots = []
try:
    import nvidia.cublas as c
    roots = [os.path.dirname(c.__file__)] + roots
except Exception:
    pass
for r in roots:
    hits = sorted(glob.glob(os.path.join(r, "**", "libcublasLt.so*"), recursive=True))
    if hits:
        print(hits[0]); break
EOF
)
    [ -n "$f" ] && { echo "$f"; return; }
  done
  for f in /usr/local/cuda/lib64/libcublasLt.so* /usr/local/cuda/targets/x86_64-linux/lib/libcublasLt.so* \
           /usr/local/cuda-*/lib64/libcublasLt.so* /usr/lib/x86_64-linux-gnu/libcublasLt.so*; do
    [ -f "$f" ] && { echo "$f"; return; }
  done
}

do_run() {
  [ -f "$PACK_DIR/cuda-pack.tar.xz" ] || die "run: $PACK_DIR/cuda-pack.tar.xz missing: run 'bash scripts/test-cuda.sh pack' first and carry dist/cuda-pack"
  LOGS=${OUT:-$ROOT/dist/cuda-run-logs}
  mkdir -p "$LOGS"
  local W
  W=$(mktemp -d "${TMPDIR:-/tmp}/ctorch-cuda-run.XXXXXX")
  tar -C "$W" -xJf "$PACK_DIR/cuda-pack.tar.xz" || die "run: cannot unpack the pack"
  echo "pack of commit $(cat "$W/COMMIT" 2>/dev/null || echo '?'); this tree at $(git rev-parse HEAD 2>/dev/null || echo '?')"
  local lt
  lt=$(find_cublaslt)
  export LD_LIBRARY_PATH="$W/lib${lt:+:$(dirname "$lt")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export CTORCH_CUDA_LIB="$W/lib/libctorch_cuda.so"
  [ -n "$lt" ] && export CTORCH_CUBLASLT_LIB="$lt"
  echo "cuBLASLt: ${lt:-not found (GEMM slots will say so)}"
  export CTORCH_SOURCE_DIR=$ROOT                 # bench/ scripts for ctorch bench
  export CTORCH_PYTHON=${CTORCH_PYTHON:-$(command -v python3 || true)}
  export CT_TEST_REQUIRE_CUDA=1                  # test_backend_ops: no GPU is a failure here
  local B=$W/bin

  step nvidia-smi 15 nvidia-smi -L
  step version 30 "$B/ctorch" version
  [ -x "$B/test_cuda_abi" ] && step test_cuda_abi 60 "$B/test_cuda_abi"
  step test_backend_ops 150 "$B/test_backend_ops"
  if "$B/ctorch" train --help 2>&1 | grep -q -- '--device'; then
    local args=(--steps 50 --log-every 1 --quiet)
    step train_cpu 90 "$B/ctorch" train --device cpu --out "$W/run-cpu" "${args[@]}"
    step train_cuda 90 "$B/ctorch" train --device cuda --out "$W/run-cuda" "${args[@]}"
    step train_compare 15 python3 - "$W/run-cpu/metrics.jsonl" "$W/run-cuda/metrics.jsonl" <<'EOF'
import json, sys
def losses(p):
    out = []
    for line in open(p):
        r = json.loads(line)
        if "loss" in r and "step" in r and "event" not in r:
            out.append((r["step"], r["loss"]))
    return out
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert a and len(a) == len(b), f"{len(a)} cpu vs {len(b)} cuda loss rows"
worst = max(abs(x[1] - y[1]) / max(abs(x[1]), 1e-12) for x, y in zip(a, b))
print(f"{len(a)} losses, worst relative difference cuda vs cpu {worst:.3g} (bound 1e-3)")
sys.exit(0 if worst <= 1e-3 else 1)
EOF
    for f in "$W"/run-cpu/metrics.jsonl "$W"/run-cuda/metrics.jsonl; do
      [ -f "$f" ] && cp "$f" "$LOGS/$(basename "$(dirname "$f")")-metrics.jsonl"
    done
  else
    echo "== train: skipped: this ctorch has no 'train --device' yet"
    SUMMARY="${SUMMARY}train: not run (no --device in this CLI)\n"
  fi
  # the JSON alone in bench_cuda.json; the log has it and whatever went to stderr
  step bench_cuda 240 bash -c '"$0" bench cuda --json > "$1"; rc=$?; cat "$1"; exit $rc' "$B/ctorch" "$LOGS/bench_cuda.json"

  echo "== summary ($(( $(date +%s) - T0 ))s)"
  printf "%b" "$SUMMARY" | tee "$LOGS/summary.txt"
  rm -rf "$W"
  [ $FAILS -eq 0 ] || exit 1
}

case "${1:-}" in
  pack) do_pack ;;
  run) do_run ;;
  *) echo "usage: bash scripts/test-cuda.sh pack | run   (docs/cuda.md)" >&2; exit 2 ;;
esac
