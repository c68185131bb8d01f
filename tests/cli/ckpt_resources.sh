#!/usr/bin/env bash
# Resource faults while saving checkpoints: the checkpoints directory on a
# full file system, and on a read-only one. Either way the run fails with
# exit 1 and one message saying what failed, where and what to do (no HDF5
# error stack, no crash), `latest` still names the previous checkpoint, and
# that checkpoint passes `fdtrain ckpt inspect` (every checksum).
# Needs root to mount a small tmpfs; skips with a message where mount is not
# permitted.
source "$(dirname "$0")/common.bash"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MOUNTS=()
cleanup() {
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do umount "${MOUNTS[$i]}" 2>/dev/null; done
  rm -rf "$TMP"
}
trap cleanup EXIT
if ! mkdir -p "$TMP/probe" || ! mount -t tmpfs -o size=64k tmpfs "$TMP/probe" 2>/dev/null; then
  echo "skip: cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN); the resource-fault tests did not run"
  exit 0
fi
umount "$TMP/probe"
R=$TMP/r.yaml
write_recipe "$R"
# A checkpoint of this model is about 1.5 MB.
sed -i 's/^steps: 3/steps: 10/; s/^  n_layer: 1/  n_layer: 2/; s/^  d_model: 16/  d_model: 64/' "$R"

# check_failed NAME RUN LOG RC PATTERN: exit 1, the message, no library noise, step 5 intact.
check_failed() {
  local name=$1 run=$2 log=$3 rc=$4 pattern=$5 ok=1
  if [ "$rc" -ne 1 ]; then echo "FAIL: $name: exit $rc, expected 1"; ok=0; fi
  if ! grep -Eq -- "$pattern" "$log"; then echo "FAIL: $name: no line matches /$pattern/"; ok=0; fi
  if grep -Eq "HDF5-DIAG|#[0-9]{3}: |H5[A-Z][a-z_]*\(\)|terminate called|Segmentation|core dumped|what\(\)" "$log"; then
    echo "FAIL: $name: raw library or crash output"; ok=0
  fi
  local latest
  latest=$(cat "$run/checkpoints/latest" 2>/dev/null)
  if [ "$latest" != step_00000005 ]; then echo "FAIL: $name: latest is '$latest', expected step_00000005"; ok=0; fi
  if ! "$FDTRAIN" ckpt inspect "$run" > "$log.inspect" 2>&1; then
    echo "FAIL: $name: ckpt inspect of the previous checkpoint failed"; sed 's/^/    /' "$log.inspect" | tail -3; ok=0
  fi
  if [ $ok -eq 1 ]; then
    echo "ok: $name: exit 1, /$pattern/, latest still step_00000005 and it inspects clean"
  else
    sed 's/^/    /' "$log" | tail -5; FAILURES=$((FAILURES + 1))
  fi
}

# 1. Full disk: room for one checkpoint (step 5), not for a second (step 10).
for n in 1 2; do
  run=$TMP/full$n
  mkdir -p "$run/checkpoints"
  mount -t tmpfs -o size=2m tmpfs "$run/checkpoints" && MOUNTS+=("$run/checkpoints")
  mpirun --oversubscribe --bind-to none -n $n "$FDTRAIN" train "$R" checkpoint.every=5 --run-dir "$run" \
    --no-progress > "$run.log" 2>&1
  check_failed "full disk, $n rank(s)" "$run" "$run.log" $? \
    "cannot write checkpoint shard .*rank_0000[01]\.h5: .*the disk is full .*free space or move the run directory to a larger disk, then resume"
done

# 2. Read-only checkpoints directory: step 5 saved, then the directory becomes
#    read-only (a read-only bind mount: root ignores permission bits) and the
#    run resumes and trains on until its next save.
run=$TMP/ro
mkdir -p "$run/checkpoints" "$TMP/ro_fs"
mount -t tmpfs -o size=8m tmpfs "$TMP/ro_fs" && MOUNTS+=("$TMP/ro_fs")
mount --bind "$TMP/ro_fs" "$run/checkpoints" && MOUNTS+=("$run/checkpoints")
"$FDTRAIN" train "$R" steps=5 checkpoint.every=5 --run-dir "$run" --no-progress > "$run.first.log" 2>&1 \
  || { echo "FAIL: read-only: the first run failed"; tail -3 "$run.first.log"; FAILURES=$((FAILURES + 1)); }
mount -o remount,ro,bind "$run/checkpoints"
"$FDTRAIN" train "$R" checkpoint.every=5 --run-dir "$run" --resume auto --no-progress > "$run.log" 2>&1
check_failed "read-only checkpoints directory" "$run" "$run.log" $? \
  "cannot save the checkpoint of step 10: cannot create .*: Read-only file system; make .*checkpoints writable"
finish
