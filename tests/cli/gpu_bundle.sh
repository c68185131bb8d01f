#!/usr/bin/env bash
# make gpu-bundle's folder starts on this GPU-less machine with no library
# path set (rpaths), its device check stops at once and cleanly, saying that
# no GPU test ran (a check that ran nothing must not pass), and the bundle
# stays within 60 MiB. gpu_bundle.sh refuses a -march=native build (the
# bundle must run on another CPU); this test packs the test build anyway
# (GPU_BUNDLE_ALLOW_NATIVE=1), since it checks the packing. Skipped for a
# build without the CUDA backend.
source "$(dirname "$0")/common.bash"
BUILD=$(dirname "$(dirname "$FDTRAIN")")
ROOT=$(pwd)
if ! grep -qaF libcublasLt.so "$FDTRAIN"; then  # gpu_bundle.sh's test: the cuBLASLt it loads
  echo "skipped: this fdtrain has no CUDA backend"; finish; exit 0
fi

# A native build is refused unless asked for, with the reason and the way out.
if grep -q "^FDTRAIN_MARCH:STRING=$" "$BUILD/CMakeCache.txt" && grep -q "^FDTRAIN_NATIVE:BOOL=ON" "$BUILD/CMakeCache.txt"; then
  if out=$("$ROOT/scripts/gpu_bundle.sh" "$BUILD" "$TMP/refused" 2>&1) || [[ $out != *"-march=native"*"make gpu-bundle"* ]]; then
    echo "FAIL: a native build was packed, or refused without the reason: $out"; FAILURES=$((FAILURES + 1))
  else
    echo "ok: a -march=native build is refused: $out"
  fi
fi
export GPU_BUNDLE_ALLOW_NATIVE=1
if ! out=$("$ROOT/scripts/gpu_bundle.sh" "$BUILD" "$TMP/bundle" 2>&1); then
  echo "FAIL: gpu_bundle.sh: $out"; FAILURES=$((FAILURES + 1)); finish
fi
echo "$out"

# The binaries travel compressed: nothing runs before device_check.sh unpacks them.
for f in bin/fdtrain.xz bin/gpu_tests.xz bin/probe_fastmath_reciprocal.xz lib/libopenblas.so.0.xz; do
  [[ -f "$TMP/bundle/$f" ]] || { echo "FAIL: the bundle lacks $f"; FAILURES=$((FAILURES + 1)); }
done

# The device check without a GPU: the libraries are found, the op tests all skip (the reason
# given), and it stops there, failing, within seconds, with the table so far.
start=$(date +%s)
(cd "$TMP/bundle" && env -i PATH=/usr/bin:/bin bash ./device_check.sh "$TMP/out") > "$TMP/dc.log" 2>&1
rc=$?
secs=$(( $(date +%s) - start ))
cat "$TMP/dc.log" | head -30
if [[ $rc -ne 1 ]]; then echo "FAIL: device_check exited $rc, expected 1"; FAILURES=$((FAILURES + 1)); fi
if (( secs > 60 )); then echo "FAIL: device_check took ${secs}s to fail without a GPU"; FAILURES=$((FAILURES + 1)); fi
for pattern in "libcublasLt.so.13: /" "libnccl.so.2: /" "stopping: no GPU op test ran .*no usable GPU" \
               "^\| 0. preflight \| passed" "^\| 1. op parity \| FAILED \| no GPU op test ran" \
               "device_check: FAILED in [0-9]+ s"; do
  if ! grep -Eq "$pattern" "$TMP/dc.log"; then
    echo "FAIL: device_check output lacks /$pattern/"; FAILURES=$((FAILURES + 1))
  fi
done
if grep -Eq "== 2\.|train_m" "$TMP/dc.log"; then
  echo "FAIL: device_check went on to train without a GPU"; FAILURES=$((FAILURES + 1))
fi
# Starts from the bundle with an empty environment: every library resolves.
if ! env -i PATH=/usr/bin:/bin OPENBLAS_CORETYPE=Haswell "$TMP/bundle/bin/fdtrain" --version; then
  echo "FAIL: the bundled fdtrain does not start"; FAILURES=$((FAILURES + 1))
fi
missing=$(env -i PATH=/usr/bin:/bin ldd "$TMP/bundle/bin/fdtrain" | grep "not found" || true)
if [[ -n "$missing" ]]; then
  echo "FAIL: unresolved libraries: $missing"; FAILURES=$((FAILURES + 1))
fi

grep -q "^cpu_baseline -march=" "$TMP/bundle/BUILD_INFO" || { echo "FAIL: no BUILD_INFO"; FAILURES=$((FAILURES + 1)); }

# The op tests ran (from the bundle, the CUDA libraries found by the check): every GPU test
# skips, saying why, but those of the libraries loaded on first use, which need no GPU:
# BlasLibrary (cuBLASLt) and NcclLibrary (NCCL; its death test too).
listed=$(env -i PATH=/usr/bin:/bin "$TMP/bundle/bin/gpu_tests" --gtest_list_tests)
n_gpu_tests=$(grep -v DISABLED_ <<<"$listed" | grep -c '^  ')
n_no_gpu=$(awk '/^[^ ]/ { suite = $1 } /^  / && suite ~ /^(BlasLibrary|NcclLibrary)/ { ++n } END { print n + 0 }' <<<"$listed")
if [[ $n_gpu_tests -lt 17 || $n_no_gpu -lt 3 ]]; then
  echo "FAIL: gpu_tests lists $n_gpu_tests tests, $n_no_gpu of them without a GPU"; FAILURES=$((FAILURES + 1))
fi
for pattern in "SKIPPED \] $((n_gpu_tests - n_no_gpu)) tests" "PASSED  \] $n_no_gpu tests" "no usable GPU"; do
  if ! grep -q "$pattern" "$TMP/out/parity.txt"; then
    echo "FAIL: parity.txt lacks /$pattern/"; FAILURES=$((FAILURES + 1))
  fi
done
[[ $rc -eq 1 && $secs -le 60 ]] && echo "ok: device_check stops in ${secs}s without a GPU, exit 1"
if grep -Eq "terminate called|Segmentation|core dumped" "$TMP/dc.log"; then
  echo "FAIL: raw crash output"; FAILURES=$((FAILURES + 1))
fi
finish
