#!/usr/bin/env bash
# gpu_bundle.sh BUILD_DIR OUT_DIR: a folder that runs fdtrain's GPU device
# check on a machine with only the NVIDIA driver and CUDA runtime libraries
# (no Debian packages, no network): `make gpu-bundle` calls it.
#
#   OUT/bin/     fdtrain, gpu_tests, probe_fastmath_reciprocal (rpath $ORIGIN/../lib; as .xz,
#                see below)
#   OUT/lib/     every shared library they need except the CUDA ones
#                (yaml-cpp, HDF5, fmt, OpenBLAS, Open MPI, libstdc++, ...), each
#                with rpath $ORIGIN; plus libcudart (small, and the version we
#                compiled against) for probe_fastmath_reciprocal (fdtrain and gpu_tests
#                link the CUDA runtime statically)
#   OUT/glibc/   this machine's C library and loader, used only when the
#                target's glibc is older than the one we built against
#   OUT/recipes, OUT/configs, OUT/data: what the device check trains on
#   OUT/device_check.sh (tests/gpu/device_check.sh)
#   OUT/BUILD_INFO: the commit, the CPU baseline (-march) and CUDA architectures
#
# The build must target a portable CPU baseline (make gpu-bundle configures
# build-gpu-bundle with FDTRAIN_MARCH=x86-64-v3): a -march=native binary may
# die of SIGILL on the GPU host's CPU. GPU_BUNDLE_ALLOW_NATIVE=1 packs a native
# build anyway (tests/cli/gpu_bundle.sh, which checks only the packing).
# OpenBLAS and the binaries are stored xz-compressed (lib/libopenblas.so.0.xz, 37 MiB
# -> ~9 MiB; bin/*.xz) to fit the 60 MiB budget; device_check.sh unpacks them (xz, or
# Python's lzma).
#
# Not bundled (too large, and part of any CUDA installation): libcublasLt
# (~540 MB) and libnccl (~220 MB), which fdtrain dlopen()s on first use;
# device_check.sh finds them on the target (ldconfig, /usr/local/cuda, or the
# nvidia-* Python wheels) and puts their folders on LD_LIBRARY_PATH.
set -euo pipefail

BUILD=${1:?usage: gpu_bundle.sh BUILD_DIR OUT_DIR}
OUT=${2:?usage: gpu_bundle.sh BUILD_DIR OUT_DIR}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
LIMIT_MIB=60

die() { echo "gpu_bundle: $*" >&2; exit 1; }
[[ -x "$BUILD/bin/fdtrain" ]] || die "$BUILD/bin/fdtrain not found: build first (make build)"
[[ -x "$BUILD/tests/gpu_tests" ]] || die "$BUILD/tests/gpu_tests not found: build with the tests"
[[ -x "$BUILD/bin/probe_fastmath_reciprocal" ]] ||
  die "$BUILD/bin/probe_fastmath_reciprocal not found: build it (cmake --build $BUILD --target probe_fastmath_reciprocal)"
# The CUDA backend links no CUDA library (the runtime is static; cuBLASLt and NCCL are
# dlopen()ed on first use): it is known by the name of the cuBLASLt it loads.
grep -qaF libcublasLt.so "$BUILD/bin/fdtrain" ||
  die "$BUILD/bin/fdtrain has no CUDA backend: configure with -DFDTRAIN_CUDA=ON (needs nvcc)"
command -v patchelf >/dev/null || die "patchelf missing: run scripts/install_deps.sh"
cache_value() { sed -nE "s/^$1:[A-Z]+=(.*)$/\1/p" "$BUILD/CMakeCache.txt" 2>/dev/null | head -1; }
march=$(cache_value FDTRAIN_MARCH)
if [[ -z "$march" ]]; then
  [[ $(cache_value FDTRAIN_NATIVE) == OFF ]] && march="(compiler default)" || march=native
fi
if [[ "$march" == native && "${GPU_BUNDLE_ALLOW_NATIVE:-0}" != 1 ]]; then
  die "$BUILD is built for this CPU (-march=native), which may not run on the GPU host's: use make gpu-bundle (a build with FDTRAIN_MARCH=x86-64-v3)"
fi

rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib" "$OUT/glibc" "$OUT/data"
cp "$BUILD/bin/fdtrain" "$BUILD/tests/gpu_tests" "$BUILD/bin/probe_fastmath_reciprocal" "$OUT/bin/"
{
  echo "commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet HEAD 2>/dev/null || echo ' (modified)')"
  echo "cpu_baseline -march=$march"
  echo "cuda_architectures $(cache_value CMAKE_CUDA_ARCHITECTURES)"
  echo "built $(date -u +%Y-%m-%dT%H:%MZ)"
} > "$OUT/BUILD_INFO"

# Libraries the driver or a CUDA installation provides, and glibc's own.
is_cuda_lib() { [[ "$1" =~ ^lib(cuda|cublas|cublasLt|nccl|nvidia-|nvrtc|nvJitLink)[.-] ]]; }
is_glibc_lib() { [[ "$1" =~ ^(libc|libm|libdl|librt|libpthread|libresolv|libutil|ld-linux-x86-64)\.so ]]; }

for bin in "$OUT"/bin/*; do
  ldd "$bin" | awk '/=> \//{print $3} /^\t\/.*ld-linux/{print $1}'
done | sort -u | while read -r path; do
  name=$(basename "$path")
  if [[ "$name" == libcudart.so* ]]; then
    cp -L "$path" "$OUT/lib/$name"
  elif is_cuda_lib "$name"; then
    continue
  elif is_glibc_lib "$name"; then
    cp -L "$path" "$OUT/glibc/$name"
  else
    cp -L "$path" "$OUT/lib/$name"
  fi
done

for bin in "$OUT"/bin/*; do patchelf --force-rpath --set-rpath '$ORIGIN/../lib' "$bin"; done
for lib in "$OUT"/lib/*.so*; do
  chmod u+w "$lib"
  patchelf --force-rpath --set-rpath '$ORIGIN' "$lib"
done
strip --strip-unneeded "$OUT"/bin/* "$OUT"/lib/*.so* 2>/dev/null || true

# OpenBLAS (Debian's, every CPU kernel family: ~37 MiB) and our binaries (fdtrain, gpu_tests:
# sm_80 + sm_90 kernel images: ~40 MiB together) travel xz-compressed;
# device_check.sh unpacks them before the first start.
xz -9 -T0 "$OUT/lib/libopenblas.so.0" "$OUT"/bin/*

cp -r "$ROOT/recipes" "$ROOT/configs" "$OUT/"
mkdir -p "$OUT/bench" && cp -r "$ROOT/bench/recipes" "$OUT/bench/"
cp "$ROOT/tests/gpu/device_check.sh" "$OUT/device_check.sh"
# Training text for the check (the quickstart's corpus, Debian's fortunes).
cat /usr/share/games/fortunes/{fortunes,literature,people,science,computers,wisdom} 2>/dev/null |
  head -c 2000000 > "$OUT/data/fortunes.txt"
[[ -s "$OUT/data/fortunes.txt" ]] || die "no fortunes text found (scripts/install_deps.sh installs it)"

size=$(du -sm "$OUT" | cut -f1)
echo "gpu_bundle: $OUT: $size MiB ($(ls "$OUT/lib" | wc -l) libraries, $(ls "$OUT/glibc" | wc -l) glibc files)"
(( size <= LIMIT_MIB )) || die "the bundle is $size MiB, over the $LIMIT_MIB MiB limit"
