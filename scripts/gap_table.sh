#!/usr/bin/env bash
# The gap table: ctorch vs PyTorch 2.13 on this machine. Runs `ctorch bench gemm | lce | flex |
# train` at 1 and 2 threads (CT_NUM_THREADS=T; the PyTorch baselines get the same count from the
# CLI) and `ctorch bench fsdp` once (one thread per rank whatever T is), each with --json, keeps
# the JSON in the output folder and prints a markdown table: medians, ctorch / PyTorch ratios,
# tracked peak and peak RSS, the CPU model and the thread count. Run it on a quiet machine.
#
#   bash scripts/gap_table.sh [--out DIR (default $TMPDIR/ctorch-gap-table-DATE)] [--threads "1 2"] [--tiny]
#   bash scripts/gap_table.sh --report DIR [--threads "1 2"]   (the table of a finished run)
#
# Environment: CTORCH_CLI (default build/ctorch; build it first), CTORCH_PYTHON (default
# .venv/bin/python, scripts/setup.sh --python). --tiny runs tiny shapes (a check that the script
# works end to end, figures meaningless). The default sizes are meant to take about 15 minutes on
# 2 cores, torch.compile included (its first compile of each graph is most of the PyTorch side's
# time; Inductor's cache makes the second thread count's compiles cheaper).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CLI=${CTORCH_CLI:-$ROOT/build/ctorch}
PY=${CTORCH_PYTHON:-$ROOT/.venv/bin/python}
OUT=""
THREADS="1 2"
TINY=0
REPORT=0
while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT=$2; shift 2 ;;
        --threads) THREADS=$2; shift 2 ;;
        --tiny) TINY=1; shift ;;
        --report) OUT=$2; REPORT=1; shift 2 ;;
        -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "gap_table.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[ -x "$CLI" ] || { echo "gap_table.sh: $CLI is not built (cmake --build build, or set CTORCH_CLI)" >&2; exit 1; }
[ -x "$PY" ] || { echo "gap_table.sh: $PY is missing (bash scripts/setup.sh --python, or set CTORCH_PYTHON)" >&2; exit 1; }
export CTORCH_PYTHON=$PY
[ -n "$OUT" ] || OUT=${TMPDIR:-/tmp}/ctorch-gap-table-$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$OUT"

if [ "$TINY" = 1 ]; then
    GEMM=(--m 64 --n 64 --k 64)
    LCE=(--n 64 --d 32 --v 512)
    FLEX=(--seq 256 --heads 2 --window 16 --cases flex-sliding,flex-causal --backward)
    TRAIN=(--batch 1 --seq 32 --window 8 --layers 1 --d-model 32 --heads 2 --kv-heads 1 --ffn 48 --vocab 256)
    FSDP=(--layers 1 --d-model 64 --batch 2 --seq 8 --steps 2)
else
    GEMM=(--m 2048 --n 2048 --k 2048)
    LCE=(--n 1024 --d 512 --v 32768)
    FLEX=(--seq 4096 --heads 8 --window 64 --cases flex-sliding,flex-causal --backward)
    TRAIN=(--seq 256)
    FSDP=(--layers 4 --d-model 256 --batch 4 --seq 32 --steps 3)
fi

run() { # name threads args...: one bench, its JSON in $OUT/name-tT.json
    local name=$1 t=$2
    shift 2
    local f="$OUT/$name-t$t.json" t0=$SECONDS
    printf 'gap_table: %-6s %s thread(s) ... ' "$name" "$t" >&2
    if CT_NUM_THREADS=$t "$CLI" bench "$name" "$@" --repeats 3 --json >"$f.tmp" 2>"$OUT/$name-t$t.err"; then
        mv "$f.tmp" "$f"
        echo "$((SECONDS - t0)) s" >&2
    else
        echo "failed after $((SECONDS - t0)) s (see $OUT/$name-t$t.err)" >&2
        rm -f "$f.tmp"
    fi
}

if [ "$REPORT" = 0 ]; then
    START=$SECONDS
    uptime >"$OUT/load-before.txt" 2>/dev/null || true
    for t in $THREADS; do
        run gemm "$t" "${GEMM[@]}"
        run lce "$t" "${LCE[@]}"
        run flex "$t" "${FLEX[@]}"
        run train "$t" "${TRAIN[@]}"
    done
    run fsdp 1 "${FSDP[@]}"
    uptime >"$OUT/load-after.txt" 2>/dev/null || true
    echo "gap_table: all benches in $((SECONDS - START)) s; JSON in $OUT" >&2
fi

"$PY" - "$OUT" "$THREADS" "$("$CLI" version 2>/dev/null | head -1)" <<'EOF'
import glob
import json
import os
import sys

out, threads, version = sys.argv[1], sys.argv[2].split(), sys.argv[3]


def load(name, t):
    p = os.path.join(out, f"{name}-t{t}.json")
    return json.load(open(p)) if os.path.exists(p) else None


def g(o, *keys):
    for k in keys:
        if not isinstance(o, dict) or k not in o:
            return None
        o = o[k]
    return o


def f(x, fmt="%.3g"):
    return "-" if x is None else fmt % x


def mib(x):
    return "-" if x is None else "%.1f MiB" % (x / 1048576.0)


def ratio(a, b):
    return None if a is None or b is None or not b else a / b


cpu = "unknown"
try:
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
except OSError:
    pass
tv = None
for p in sorted(glob.glob(os.path.join(out, "*.json"))):
    s = json.dumps(json.load(open(p)))
    i = s.find('"torch_version": "')
    if i >= 0:
        tv = s[i + 18:s.index('"', i + 18)]
        break
loadavg = " / ".join(open(os.path.join(out, n)).read().strip().split("load average:")[-1].strip()
                     for n in ("load-before.txt", "load-after.txt") if os.path.exists(os.path.join(out, n)))
print("## ctorch vs PyTorch %s\n" % (tv or "(no baseline ran)"))
print("- CPU: %s, %d online CPUs; %s" % (cpu, os.cpu_count() or 0, version))
print("- load average before / after: %s" % (loadavg or "unknown"))
print("- medians of 3 repeats after a warm-up; ratio = PyTorch time / ctorch time (> 1: ctorch faster);"
      " tracked peak: ctorch's allocator, PyTorch's CPU allocator as torch.profiler reports it (inputs and"
      " state added); peak RSS: one case per process\n")
print("| bench | threads | ctorch | PyTorch 2.13 | ratio | ctorch tracked / RSS | PyTorch tracked / RSS |")
print("|---|---|---|---|---|---|---|")
for t in threads:
    j = load("gemm", t)
    if j:
        row = j["shapes"][0]
        for dt in ("f32", "bf16"):
            c = max(g(row, "openblas_" + dt, "gflops") or 0, g(row, "ctorch_" + dt, "gflops") or 0)
            p = g(j, "torch_f32", dt, "gflops")
            print("| gemm %s %dx%dx%d (GFLOP/s, best of OpenBLAS / ctorch) | %s | %s | %s | %s | - | - |" % (
                dt, row["m"], row["n"], row["k"], g(j, "torch_f32", "threads") or t, f(c, "%.1f"), f(p, "%.1f"),
                f(ratio(c, p), "%.2f")))
    j = load("lce", t)
    if j:
        fu = j["fused"]
        sh = j["shape"]
        for mode, label in (("chunked", "F.linear_cross_entropy + LinearCrossEntropyOptions()"),
                            ("reference", "F.linear_cross_entropy, options=None"),
                            ("unfused", "F.linear + F.cross_entropy"),
                            ("unfused-compiled", "torch.compile(F.linear + F.cross_entropy)")):
            p = g(j, "torch", mode)
            if p is None:
                continue
            if p.get("status") != "ok":
                print("| lce N=%d D=%d V=%d fwd+bwd vs %s | %s | %s s | %s | - | - | - |" % (
                    sh["n"], sh["d"], sh["v"], label, t, f(g(fu, "time", "median_s")), p.get("status")))
                continue
            res = p.get("resolved")
            if isinstance(res, dict):
                label += " (%s, %s: %d chunks)" % (res["acc_policy"], res["chunking_method"], res["chunks"])
            print("| lce N=%d D=%d V=%d fwd+bwd vs %s | %s | %s s | %s s | %s | %s / %s | %s / %s |" % (
                sh["n"], sh["d"], sh["v"], label, p.get("threads", t), f(g(fu, "time", "median_s")),
                f(p.get("median_s")), f(ratio(p.get("median_s"), g(fu, "time", "median_s")), "%.2f"),
                mib(fu.get("peak_tracked_bytes")), mib(fu.get("peak_rss_bytes")), mib(p.get("peak_tracked_bytes")),
                mib(p.get("peak_rss_bytes"))))
    j = load("flex", t)
    if j:
        sh = j["shape"]
        for case, label in (("flex-sliding", "sliding window %d" % sh["window"]), ("flex-causal", "causal")):
            c, p = j.get(case), g(j, "torch", case)
            if c is None or p is None:
                continue
            what = "flex %s B=%d H=%d L=%d E=%d fwd vs %s(flex_attention)" % (
                label, sh["batch"], sh["heads"], sh["seq"], sh["head_dim"],
                "torch.compile" if p.get("mode") == "compiled" else p.get("mode", "?"))
            if p.get("status") != "ok":
                print("| %s | %s | %s s | %s | - | - | - |" % (what, t, f(g(c, "fwd", "median_s")), p.get("status")))
                continue
            print("| %s | %s | %s s | %s s | %s | %s / %s | %s / %s |" % (
                what, p.get("threads", t), f(g(c, "fwd", "median_s")), f(g(p, "fwd", "median_s")),
                f(ratio(g(p, "fwd", "median_s"), g(c, "fwd", "median_s")), "%.2f"),
                mib(c.get("peak_tracked_bytes")), mib(c.get("peak_rss_bytes")), mib(p.get("peak_tracked_bytes")),
                mib(p.get("peak_rss_bytes"))))
            print("| flex %s backward | %s | %s s | %s | - | - | - |" % (
                label, t, f(g(c, "bwd", "median_s")), g(p, "backward", "status") if g(p, "backward", "status") != "ok"
                else f(g(p, "backward", "fwd_bwd", "median_s")) + " s (fwd+bwd)"))
    j = load("train", t)
    if j:
        c = j["fused_flex"]
        sh = j["shape"]
        for key in ("pytorch_eager", "pytorch_compiled"):
            p = j.get(key)
            if p is None:
                continue
            what = "train step B=%d T=%d V=%d %d layers d %d, tokens/s: fused+flex vs SDPA %s" % (
                sh["batch"], sh["seq"], sh["vocab"], sh["layers"], sh["d_model"], key.split("_")[1])
            if p.get("status") != "ok":
                print("| %s | %s | %s | %s | - | - | - |" % (what, t, f(c.get("tokens_per_s"), "%.0f"), p.get("status")))
                continue
            print("| %s (%s) | %s | %s | %s | %s | %s / %s | %s / %s |" % (
                what, p.get("attention"), p.get("threads", t), f(c.get("tokens_per_s"), "%.0f"),
                f(p.get("tokens_per_s"), "%.0f"), f(ratio(c.get("tokens_per_s"), p.get("tokens_per_s")), "%.2f"),
                mib(c.get("peak_tracked_bytes")), mib(c.get("peak_rss_bytes")), mib(p.get("peak_tracked_bytes")),
                mib(p.get("peak_rss_bytes"))))
j = load("fsdp", "1")
if j:
    cases = {c["name"]: c for c in j["cases"]}
    m = j["model"]
    tj = j.get("torch") or {}
    for mine, theirs, label in (("single", "single", "one process"), ("fsdp", "fsdp2", "FSDP N=2 vs FSDP2 fully_shard"),
                                ("fsdp", "ddp", "FSDP N=2 vs DDP"), ("dp", "ddp", "DP N=2 vs DDP")):
        c, p = cases.get(mine), tj.get(theirs)
        if c is None or p is None:
            continue
        what = "fsdp %d layers d %d, batch %dx%d, tokens/s, %s (gloo)" % (
            m["layers"], m["d_model"], m["batch"], m["seq"], label)
        if p.get("status") != "ok":
            print("| %s | 1/rank | %s | %s | - | - | - |" % (what, f(c.get("tokens_per_s"), "%.0f"), p.get("status")))
            continue
        peaks = c.get("peak_tracked_bytes_per_rank") or [None]
        print("| %s | 1/rank | %s | %s | %s | %s / - | - / %s |" % (
            what, f(c.get("tokens_per_s"), "%.0f"), f(p.get("tokens_per_s"), "%.0f"),
            f(ratio(c.get("tokens_per_s"), p.get("tokens_per_s")), "%.2f"), mib(max(x or 0 for x in peaks)),
            mib(p.get("peak_rss_bytes"))))
print("\nRatios: gemm and train/fsdp rows are ctorch / PyTorch rates; lce and flex rows PyTorch / ctorch"
      " times (> 1 means ctorch is faster everywhere).")
EOF
