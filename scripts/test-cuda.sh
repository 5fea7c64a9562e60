#!/usr/bin/env bash
# The CUDA backend's tests on a lent GPU machine (docs/cuda.md), in two halves:
#
#   bash scripts/test-cuda.sh pack   here (a machine with nvcc, no GPU needed): builds with
#                                    CTORCH_CUDA=ON (Release) and packs what must travel into
#                                    dist/cuda-pack/ (one xz tarball: the binaries and C tests,
#                                    libctorch.so, libctorch_cuda.so and the shared libraries they
#                                    need beyond glibc / libstdc++ / the driver: Jansson, OpenSSL's
#                                    libcrypto, MPICH and its transports, OpenBLAS and its Fortran
#                                    runtime; and pytest with its pure-Python dependencies from
#                                    .venv, used there only when the machine's python lacks it)
#   bash scripts/test-cuda.sh run    there, from the repository root with dist/cuda-pack present.
#                                    Correctness first, benchmarks last; every step under its own
#                                    timeout (estimates on an H200 beside each), a failing step
#                                    reported and the rest still run, all within 8 minutes:
#                                      nvidia-smi -L, ctorch version, test_cuda_abi (~5 s)
#                                      test_backend_ops incl. flex (a GPU is required; ~40 s)
#                                      test_device_flex, test_flex_jit_device when built (~30 s)
#                                      train_checks below (dense: cpu vs cuda, bitwise, resume,
#                                        generate; ~40 s)
#                                      flex_train_checks below (--window 32 and compiled
#                                        --mask-mod / --score-mod, cuda vs cpu; ~40 s)
#                                      tests/python/test_cuda_flex.py (when present) and
#                                        test_cuda_loss.py with the machine's CUDA PyTorch, a
#                                        skipped test counted as a failure (~40 s)
#                                      ctorch bench cuda --only flex --json: the issue's flex goal
#                                        shapes beside PyTorch (~120 s, torch.compile included)
#                                      ctorch bench cuda --quick --only gemm,loss,train --json
#                                        (~120 s), with the budget left
#                                    then a summary. Logs go to $OUT when set (the device tool
#                                    brings $OUT back), else dist/cuda-run-logs.
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
  local targets="ctorch_cli ctorch test_backend_ops" t
  # the device's C tests that this tree has (some are written while others exist)
  local ctests="test_cuda_abi test_device_flex test_flex_jit_device"
  for t in $ctests; do
    grep -q "^$t:" "$BUILD/Makefile" 2>/dev/null && targets="$targets $t"
  done
  grep -q "^ctorch_cuda:" "$BUILD/Makefile" 2>/dev/null && targets="$targets ctorch_cuda"
  cmake --build "$BUILD" -j"$(nproc)" --target $targets
  [ -f "$BUILD/libctorch_cuda.so" ] || die "pack: $BUILD/libctorch_cuda.so was not built (is CTORCH_CUDA on? see cmake's message)"

  local stage
  stage=$(mktemp -d)
  mkdir -p "$stage/bin" "$stage/lib"
  cp "$BUILD/ctorch" "$BUILD/test_backend_ops" "$stage/bin/"
  for t in $ctests; do
    [ -f "$BUILD/$t" ] && cp "$BUILD/$t" "$stage/bin/"
  done
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
  # pytest and its pure-Python dependencies (for the device's python when it lacks pytest)
  local site
  site=$("$ROOT/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null || true)
  if [ -n "$site" ] && [ -d "$site/_pytest" ]; then
    mkdir -p "$stage/pylib"
    local m
    for m in pytest _pytest pluggy iniconfig packaging pygments py.py exceptiongroup tomli; do
      [ -e "$site/$m" ] && cp -r "$site/$m" "$stage/pylib/"
    done
    find "$stage/pylib" -name __pycache__ -type d -prune -exec rm -rf {} +
  else
    echo "pack: no pytest in .venv (bash scripts/setup.sh --python): the device's python must have it"
  fi
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

# deadline LIMIT MARGIN: seconds since the epoch MARGIN before the end of a step of LIMIT (or of
# the budget left, when less).
deadline() {
  local l
  l=$(left)
  [ "$l" -lt "$1" ] || l=$1
  echo $(( $(date +%s) + l - $2 ))
}

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

# find_nvlib VAR NAME: a CUDA library NAME (libcublasLt, libnvrtc): $VAR when it names a file,
# else the device's PyTorch wheels (nvidia/cu13/lib, nvidia/cublas/lib, nvidia/cuda_nvrtc/lib,
# ...), else CUDA's paths.
find_nvlib() {
  local var=$1 name=$2
  local given=${!var:-}
  if [ -n "$given" ] && [ -f "$given" ]; then echo "$given"; return; fi
  local py f
  for py in "${CTORCH_PYTHON:-}" python3 python; do
    [ -n "$py" ] && command -v "$py" >/dev/null || continue
    f=$(NVLIB="$name" "$py" - <<'EOF' 2>/dev/null
import glob, os
name = os.environ["NVLIB"]
try:
    import nvidia
    roots = list(nvidia.__path__)
except Exception:
    roots = []
for r in roots:
    # the library itself (libnvrtc.so.13), not libnvrtc-builtins or an alias
    hits = sorted(h for h in glob.glob(os.path.join(r, "**", name + ".so*"), recursive=True)
                  if os.path.basename(h).startswith(name + ".so"))
    if hits:
        print(hits[0])
        break
EOF
)
    [ -n "$f" ] && { echo "$f"; return; }
  done
  for f in /usr/local/cuda/lib64/$name.so* /usr/local/cuda/targets/x86_64-linux/lib/$name.so* \
           /usr/local/cuda-*/lib64/$name.so* /usr/lib/x86_64-linux-gnu/$name.so*; do
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

# flex_train_checks BIN WORK: FlexAttention in training on the GPU against the CPU (issue 23):
# the default model, 20 steps, the same seed, (1) --window 32 (a causal sliding window through
# the flex slots, with the document mask), (2) compiled --mask-mod and --score-mod (the jit's
# mods: NVRTC on the GPU, the C compiler on the CPU); each pair's 20 losses within 1e-3
# relative (train_check.py of train_checks).
flex_train_checks() {
  local B=$1 W=$2
  local R=$W/flex-runs
  mkdir -p "$R"
  local args=(--steps 20 --seed 1 --quiet)
  local mods=(--mask-mod 'q - kv <= 48 || kv < 4' --score-mod 'score + 0.05 * (kv - q)')
  local d
  for d in cpu cuda; do
    step "train_window_$d" 60 "$B/ctorch" train --device $d --window 32 --out "$R/window-$d" "${args[@]}"
  done
  step train_window_compare 15 python3 "$W/train_check.py" close "$R/window-cpu/metrics.jsonl" \
    "$R/window-cuda/metrics.jsonl" 20 1e-3
  for d in cpu cuda; do
    step "train_mods_$d" 90 "$B/ctorch" train --device $d "${mods[@]}" --out "$R/mods-$d" "${args[@]}"
  done
  step train_mods_compare 15 python3 "$W/train_check.py" close "$R/mods-cpu/metrics.jsonl" \
    "$R/mods-cuda/metrics.jsonl" 20 1e-3
  for d in window-cpu window-cuda mods-cpu mods-cuda; do
    [ -f "$R/$d/metrics.jsonl" ] && cp "$R/$d/metrics.jsonl" "$LOGS/metrics-$d.jsonl"
  done
}

# python_tests WORK: the Python tests of the CUDA backend with the machine's CUDA PyTorch, the
# pack's libctorch and CLI; a skipped test fails the step (here a GPU must run them all).
python_tests() {
  local W=$1 f
  local pp=""
  if ! "$CTORCH_PYTHON" -c 'import pytest' >/dev/null 2>&1; then
    if [ -d "$W/pylib" ]; then pp=$W/pylib; else echo "== python tests: $CTORCH_PYTHON has no pytest and the pack none"; fi
  fi
  for f in test_cuda_flex.py test_cuda_loss.py; do
    if [ ! -f "$ROOT/tests/python/$f" ]; then
      echo "== python $f: not in this tree"
      SUMMARY="${SUMMARY}python_$f: not in this tree\n"
      continue
    fi
    step "python_${f%.py}" 90 bash -c 'out=$("$@" 2>&1); rc=$?; printf "%s\n" "$out"
      if printf "%s\n" "$out" | tail -n 1 | grep -q "skipped"; then
        echo "FAIL: a test was skipped (a GPU runs them all here)"; rc=1; fi; exit $rc' _ \
      env PYTHONPATH="$pp${PYTHONPATH:+:$PYTHONPATH}" CTORCH_LIB="$W/lib/libctorch.so" CTORCH_CLI="$W/bin/ctorch" \
      "$CTORCH_PYTHON" -m pytest -q -rs -p no:cacheprovider "tests/python/$f"
  done
}

# write_bench_flex_check FILE: a check of bench cuda's flex rows (python3 FILE JSON): ctorch's
# rows have figures and its forward + backward repeated gave the same bytes; prints the figures
# beside PyTorch's and the goals.
write_bench_flex_check() {
  cat > "$1" <<'EOF'
import json, sys
j = json.loads(open(sys.argv[1]).read())
if j.get("status") != "ok":
    print("FAIL: bench cuda:", j.get("status"), j.get("reason"))
    sys.exit(1)
bad = 0
def ms(m, p):
    x = (m or {}).get(p) or {}
    return "%.3f" % (1e3 * x["median_s"]) if "median_s" in x else ("failed" if "error" in x else "-")
print("bf16 GEMM %s: %.1f TFLOP/s" % (j["flex"]["gemm_bf16"]["case"], j["flex"]["gemm_bf16"].get("tflops", 0)))
for r in j["flex"]["rows"]:
    print("%s B=%d H=%d L=%d E=%d:" % (r["case"], r["B"], r["H"], r["L"], r["E"]))
    t = r.get("torch", {})
    for who, m in (("ctorch flex", r.get("ctorch_flex")), ("ctorch sdpa causal", r.get("ctorch_sdpa_causal")),
                   ("torch flex compiled", t.get("flex_compiled")), ("torch sdpa bool mask", t.get("sdpa_bool_mask")),
                   ("torch sdpa causal flash", t.get("sdpa_causal_flash"))):
        if m is None:
            continue
        extra = ""
        if "fwd_vs_gemm_bf16" in m:
            extra = "  fwd %.1f TFLOP/s on kept blocks = %.3f x GEMM" % (m["fwd_kept_block_tflops"], m["fwd_vs_gemm_bf16"])
        det = ("%s ms" % ms(m, "fwd_bwd_deterministic")) if who.startswith("torch") else "the same (always)"
        print("  %-24s fwd %s ms, fwd+bwd %s ms, deterministic fwd+bwd %s%s" % (
            who, ms(m, "fwd"), ms(m, "fwd_bwd"), det, extra))
        if "error" in m:
            print("    error:", m["error"])
    if "status" in t:
        print("  PyTorch:", t["status"])
    if "error" in t:
        print("  PyTorch failed:", t["error"])
    for k in ("ctorch_flex", "ctorch_sdpa_causal"):
        m = r.get(k)
        if m is None:
            continue
        if "error" in m:
            print("FAIL: %s: %s" % (k, m["error"]))
            bad += 1
        elif m.get("bitwise_repeatable") is not True:
            print("FAIL: %s forward + backward twice: the bytes differ" % k)
            bad += 1
        else:
            print("  %s forward + backward twice: identical bytes" % k)
    if "goals" in r:
        print("  goals:", json.dumps(r["goals"]))
sys.exit(1 if bad else 0)
EOF
}

do_run() {
  [ -f "$PACK_DIR/cuda-pack.tar.xz" ] || die "run: $PACK_DIR/cuda-pack.tar.xz missing: run 'bash scripts/test-cuda.sh pack' first and carry dist/cuda-pack"
  LOGS=${OUT:-$ROOT/dist/cuda-run-logs}
  mkdir -p "$LOGS"
  local W
  W=$(mktemp -d "${TMPDIR:-/tmp}/ctorch-cuda-run.XXXXXX")
  tar -C "$W" -xJf "$PACK_DIR/cuda-pack.tar.xz" || die "run: cannot unpack the pack"
  echo "pack of commit $(cat "$W/COMMIT" 2>/dev/null || echo '?'); this tree at $(git rev-parse HEAD 2>/dev/null || echo '?')"
  local lt rt
  lt=$(find_nvlib CTORCH_CUBLASLT_LIB libcublasLt)
  rt=$(find_nvlib CTORCH_NVRTC_LIB libnvrtc)
  # (NVRTC's directory on the path too: it loads its builtins library from there)
  export LD_LIBRARY_PATH="$W/lib${lt:+:$(dirname "$lt")}${rt:+:$(dirname "$rt")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export CTORCH_CUDA_LIB="$W/lib/libctorch_cuda.so"
  [ -n "$lt" ] && export CTORCH_CUBLASLT_LIB="$lt"
  [ -n "$rt" ] && export CTORCH_NVRTC_LIB="$rt"
  echo "cuBLASLt: ${lt:-not found (GEMM slots will say so)}"
  echo "NVRTC: ${rt:-not found (compiled mods on the GPU will say so)}"
  export CT_CACHE_DIR=$W/jit-cache               # compiled mods' cache: not the user's
  export CTORCH_SOURCE_DIR=$ROOT                 # bench/ scripts for ctorch bench
  export CTORCH_PYTHON=${CTORCH_PYTHON:-$(command -v python3 || true)}
  export CT_TEST_REQUIRE_CUDA=1                  # test_backend_ops: no GPU is a failure here
  local B=$W/bin

  step nvidia-smi 15 nvidia-smi -L
  step version 30 "$B/ctorch" version
  [ -x "$B/test_cuda_abi" ] && step test_cuda_abi 60 "$B/test_cuda_abi"
  step test_backend_ops 120 "$B/test_backend_ops"
  local t
  for t in test_device_flex test_flex_jit_device; do
    if [ -x "$B/$t" ]; then step "$t" 90 "$B/$t"
    else echo "== $t: not in this pack"; SUMMARY="${SUMMARY}$t: not in this pack\n"; fi
  done
  if "$B/ctorch" train --help 2>&1 | grep -q -- '--device'; then
    train_checks "$B" "$W"
    flex_train_checks "$B" "$W"
  else
    echo "== train: skipped: this ctorch has no 'train --device' yet"
    SUMMARY="${SUMMARY}train: not run (no --device in this CLI)\n"
  fi
  python_tests "$W"
  # Benchmarks (each JSON alone in its file; the log has it and whatever went to stderr).
  # The flex rows at the issue's goal shapes beside PyTorch (torch.compile of flex_attention per
  # shape, deterministic algorithms off and on), then their figures and the bitwise check.
  # PyTorch's side starts no new entry past CTORCH_BENCH_DEADLINE (a margin before the step's
  # timeout for a compilation under way), so the JSON comes back with what was measured.
  step bench_cuda_flex 170 env CTORCH_BENCH_DEADLINE=$(deadline 170 40) \
    bash -c '"$0" bench cuda --only flex --json > "$1"; rc=$?; cat "$1"; exit $rc' "$B/ctorch" "$LOGS/bench_cuda_flex.json"
  write_bench_flex_check "$W/bench_flex_check.py"
  step bench_cuda_flex_check 15 python3 "$W/bench_flex_check.py" "$LOGS/bench_cuda_flex.json"
  # --quick (GEMM, the loss at N=1024, the training steps at the default model and GPT-2 B=4 beside
  # PyTorch eager / torch.compile): the full run takes longer than this script's budget
  step bench_cuda 200 env CTORCH_BENCH_DEADLINE=$(deadline 200 80) \
    bash -c '"$0" bench cuda --quick --only gemm,loss,train --json > "$1"; rc=$?; cat "$1"; exit $rc' "$B/ctorch" "$LOGS/bench_cuda.json"

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
