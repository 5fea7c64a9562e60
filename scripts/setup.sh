#!/usr/bin/env bash
# Install what ctorch needs: Debian's packages for the build (only what is missing, as root or
# via sudo) and, with --python, the test and benchmark stack in a virtual environment at
# .venv/ (ignored by git, reused when present): PyTorch 2.13.0's CPU build and the Hugging
# Face libraries, pinned in scripts/requirements-test.txt. The main job (scripts/run.sh)
# needs none of the Python stack and calls this without --python.
# Usage: bash scripts/setup.sh [--python]
set -euo pipefail
cd "$(dirname "$0")/.."
PKGS=(build-essential cmake pkg-config libopenblas-dev libjansson-dev libssl-dev
      clang libclang-rt-14-dev mpich libmpich-dev)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
WANT_PY=0
[ "${1:-}" = "--python" ] && WANT_PY=1
# A python3 with the venv module: the one on PATH when it has it, else Debian's.
pick_python() {
  for c in python3 /usr/bin/python3; do
    command -v "$c" >/dev/null 2>&1 && "$c" -c 'import venv, ensurepip' 2>/dev/null && { command -v "$c"; return; }
  done
}
if [ $WANT_PY = 1 ] && [ -z "$(pick_python)" ] && [ ! -x .venv/bin/python ]; then
  missing+=(python3 python3-venv python3-dev)
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
fi
[ $WANT_PY = 1 ] || exit 0

REQ=scripts/requirements-test.txt
STAMP=.venv/.ctorch-requirements
if [ -x .venv/bin/python ] && [ -f "$STAMP" ] && cmp -s "$REQ" "$STAMP"; then
  exit 0
fi
if [ ! -x .venv/bin/python ]; then
  PYBASE=$(pick_python)
  echo "== creating .venv with $PYBASE ($("$PYBASE" --version 2>&1))"
  "$PYBASE" -m venv .venv
fi
echo "== installing the Python test stack into .venv ($REQ)"
t0=$(date +%s)
# torch first, alone and pinned to the CPU build: a later package that names torch then finds
# it satisfied instead of pulling a CUDA build.
# pip, quiet; the lines it prints about configured package folders that do not exist go
pipq() {
  .venv/bin/python -m pip install -q "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
  return "${PIPESTATUS[0]}"
}
pipq --upgrade pip
pipq "$(grep -E '^torch==' "$REQ")"
pipq -r "$REQ"
.venv/bin/python - <<'PY'
import torch, sys
if torch.version.cuda is not None or not torch.__version__.startswith("2.13.0"):
    sys.exit(f"setup.sh: .venv has torch {torch.__version__} (cuda {torch.version.cuda}); want 2.13.0, CPU")
PY
cp "$REQ" "$STAMP"
echo "== .venv ready in $(( $(date +%s) - t0 )) s: $(.venv/bin/python -c 'import torch, transformers, tokenizers, safetensors, peft, numpy; print("torch", torch.__version__, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__, "safetensors", safetensors.__version__, "peft", peft.__version__, "numpy", numpy.__version__)')"
