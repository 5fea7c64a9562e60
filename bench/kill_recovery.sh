#!/bin/sh
# Repeat the SIGKILL recovery test: 4 ranks under `ctorch launch --elastic`, rank 2 killed in
# the middle of a 16 MiB all_reduce; the survivors must get ERROR naming it well within the
# 3 s timeout, shrink to 3 ranks and complete correct all_reduces. Prints one line per run
# and the number of successes. Not part of CI (it takes a few seconds per run).
#
#   bench/kill_recovery.sh [BUILD_DIR] [RUNS]     (defaults: build 20)
set -u
build=${1:-build}
runs=${2:-20}
cli="$build/ctorch"
test="$build/test_comm_faults"
if [ ! -x "$cli" ] || [ ! -x "$test" ]; then
    echo "kill_recovery: build first (need $cli and $test)" >&2
    exit 2
fi
ok=0
i=1
while [ "$i" -le "$runs" ]; do
    start=$(date +%s.%N)
    out=$(CTORCH_CLI="$cli" timeout 120 "$test" --kill-only 2>&1)
    rc=$?
    end=$(date +%s.%N)
    detail=$(printf '%s\n' "$out" | grep -o 'error after [0-9.]* s ([a-z]* the big all_reduce)' | head -1)
    shrink=$(printf '%s\n' "$out" | grep -o 'shrunk in [0-9.]* s' | head -1)
    if [ "$rc" -eq 0 ]; then
        ok=$((ok + 1))
        verdict=ok
    else
        verdict="FAILED (status $rc)"
    fi
    printf 'run %2d: %s in %.2f s; %s; %s\n' "$i" "$verdict" "$(awk "BEGIN { print $end - $start }")" "$detail" "$shrink"
    i=$((i + 1))
done
echo "kill_recovery: $ok of $runs runs recovered"
[ "$ok" -eq "$runs" ]
