#!/usr/bin/env bash
# Saves behind the step (checkpoint.async, issue 41) under mpirun -n 2:
#   - an asynchronous run's checkpoints resume to the weights of a synchronous run's, from the
#     same step (bitwise); the summary says how the saves went;
#   - a save still in flight when the next begins: the loop waits and says so (log, summary);
#   - SIGUSR1 while a save is in flight: the stop waits for it, saves its own and exits 0;
#   - a rank whose shard fails to write: the job ends (exit 1, status failed, the message), the
#     previous checkpoint stays `latest` and verifies, nothing partial is visible;
#   - the disk full under the state's direct writes (FDTRAIN_IO_FAULT): the same, the message
#     naming the shard;
#   - a rank that fails just after a save was staged: the save is committed before the job ends;
#   - checkpoint.async: true with ZeRO-Infinity's NVMe optimizer is refused; left unset it
#     resolves to false.
source "$(dirname "$0")/common.bash"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
R=$TMP/r.yaml
write_recipe "$R"
sed -i 's/^steps: 3/steps: 15/; s/^  n_layer: 1/  n_layer: 2/; s/^  d_model: 16/  d_model: 64/' "$R"
MPI=(timeout 300 mpirun --oversubscribe --bind-to none -n 2 "$FDTRAIN" train "$R" checkpoint.every=5 --no-progress)
sha() { sed -n 's/^  "weights_sha256": "\([0-9a-f]*\)",*$/\1/p' "$1/summary.json"; }
# json RUN EXPR: a value of RUN/summary.json (python expression over s).
json() { python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1/summary.json" "$2" 2>/dev/null; }
fail() { echo "FAIL: $*"; FAILURES=$((FAILURES + 1)); }

"${MPI[@]}" checkpoint.async=false --run-dir "$TMP/sync" > "$TMP/sync.log" 2>&1 || { echo "FAIL: sync run"; tail -5 "$TMP/sync.log"; exit 1; }
"${MPI[@]}" --run-dir "$TMP/async" > "$TMP/async.log" 2>&1 || { echo "FAIL: async run"; tail -5 "$TMP/async.log"; exit 1; }
ref=$(sha "$TMP/sync")
if [ "$(sha "$TMP/async")" = "$ref" ] && [ "$(json "$TMP/async" 's["checkpoints"]["async"]')" = True ] \
   && [ "$(json "$TMP/async" 's["checkpoints"]["saved"]')" = 3 ] \
   && [ "$(json "$TMP/sync" 's["checkpoints"]["async"]')" = False ] \
   && [ "$(json "$TMP/async" 's["memory"]["checkpoint"] > 0')" = True ] \
   && [ "$(json "$TMP/sync" 's["memory"].get("checkpoint", 0)')" = 0 ] \
   && grep -q "written behind the step" "$TMP/async.log" \
   && [ "$(cat "$TMP/async/checkpoints/latest")" = step_00000015 ]; then
  echo "ok: asynchronous saves: the same training, 3 checkpoints committed, staging counted in memory"
else
  fail "async run: weights $(sha "$TMP/async") vs $ref, summary checkpoints $(json "$TMP/async" 's["checkpoints"]')"
fi

# Both runs' step-10 checkpoints resume to the same weights (the state saved is the same).
for mode in sync async; do
  "${MPI[@]}" --run-dir "$TMP/$mode.r" --resume "$TMP/$mode/checkpoints/step_00000010" \
    > "$TMP/$mode.r.log" 2>&1 || fail "resume of the $mode run: $(tail -2 "$TMP/$mode.r.log")"
done
if [ -n "$ref" ] && [ "$(sha "$TMP/sync.r")" = "$ref" ] && [ "$(sha "$TMP/async.r")" = "$ref" ] \
   && [ "$(json "$TMP/async.r" 's["start_step"]')" = 10 ]; then
  echo "ok: the asynchronous and the synchronous step-10 checkpoints resume to the same weights"
else
  fail "resume from step 10: sync $(sha "$TMP/sync.r"), async $(sha "$TMP/async.r"), straight $ref"
fi

# A slow disk on rank 1 for the step-5 save: the step-10 save waits for it, and says so.
d=$TMP/slow
FDTRAIN_FAULT=ckptslow:rank=1:step=5:ms=4000 "${MPI[@]}" --run-dir "$d" > "$d.log" 2>&1; rc=$?
if [ $rc -eq 0 ] && grep -q "waited .* for the save of step 5 to finish" "$d.log" \
   && [ "$(json "$d" 's["checkpoints"]["waited_s"] > 0.5')" = True ] && [ "$(sha "$d")" = "$ref" ]; then
  echo "ok: a save still in flight: the next one waited ($(json "$d" 's["checkpoints"]["waited_s"]') s) and said so"
else
  fail "slow save: exit $rc, waited_s $(json "$d" 's["checkpoints"]["waited_s"]')"; tail -3 "$d.log" | sed 's/^/    /'
fi

# SIGUSR1 while the step-5 save is still being written: both end up committed, exit 0.
d=$TMP/stop
sed 's/^steps: 15/steps: 2000/' "$R" > "$TMP/long.yaml"
# (mpirun itself gets the signal: `timeout` would not forward it.)
FDTRAIN_FAULT=ckptslow:rank=0:step=5:ms=3000 mpirun --oversubscribe --bind-to none -n 2 \
  "$FDTRAIN" train "$TMP/long.yaml" checkpoint.every=5 --no-progress --run-dir "$d" > "$d.log" 2>&1 &
pid=$!
for _ in $(seq 600); do grep -q '"step":7,' "$d/metrics.jsonl" 2>/dev/null && break; sleep 0.05; done
kill -USR1 $pid
wait $pid; rc=$?
stopped=$(json "$d" 's["steps"]')
if [ $rc -eq 0 ] && [ "$(json "$d" 's["status"]')" = interrupted ] && [ -n "$stopped" ] \
   && [ "$(cat "$d/checkpoints/latest")" = "$(printf 'step_%08d' "$stopped")" ] \
   && [ -d "$d/checkpoints/step_00000005" ] && "$FDTRAIN" ckpt inspect "$d" > /dev/null 2>&1; then
  echo "ok: SIGUSR1 during a save in flight: it finished, the stop's own save (step $stopped) followed, exit 0"
else
  fail "stop during a save: exit $rc, steps $stopped, latest $(cat "$d/checkpoints/latest" 2>/dev/null)"; tail -3 "$d.log" | sed 's/^/    /'
fi

# Rank 1 cannot write its shard of step 10: the job fails; step 5 stays latest and verifies.
d=$TMP/fail
FDTRAIN_FAULT=ckptfail:rank=1:step=10 "${MPI[@]}" --run-dir "$d" > "$d.log" 2>&1; rc=$?
if [ $rc -ne 0 ] && [ "$(json "$d" 's["status"]')" = failed ] && grep -q "injected I/O failure" "$d.log" \
   && [ "$(cat "$d/checkpoints/latest")" = step_00000005 ] && [ ! -e "$d/checkpoints/step_00000010" ] \
   && "$FDTRAIN" ckpt inspect "$d" > /dev/null 2>&1 \
   && ! grep -Eq "terminate called|what\(\)|Segmentation|core dumped|HDF5-DIAG" "$d.log"; then
  echo "ok: a shard that fails to write ends the job (exit $rc, status failed); step 5 stays latest and verifies"
else
  fail "failed shard: exit $rc, status $(json "$d" 's["status"]'), latest $(cat "$d/checkpoints/latest" 2>/dev/null)"
  tail -4 "$d.log" | sed 's/^/    /'; ls -a "$d/checkpoints" | sed 's/^/    /'
fi
"${MPI[@]}" --run-dir "$d" --resume auto > "$d.resume.log" 2>&1; rc=$?
if [ $rc -eq 0 ] && grep -q "resuming from .*step_00000005" "$d.resume.log" && [ "$(sha "$d")" = "$ref" ]; then
  echo "ok: --resume auto continued from step 5 to the weights of the straight run"
else
  fail "resume after the failed save: exit $rc"; tail -3 "$d.resume.log" | sed 's/^/    /'
fi

# The disk refuses the state's bytes in the middle of a save (FDTRAIN_IO_FAULT: the writes past
# HDF5, O_DIRECT, fail with ENOSPC once a shard's size is written, a shard's state being most of
# it): the job fails naming the shard and the full disk; the save before stays latest and
# verifies, nothing partial is visible.
d=$TMP/enospc
shard=$(json "$TMP/async" 's["checkpoints"]["shard_bytes"]')
FDTRAIN_IO_FAULT=enospc:after=$shard "${MPI[@]}" --run-dir "$d" > "$d.log" 2>&1; rc=$?
at=$(sed -n 's/.*cannot write checkpoint shard .*\/\.step_0*\([0-9]*\)\.tmp\/rank_.*/\1/p' "$d.log" | head -1)
before=$(printf 'step_%08d' $((${at:-0} - 5)))
if [ -n "$shard" ] && [ $rc -eq 1 ] && [ "$(json "$d" 's["status"]')" = failed ] && [ -n "$at" ] \
   && grep -q "cannot write checkpoint shard .*/rank_0000[01].h5: writing its state failed: the disk is full .*free space or move the run directory to a larger disk, then resume" "$d.log" \
   && [ "$(cat "$d/checkpoints/latest")" = "$before" ] && ! ls -A "$d/checkpoints" | grep -q "^\." \
   && [ ! -e "$d/checkpoints/$(printf 'step_%08d' "$at")" ] \
   && "$FDTRAIN" ckpt inspect "$d" > /dev/null 2>&1 \
   && ! grep -Eq "terminate called|what\(\)|Segmentation|core dumped|HDF5-DIAG" "$d.log"; then
  echo "ok: a full disk under the state's direct writes ends the job at the save of step $at (exit 1, status failed); $before stays latest and verifies"
else
  fail "ENOSPC in the direct writes: exit $rc, status $(json "$d" 's["status"]'), latest $(cat "$d/checkpoints/latest" 2>/dev/null)"
  grep -v "^--\|^$" "$d.log" | tail -4 | sed 's/^/    /'; ls -a "$d/checkpoints" | sed 's/^/    /'
fi

# A rank fails right after a save was staged (the step after it): the save is committed before
# the job ends, as a synchronous one would have been, and the resume starts from it.
for rank in 0 1; do
  d=$TMP/throw$rank
  FDTRAIN_FAULT=throw:rank=$rank:step=10 "${MPI[@]}" --run-dir "$d" > "$d.log" 2>&1; rc=$?
  if [ $rc -ne 0 ] && [ "$(cat "$d/checkpoints/latest" 2>/dev/null)" = step_00000010 ] \
     && "$FDTRAIN" ckpt inspect "$d" > /dev/null 2>&1 && grep -q "injected fault" "$d.log"; then
    echo "ok: rank $rank failed just after the step-10 save was staged: it was committed first (exit $rc)"
  else
    fail "failure after a staged save (rank $rank): exit $rc, latest $(cat "$d/checkpoints/latest" 2>/dev/null)"
    tail -3 "$d.log" | sed 's/^/    /'
  fi
done

# ZeRO-Infinity's NVMe optimizer state cannot be staged in memory.
N=$TMP/nvme.yaml
write_recipe "$N"
mkdir -p "$TMP/nvme"
printf 'zero:\n  stage: 2\n  offload_optimizer:\n    device: nvme\n    path: %s\ncheckpoint:\n  every: 2\n' "$TMP/nvme" >> "$N"
expect_fail 2 "checkpoint.async.*nvme.*set checkpoint.async: false" validate "$N" checkpoint.async=true
if "$FDTRAIN" validate "$N" > /dev/null 2>&1 && "$FDTRAIN" train "$N" --run-dir "$TMP/nvme_run" --no-progress > "$TMP/nvme.log" 2>&1 \
   && grep -q "async: false" "$TMP/nvme_run/config.yaml"; then
  echo "ok: with the NVMe optimizer checkpoint.async resolves to false (config.yaml says so) and saves synchronously"
else
  fail "nvme run"; tail -3 "$TMP/nvme.log" | sed 's/^/    /'
fi
finish
