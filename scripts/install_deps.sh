#!/usr/bin/env bash
# Installs fdtrain's build, test and demo dependencies from Debian packages.
# Idempotent: packages already installed are skipped, and apt is not touched
# at all when everything is present. Nothing is downloaded from elsewhere.
set -euo pipefail

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
  fortunes fortunes-min
  python3
  patchelf xz-utils  # make gpu-bundle: rpaths, compressed OpenBLAS
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

missing=()
for p in "${PACKAGES[@]}"; do
  if [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) != *"install ok installed"* ]]; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install_deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install_deps: done"
