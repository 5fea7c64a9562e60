#!/usr/bin/env bash
# AArch64: cross-build ctorch with Debian's gcc-aarch64-linux-gnu and run a stated subset of
# the C test suite under qemu-user on four CPUs: SVE at 128, 256 and 512 bits
# (qemu-aarch64 -cpu max,sve-default-vector-length=16|32|64) and a NEON-only CPU
# (-cpu max,sve=off). Prints pass/fail per CPU and the total time; exits nonzero on any
# failure.
#
# The subset (qemu runs ~10-50x slower than the host, and the CI budget is minutes):
#   core, kernels_isa (every kernel table the emulated CPU has, against the double
#   references), ops_* (elementwise, norm, reduce, sort, index, embedding), gemm, loss,
#   attention_* (sdpa, flex, mask, kernels) and io_* (safetensors, pt, save, corpus), plus
#   the header example. Left out: comm_* and dist_* (multi-process sockets, not emulated
#   here), model_* and jit (training loops, a C compiler at run time: too slow under qemu),
#   telemetry (reads the host's /proc and /sys, not the emulated CPU's).
# The tests run at the sizes they use on x86 except where CT_TEST_REDUCED=1 (set here) makes
# a test cut its sweep (see tests/c/test_util.h).
#
# Set-up (idempotent, skipped when everything is present; needs root or sudo):
#   dpkg --add-architecture arm64; apt-get install qemu-user gcc-aarch64-linux-gnu
#   libc6-dev-arm64-cross libjansson-dev:arm64 libssl-dev:arm64 libopenblas0:arm64
# The arm64 libraries come from Debian multiarch (/usr/lib/aarch64-linux-gnu), and so does
# the loader qemu runs: the binaries name /lib/ld-linux-aarch64.so.1, which libc6:arm64
# installs. QEMU_LD_PREFIX is unset on purpose: /usr/aarch64-linux-gnu holds the cross
# package's loader (libc6-arm64-cross), whose version can differ from the multiarch libc
# it then loads; with Debian 12's 2.36-8cross1 loader and 2.36-9+deb12u libc every
# pthread_create spun forever in a lock (the suite "timed out" under qemu).
#
# Environment: CT_AARCH64_BUILD (default build-aarch64), CT_AARCH64_CPUS (default the four
# CPUs above, space separated qemu -cpu values), CT_AARCH64_JOBS (default nproc).
set -euo pipefail
cd "$(dirname "$0")/.."

t_start=$(date +%s)
BUILD=${CT_AARCH64_BUILD:-build-aarch64}
CPUS=${CT_AARCH64_CPUS:-"max,sve-default-vector-length=16 max,sve-default-vector-length=32 max,sve-default-vector-length=64 max,sve=off"}
JOBS=${CT_AARCH64_JOBS:-$(nproc)}
SUBSET='^test_(core|kernels_isa|ops_.*|gemm|gemm_own|gemm_ctorch_gemm|loss|attention_.*|io_.*|header_example)$'
PKGS="qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross libjansson-dev:arm64 libssl-dev:arm64 libopenblas0:arm64"

have_all() {
    command -v aarch64-linux-gnu-gcc >/dev/null && command -v qemu-aarch64 >/dev/null || return 1
    local p
    for p in libc6:arm64 libc6-dev-arm64-cross libjansson-dev:arm64 libssl-dev:arm64 libopenblas0:arm64; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || return 1
    done
}

if ! have_all; then
    SUDO=
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null || { echo "test-aarch64: need root (or sudo) to install: $PKGS" >&2; exit 1; }
        SUDO=sudo
    fi
    echo "test-aarch64: installing $PKGS"
    dpkg --print-foreign-architectures | grep -qx arm64 || $SUDO dpkg --add-architecture arm64
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends $PKGS
    have_all || { echo "test-aarch64: the packages are still missing after apt-get install" >&2; exit 1; }
fi

unset QEMU_LD_PREFIX
export CT_TEST_REDUCED=1

echo "test-aarch64: cross-building into $BUILD"
cmake -S . -B "$BUILD" -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=Release >/dev/null
# Everything compiles (-Werror); the subset's executables are what runs.
cmake --build "$BUILD" -j"$JOBS" >/dev/null
t_built=$(date +%s)
echo "test-aarch64: built in $((t_built - t_start)) s"

fail=0
summary=""
for cpu in $CPUS; do
    t0=$(date +%s)
    # ctest runs each test through CMAKE_CROSSCOMPILING_EMULATOR (qemu-aarch64); QEMU_CPU
    # picks the CPU model.
    if QEMU_CPU="$cpu" ctest --test-dir "$BUILD" -R "$SUBSET" -j"$JOBS" --timeout 600 \
        --output-on-failure >"$BUILD/qemu-$cpu.log" 2>&1; then
        verdict=PASS
    else
        verdict=FAIL
        fail=1
        tail -n 60 "$BUILD/qemu-$cpu.log"
    fi
    n=$(grep -Eo '[0-9]+ tests? failed out of [0-9]+' "$BUILD/qemu-$cpu.log" || true)
    isa=$(QEMU_CPU="$cpu" qemu-aarch64 "$BUILD/ctorch" version 2>&1 | tail -n 1)
    line="$(printf '%-40s %s  %4d s  %s  [%s]' "-cpu $cpu" "$verdict" "$(($(date +%s) - t0))" "$n" "$isa")"
    echo "test-aarch64: $line"
    summary+="$line"$'\n'
done
echo "test-aarch64: summary (subset ${SUBSET}; log per CPU in $BUILD/qemu-*.log)"
printf '%s' "$summary"
echo "test-aarch64: total $(($(date +%s) - t_start)) s"
exit $fail
