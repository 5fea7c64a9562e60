#!/usr/bin/env bash
# Install what ctorch needs from Debian's packages (only what is missing), as root or via sudo.
set -euo pipefail
PKGS=(build-essential cmake pkg-config libopenblas-dev libjansson-dev libssl-dev
      python3 python3-numpy python3-torch python3-pytest
      clang libclang-rt-14-dev mpich libmpich-dev)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# node + npm fetch and run the tokenizer tests' oracle (scripts/fetch_test_deps.sh); a node that
# came from elsewhere (it bundles npm) is kept as it is
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
fi
