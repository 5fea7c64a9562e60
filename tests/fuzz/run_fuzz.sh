#!/usr/bin/env bash
# Build every libFuzzer target (tests/fuzz/fuzz_*.c) with clang, ASan and UBSan, and run each
# for a bounded time over the seed corpus. Exit status non-zero on any finding; the crashing
# input is left in the build folder (crash-*, leak-*, timeout-*): add it to
# tests/fuzz/corpus/safetensors/ as regress-<what>.safetensors, and it becomes a C test
# (tests/c/test_io_corpus.c runs every corpus file through the same checks). The .pt
# targets (fuzz_zip, fuzz_pickle) start from seeds written by tests/fuzz/make_pt_corpus.py.
#
# Usage: bash tests/fuzz/run_fuzz.sh [SECONDS_PER_TARGET (default 30)] [TARGET...]
# Env:   FUZZ_BUILD_DIR (default build-fuzz), FUZZ_JOBS (libFuzzer processes per target, default 1),
#        FUZZ_PARALLEL (targets fuzzed at once, default the online CPUs)
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_PER_TARGET=${1:-30}
shift || true
BUILD=${FUZZ_BUILD_DIR:-build-fuzz}
JOBS=${FUZZ_JOBS:-1}
PARALLEL=${FUZZ_PARALLEL:-$(nproc)}
SEEDS=tests/fuzz/corpus/safetensors

command -v clang >/dev/null || { echo "run_fuzz.sh: clang is needed (apt-get install clang libclang-rt-14-dev)"; exit 1; }
# The library itself is instrumented for coverage (fuzzer-no-link), not only the targets.
# Warnings are the main build's business: a clang-only warning elsewhere must not stop fuzzing.
CC=clang cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCTORCH_FUZZ=ON -DCTORCH_WERROR=OFF \
  -DCMAKE_C_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
  >/dev/null
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
  for f in tests/fuzz/fuzz_*.c; do TARGETS+=("$(basename "$f" .c)"); done
fi
cmake --build "$BUILD" -j"$(nproc)" --target "${TARGETS[@]}"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TMPDIR=${TMPDIR:-/tmp}
# the seed scripts (some use PyTorch): the test stack of scripts/setup.sh --python
PY=${CTORCH_PYTHON:-.venv/bin/python}
# libctorch links MPI, whose UCX installs its own SIGILL/SIGSEGV handlers: they print a
# backtrace and exit before libFuzzer can write the crashing input. Leave signals to libFuzzer.
export UCX_HANDLE_ERRORS=${UCX_HANDLE_ERRORS:-none}
status=0
declare -A SEED
for t in "${TARGETS[@]}"; do  # the seeds first, one target after another
  work="$BUILD/fuzz-corpus/$t"   # new inputs go here; the seed folder stays untouched
  mkdir -p "$work" "$BUILD/fuzz-artifacts"
  seeds=$SEEDS
  if [ "$t" = fuzz_jit_expr ]; then  # the expression language: text seeds made by a script
    seeds="$BUILD/fuzz-seeds/jit_expr"
    "$PY" tests/fuzz/make_corpus_jit.py "$seeds"
  elif [ "$t" = fuzz_tokenizer ]; then  # tokenizer files of every format, made by a script
    seeds="$BUILD/fuzz-seeds/tokenizer"
    "$PY" tests/fuzz/make_corpus_tokenizer.py "$seeds"
  fi
  if [ "$t" = fuzz_jit_cache ]; then  # cache entries: flags, sum length, .sum text, .so bytes
    seeds="$BUILD/fuzz-seeds/jit_cache"
    mkdir -p "$seeds"
    printf '\004\000\000\177ELF\002\001\001' >"$seeds/right"
    printf '\004\012\000compiler x\177ELF' >"$seeds/right-trailer"
    printf '\000\025\000sha256 00\nsize 3\nkey\nabc' >"$seeds/wrong"
    printf '\014\000\000abc' >"$seeds/link"
    printf '\044\000\000abc' >"$seeds/fifo"
    printf '\024\000\000abc' >"$seeds/loose"
    printf '\003\000\000' >"$seeds/absent"
  fi
  if [ "$t" = fuzz_added_tokens ]; then  # count - 1, (length - 1, token bytes)..., the text
    seeds="$BUILD/fuzz-seeds/added_tokens"
    mkdir -p "$seeds"
    printf '\002\001ab\002abc\002bcd' >"$seeds/prefixes"
    printf 'xabcd abc bcdab ab' >>"$seeds/prefixes"
    printf '\003\002<x1\003<x12\003<x1>\003<x1>' >"$seeds/duplicates"
    printf '<x1><x12><x1 <<x1>>' >>"$seeds/duplicates"
    printf '\001\000\000\001\000\377' >"$seeds/bytes"
    printf '\000\377\000\000\377' >>"$seeds/bytes"
  fi
  if [ "$t" = fuzz_device_parse ]; then  # device names
    seeds="$BUILD/fuzz-seeds/device_parse"
    mkdir -p "$seeds"
    printf 'cpu' >"$seeds/cpu"
    printf 'cuda' >"$seeds/cuda"
    printf 'cuda:1023' >"$seeds/last"
    printf 'cuda:0012' >"$seeds/zeros"
  fi
  if [ "$t" = fuzz_checkpoint ]; then  # checkpoints and hostile variants, written by a script
    seeds="$BUILD/fuzz-seeds/checkpoint"
    "$PY" tests/fuzz/make_checkpoint_corpus.py "$seeds"
  fi
  case $t in  # the Hugging Face JSON targets: seeds written by a script
    fuzz_hf_*) seeds="$BUILD/fuzz-seeds/$t"; "$PY" tests/fuzz/make_hf_corpus.py "$t" "$seeds" ;;
    fuzz_token_ids) seeds="$BUILD/fuzz-seeds/$t"; "$PY" tests/fuzz/make_corpus_ids.py "$seeds" ;;
  esac
  if [ "$t" = fuzz_state_dict ]; then  # state dicts of the target's tiny models: script-made
    seeds="$BUILD/fuzz-seeds/state_dict"
    "$PY" tests/fuzz/make_state_dict_corpus.py "$seeds" >/dev/null
  fi
  if [ "$t" = fuzz_fsdp_index ]; then  # sharded checkpoint indexes: script-made seeds
    seeds="$BUILD/fuzz-seeds/fsdp_index"
    "$PY" tests/fuzz/make_fsdp_corpus.py "$seeds"
  fi
  if [ "$t" = fuzz_store_frames ] || [ "$t" = fuzz_comm_handshake ]; then  # comm: script-made
    seeds="$BUILD/fuzz-seeds/comm"
    mkdir -p "$seeds"
    "$PY" tests/fuzz/make_comm_corpus.py "$seeds"
  fi
  case $t in  # the .pt targets: PyTorch-written and hostile seeds written by a script
    fuzz_zip|fuzz_pickle)
      "$PY" tests/fuzz/make_pt_corpus.py "$BUILD/fuzz-seeds/pt" >/dev/null
      seeds="$BUILD/fuzz-seeds/pt/${t#fuzz_}" ;;
  esac
  SEED[$t]=$seeds
done

# Run the targets PARALLEL at a time (default: the online CPUs, so two at once on a 2-core
# machine: the same fuzzing time per target in half the wall time); each one's report is
# printed when all are done, in order.
run_one() {
  local t=$1 seeds=$2 work="$BUILD/fuzz-corpus/$1"
  if ! "$BUILD/$t" "$work" "$seeds" -max_total_time="$SECONDS_PER_TARGET" -max_len=65536 \
       -timeout=10 -rss_limit_mb=2048 -jobs="$JOBS" -workers="$JOBS" -print_final_stats=1 \
       -artifact_prefix="$BUILD/fuzz-artifacts/$t-" 2>"$BUILD/$t.log"; then
    echo "!! $t found a problem: see $BUILD/$t.log and $BUILD/fuzz-artifacts/"
    tail -40 "$BUILD/$t.log"
    return 1
  fi
  grep -E "stat::number_of_executed_units|stat::average_exec_per_sec|stat::peak_rss_mb" "$BUILD/$t.log" || true
}
echo "== ${#TARGETS[@]} targets, ${SECONDS_PER_TARGET} s each, $PARALLEL at a time"
for t in "${TARGETS[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$PARALLEL" ]; do wait -n || true; done
  rm -f "$BUILD/$t.rc"
  ( rc=0; run_one "$t" "${SEED[$t]}" >"$BUILD/$t.report" 2>&1 || rc=$?; echo "$rc" >"$BUILD/$t.rc" ) &
done
wait
for t in "${TARGETS[@]}"; do
  echo "== $t: ${SECONDS_PER_TARGET} s"
  cat "$BUILD/$t.report"
  [ "$(cat "$BUILD/$t.rc" 2>/dev/null)" = 0 ] || status=1
done
exit $status
