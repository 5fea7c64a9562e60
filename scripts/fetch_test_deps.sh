#!/usr/bin/env bash
# Fetch the real tokenizer vocabularies that the tokenizer tests (and `ctorch bench tokenizer`)
# use and that PyPI packages ship, with the test stack's pip (.venv, scripts/setup.sh --python),
# and turn them into the files ctorch reads (scripts/make_tokenizer_fixtures.py), into
# build/test-deps (never committed):
#   openai-whisper  whisper/assets/gpt2.tiktoken          GPT-2's 50256 ranks
#   llama-models    llama_models/llama3/tokenizer.model   Llama 3's 128000 ranks
#   dashscope       dashscope/resources/qwen.tiktoken     Qwen's 151643 ranks (Qwen2's vocabulary)
# Each archive is pinned by version and sha256. Idempotent: a finished set is left alone.
# Fails loudly when it cannot.
# Usage: bash scripts/fetch_test_deps.sh [DEST (default build/test-deps)]
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-build/test-deps}
PY=${CTORCH_PYTHON:-$PWD/.venv/bin/python}
STAMP="$DEST/fixtures-v1.done"
[ -f "$STAMP" ] && exit 0
[ -x "$PY" ] || { echo "fetch_test_deps.sh: no $PY: run bash scripts/setup.sh --python first (makes .venv)" >&2; exit 1; }

# package==version  archive  sha256  member
PKGS=(
  "openai-whisper==20250625 openai_whisper-20250625.tar.gz 37a91a3921809d9f44748ffc73c0a55c9f366c85a3ef5c2ae0cc09540432eb96 openai_whisper-20250625/whisper/assets/gpt2.tiktoken"
  "llama-models==0.3.0 llama_models-0.3.0-py3-none-any.whl 7f77f78ff13fca09f70d76a376aff6414cd901623fb9d57e69c2f8367a73032f llama_models/llama3/tokenizer.model"
  "dashscope==2.0.2 dashscope-2.0.2-py3-none-any.whl 0602d1800f7433bdb7953560986eaf5146454ed3988636c0a91963ba24e74258 dashscope/resources/qwen.tiktoken"
)
mkdir -p "$DEST/pkgs" "$DEST/ranks"
RANKS=()
for entry in "${PKGS[@]}"; do
  read -r spec archive sha member <<<"$entry"
  a="$DEST/pkgs/$archive"
  if [ ! -f "$a" ] || ! echo "$sha  $a" | sha256sum -c --quiet - >/dev/null 2>&1; then
    rm -f "$a"
    # an sdist's metadata is prepared with the venv's setuptools, else in an isolated build env
    if ! "$PY" -m pip download --no-deps --no-build-isolation --disable-pip-version-check -q "$spec" -d "$DEST/pkgs" \
        >"$DEST/pip.log" 2>&1 &&
       ! "$PY" -m pip download --no-deps --disable-pip-version-check -q "$spec" -d "$DEST/pkgs" \
        >>"$DEST/pip.log" 2>&1; then
      echo "fetch_test_deps.sh: 'pip download $spec' failed; the tokenizer tests need it:" >&2
      tail -20 "$DEST/pip.log" >&2
      exit 1
    fi
    [ -f "$a" ] || { echo "fetch_test_deps.sh: pip download $spec did not give $archive:" >&2; ls "$DEST/pkgs" >&2; exit 1; }
    echo "$sha  $a" | sha256sum -c --quiet - || {
      echo "fetch_test_deps.sh: $archive does not have the pinned sha256 $sha" >&2; exit 1; }
  fi
  out="$DEST/ranks/$(echo "$spec" | cut -d= -f1).ranks"
  "$PY" - "$a" "$member" "$out" <<'EOF'
import sys, tarfile, zipfile
archive, member, out = sys.argv[1:]
if archive.endswith(".whl"):
    data = zipfile.ZipFile(archive).read(member)
else:
    with tarfile.open(archive) as t:
        data = t.extractfile(member).read()
open(out, "wb").write(data)
EOF
  RANKS+=("$out")
done
"$PY" scripts/make_tokenizer_fixtures.py "${RANKS[@]}" "$DEST"
for f in gpt2/encoder.json gpt2/vocab.bpe gpt2-hf/tokenizer.json llama3/tokenizer.json qwen2/tokenizer.json; do
  [ -s "$DEST/$f" ] || { echo "fetch_test_deps.sh: $DEST/$f was not made" >&2; exit 1; }
done
touch "$STAMP"
echo "fetched GPT-2, Llama 3 and Qwen2 vocabularies into $DEST"
