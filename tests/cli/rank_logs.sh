#!/usr/bin/env bash
# Under mpirun -n 2 every rank writes RUN/logs/rank<r>.log; the terminal shows
# rank 0's log only, plus any rank's errors with the rank named. A rank that
# fails writes its error to its own log before the job ends.
source "$(dirname "$0")/common.bash"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
R=$TMP/r.yaml
write_recipe "$R"
check() { if eval "$2"; then echo "ok: $1"; else echo "FAIL: $1"; FAILURES=$((FAILURES+1)); fi; }

out=$(timeout 120 mpirun --oversubscribe --bind-to none -n 2 "$FDTRAIN" train "$R" \
      --run-dir "$TMP/run" --no-progress 2>&1) || { echo "FAIL: run"; echo "$out"; exit 1; }
L=$TMP/run/logs
check "one log per rank" '[ -s "$L/rank0.log" ] && [ -s "$L/rank1.log" ] && [ "$(ls "$L" | wc -l)" -eq 2 ]'
check "rank 0 log has the steps and the end" 'grep -q "step 3/3 | loss" "$L/rank0.log" && grep -q "done: 3 steps" "$L/rank0.log"'
check "rank 0 log has the setup lines logged before it opened" 'grep -q "fdtrain: model: GPT-2" "$L/rank0.log"'
check "rank 1 log names its rank and host" 'grep -q "rank 1 of 2 on host" "$L/rank1.log"'
check "rank 1 log has its own memory account" 'grep -q "fdtrain\[rank 1\]: rank 1: 3 steps; peak memory .*params" "$L/rank1.log"'
check "log lines are time-stamped" 'grep -Eq "^20[0-9]{2}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z fdtrain" "$L/rank1.log"'
check "the terminal shows rank 0's log" 'grep -q "step 3/3 | loss" <<<"$out"'
check "the terminal shows nothing of rank 1 when all is well" '! grep -q "rank 1" <<<"$out"'

# Rank 1 fails at its third step: its error is on the terminal with its rank, and in its log.
out=$(FDTRAIN_FAULT=throw:rank=1:step=2 timeout 120 mpirun --oversubscribe --bind-to none -n 2 \
      "$FDTRAIN" train "$R" --run-dir "$TMP/fail" --no-progress 2>&1); rc=$?
check "a failing rank ends the job (exit $rc)" '[ $rc -ne 0 ]'
check "the terminal names rank 1 and its error" 'grep -q "rank 1 .*injected fault" <<<"$out"'
check "rank 1's log has its error" 'grep -q "fdtrain\[rank 1\]: error: rank 1 failed at step 3: .*injected fault" "$TMP/fail/logs/rank1.log"'
[ "$FAILURES" -eq 0 ] || echo "$out" | sed 's/^/    /'

# One rank alone: its failure is in its log too.
FDTRAIN_FAULT=throw:rank=0:step=1 "$FDTRAIN" train "$R" --run-dir "$TMP/fail1" --no-progress > /dev/null 2>&1
check "world 1: the error is in rank0.log" 'grep -q "fdtrain: error: .*injected fault" "$TMP/fail1/logs/rank0.log"'
finish
