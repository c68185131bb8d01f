#!/usr/bin/env bash
# make gpu-bundle's folder starts on this GPU-less machine with no library
# path set (rpaths), its device check runs end to end and reports cleanly that
# no GPU is usable, and the bundle stays within 60 MiB. Skipped for a build
# without the CUDA backend.
source "$(dirname "$0")/common.bash"
BUILD=$(dirname "$(dirname "$FDTRAIN")")
ROOT=$(pwd)
if [[ $(ldd "$FDTRAIN") != *libcudart* ]]; then
  echo "skipped: this fdtrain has no CUDA backend"; finish; exit 0
fi

if ! out=$("$ROOT/scripts/gpu_bundle.sh" "$BUILD" "$TMP/bundle" 2>&1); then
  echo "FAIL: gpu_bundle.sh: $out"; FAILURES=$((FAILURES + 1)); finish
fi
echo "$out"

# Starts from the bundle with an empty environment: every library resolves.
if ! env -i PATH=/usr/bin:/bin OPENBLAS_CORETYPE=Haswell "$TMP/bundle/bin/fdtrain" --version; then
  echo "FAIL: the bundled fdtrain does not start"; FAILURES=$((FAILURES + 1))
fi
missing=$(env -i PATH=/usr/bin:/bin ldd "$TMP/bundle/bin/fdtrain" | grep "not found" || true)
if [[ -n "$missing" ]]; then
  echo "FAIL: unresolved libraries: $missing"; FAILURES=$((FAILURES + 1))
fi

# The device check: op tests skip with the reason, training refuses cleanly, exit 1.
(cd "$TMP/bundle" && env -i PATH=/usr/bin:/bin bash ./device_check.sh "$TMP/out") > "$TMP/dc.log" 2>&1
rc=$?
cat "$TMP/dc.log" | grep -v "SKIPPED \]  *Dtypes\|^\[  SKIPPED \] [A-Z]" | head -20
if [[ $rc -ne 1 ]]; then echo "FAIL: device_check exited $rc, expected 1"; FAILURES=$((FAILURES + 1)); fi
# Every GPU test skips (the bundle's own list of them) but one: BlasLibrary loads cuBLASLt
# (found through device_check.sh's library search), which needs no GPU.
n_gpu_tests=$(env -i PATH=/usr/bin:/bin "$TMP/bundle/bin/gpu_tests" --gtest_list_tests | grep -c '^  ')
if [[ $n_gpu_tests -lt 17 ]]; then echo "FAIL: gpu_tests lists $n_gpu_tests tests"; FAILURES=$((FAILURES + 1)); fi
for pattern in "SKIPPED \] $((n_gpu_tests - 1)) tests" "PASSED  \] 1 test" "device: cuda requested, but no GPU is usable" "device_check: FAILED"; do
  if ! grep -q "$pattern" "$TMP/dc.log"; then
    echo "FAIL: device_check output lacks /$pattern/"; FAILURES=$((FAILURES + 1))
  fi
done
if grep -Eq "terminate called|Segmentation|core dumped" "$TMP/dc.log"; then
  echo "FAIL: raw crash output"; FAILURES=$((FAILURES + 1))
fi
finish
