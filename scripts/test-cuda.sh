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
#                                    against --device cpu (50 losses within 1e-3; the cuda run
#                                    twice, bitwise the same; each checkpoint resumed on the other
#                                    device; generate --device cuda = --device cpu --no-cache
#                                    greedy ids; train_checks below), and ctorch bench cuda
#                                    --quick --json beside PyTorch; every step under its own
#                                    timeout, all within 8 minutes. Logs go to $OUT when set
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
  # (awk reads to the end: an early exit would SIGPIPE ldconfig, which pipefail turns into 141)
  ob=$(ldconfig -p | awk '/libopenblas\.so\.0 .*x86-64/ && !f {print $NF; f = 1}')
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

# train_checks BIN WORK: ctorch train on the GPU against the CPU. The same seed and settings
# (the default model, a 52-step schedule stopped at step 50, dense causal attention, no document
# mask) on --device cpu and --device cuda: the 50 losses of metrics.jsonl within 1e-3 relative;
# the cuda run twice: the same losses, gradient norms and checkpoint bytes (bitwise repeatable);
# each checkpoint resumed on the other device for steps 51 and 52; ctorch generate --device cuda
# from the cuda checkpoint equals --device cpu --no-cache (greedy ids).
train_checks() {
  local B=$1 W=$2
  local args=(--steps 52 --stop-at 50 --dense-attention --no-doc-mask --seed 1 --quiet)
  cat > "$W/train_check.py" <<'EOF'
import json, math, sys

def rows(p):
    out = {}
    for line in open(p):
        r = json.loads(line)
        if "event" not in r and "loss" in r and "step" in r:
            out[r["step"]] = r
    return out

def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)

def rel(x, y):
    return abs(x - y) / max(abs(x), 1e-12)

mode = sys.argv[1]
if mode == "close":  # close A B N BOUND: the same N steps in A and B, losses within BOUND
    a, b, n, bound = rows(sys.argv[2]), rows(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    if sorted(a) != sorted(b) or len(a) != n:
        fail(f"steps differ: {sorted(a)} vs {sorted(b)} (want {n})")
    if not all(math.isfinite(a[s]["loss"]) and math.isfinite(b[s]["loss"]) for s in a):
        fail("a loss is not finite")
    worst = max(a, key=lambda s: rel(a[s]["loss"], b[s]["loss"]))
    w = rel(a[worst]["loss"], b[worst]["loss"])
    print(f"{n} losses (steps {min(a)}..{max(a)}), worst relative difference {w:.3g} at step {worst} "
          f"({a[worst]['loss']!r} vs {b[worst]['loss']!r}), bound {bound:g}")
    if w > bound:
        fail(f"relative difference {w:.3g} > {bound:g}")
    print("PASS")
elif mode == "same":  # same A B: bitwise the same losses, gradient norms, held-out losses
    a, b = rows(sys.argv[2]), rows(sys.argv[3])
    if not a or sorted(a) != sorted(b):
        fail(f"steps differ: {sorted(a)} vs {sorted(b)}")
    for s in sorted(a):
        for k in ("loss", "grad_norm", "eval_loss"):
            if a[s].get(k) != b[s].get(k):
                fail(f"step {s} {k}: {a[s].get(k)!r} vs {b[s].get(k)!r} (not bitwise repeatable)")
    print(f"{len(a)} steps: losses, gradient norms and held-out losses identical run to run")
    print("PASS")
elif mode == "ids":  # ids A B: generate --json outputs with the same new_ids
    a, b = (json.loads(open(p).read().strip().splitlines()[-1]) for p in sys.argv[2:4])
    if not a["new_ids"] or a["new_ids"] != b["new_ids"]:
        fail(f"greedy ids differ:\n  {a['new_ids']}\n  {b['new_ids']}")
    print(f"{len(a['new_ids'])} greedy ids equal: {a['new_ids']}")
    print("PASS")
else:
    fail(f"unknown mode {mode}")
EOF
  local R=$W/runs
  mkdir -p "$R"
  step train_cpu 120 "$B/ctorch" train --device cpu --out "$R/cpu" "${args[@]}"
  step train_cuda 90 "$B/ctorch" train --device cuda --out "$R/cuda" "${args[@]}"
  step train_cuda_again 90 "$B/ctorch" train --device cuda --out "$R/cuda2" "${args[@]}"
  step train_compare 15 python3 "$W/train_check.py" close "$R/cpu/metrics.jsonl" "$R/cuda/metrics.jsonl" 50 1e-3
  step train_cuda_repeatable 15 bash -c 'python3 "$0" same "$1/metrics.jsonl" "$2/metrics.jsonl" &&
    cmp "$1/checkpoint.safetensors" "$2/checkpoint.safetensors" && echo "checkpoints: identical bytes"' \
    "$W/train_check.py" "$R/cuda" "$R/cuda2"
  # each checkpoint continued on the other device for steps 51 and 52 (the schedule's last two)
  step resume_cuda_on_cpu 60 "$B/ctorch" train --resume "$R/cuda/checkpoint.safetensors" --device cpu \
    --out "$R/cuda-then-cpu" --quiet
  step resume_cpu_on_cuda 60 "$B/ctorch" train --resume "$R/cpu/checkpoint.safetensors" --device cuda \
    --out "$R/cpu-then-cuda" --quiet
  step resume_compare 15 python3 "$W/train_check.py" close "$R/cuda-then-cpu/metrics.jsonl" \
    "$R/cpu-then-cuda/metrics.jsonl" 2 1e-3
  # greedy ids from the cuda checkpoint: the GPU (which recomputes every token) vs the CPU's
  # recomputing baseline
  local gen=(--model "$R/cuda/checkpoint.safetensors" --greedy --ignore-eos --max-new-tokens 32 --json)
  step generate_cuda 60 bash -c 'out=$1; shift; "$0" generate --device cuda "$@" > "$out"' \
    "$B/ctorch" "$R/gen-cuda.json" "${gen[@]}"
  step generate_cpu 60 bash -c 'out=$1; shift; "$0" generate --device cpu --no-cache "$@" > "$out"' \
    "$B/ctorch" "$R/gen-cpu.json" "${gen[@]}"
  step generate_compare 15 python3 "$W/train_check.py" ids "$R/gen-cpu.json" "$R/gen-cuda.json"
  local d
  for d in cpu cuda cuda2 cuda-then-cpu cpu-then-cuda; do
    [ -f "$R/$d/metrics.jsonl" ] && cp "$R/$d/metrics.jsonl" "$LOGS/metrics-$d.jsonl"
  done
  cp "$R"/gen-*.json "$LOGS/" 2>/dev/null || true
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
    train_checks "$B" "$W"
  else
    echo "== train: skipped: this ctorch has no 'train --device' yet"
    SUMMARY="${SUMMARY}train: not run (no --device in this CLI)\n"
  fi
  # the JSON alone in bench_cuda.json; the log has it and whatever went to stderr
  # --quick (GEMM, the loss at N=1024, the training steps at the default model and GPT-2 B=4 beside
  # PyTorch eager / torch.compile): the full run takes longer than this script's budget
  step bench_cuda 200 bash -c '"$0" bench cuda --quick --json > "$1"; rc=$?; cat "$1"; exit $rc' "$B/ctorch" "$LOGS/bench_cuda.json"

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
