#!/usr/bin/env bash
# Crash safety and control of checkpoints under mpirun -n 2:
#   - a rank SIGKILLed at each point of writing the step-10 checkpoint leaves
#     `latest` at step 5; --resume auto continues from step 5 and ends with the
#     weights of an uninterrupted run (saves behind the step, the default, at
#     every point; synchronous saves at two of them);
#   - SIGUSR1 to mpirun saves a checkpoint at the next step boundary, exits 0,
#     and --resume auto completes the run bitwise;
#   - resuming from a damaged checkpoint (missing shard, truncated shard,
#     flipped bytes) fails with exit 2 naming the file, and leaves the run
#     directory as it was.
source "$(dirname "$0")/common.bash"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
R=$TMP/r.yaml
write_recipe "$R"
sed -i 's/^steps: 3/steps: 15/; s/^  n_layer: 1/  n_layer: 2/; s/^  d_model: 16/  d_model: 64/' "$R"
MPI=(timeout 300 mpirun --oversubscribe --bind-to none -n 2 "$FDTRAIN" train "$R" checkpoint.every=5 --no-progress)
sha() { sed -n 's/^  "weights_sha256": "\([0-9a-f]*\)",*$/\1/p' "$1/summary.json"; }

"${MPI[@]}" --run-dir "$TMP/straight" > "$TMP/straight.log" 2>&1 || { echo "FAIL: straight run"; exit 1; }
ref=$(sha "$TMP/straight")

for trial in 1:0:true 1:1:true 2:0:true 2:1:true 3:0:true 4:0:true 2:1:false 4:0:false; do
  IFS=: read -r point rank async <<<"$trial"  # points 3 and 4 are rank 0's
  {
    d="$TMP/crash_p${point}_r${rank}_$async"
    FDTRAIN_FAULT=ckptkill:rank=$rank:step=10:point=$point "${MPI[@]}" checkpoint.async=$async --run-dir "$d" > "$d.log" 2>&1
    rc=$?
    latest=$(cat "$d/checkpoints/latest" 2>/dev/null)
    "${MPI[@]}" --run-dir "$d" --resume auto > "$d.resume.log" 2>&1; rc2=$?
    if [ $rc -ne 0 ] && [ "$latest" = "step_00000005" ] && [ $rc2 -eq 0 ] \
       && grep -q "resuming from .*step_00000005" "$d.resume.log" && [ "$(sha "$d")" = "$ref" ]; then
      echo "ok: killed rank $rank at point $point (async $async): exit $rc, latest $latest, resumed from step 5 to the same weights"
    else
      echo "FAIL: point $point rank $rank (async $async): exit $rc, latest '$latest', resume exit $rc2, weights $(sha "$d") vs $ref"
      tail -3 "$d.resume.log" | sed 's/^/    /'; FAILURES=$((FAILURES+1))
    fi
  }
done

# SIGUSR1: save at the next step boundary and exit 0; then resume. The job is long
# (2000 steps) so that it is still running when the signal comes; the resumed run and
# the uninterrupted one it must match both end 5 steps after the stop (the learning
# rate is constant: `steps` changes nothing else), not at step 2000.
sed -i 's/^steps: 15/steps: 2000/' "$R"
# mpirun itself gets the signal (it forwards SIGUSR1 to every rank).
mpirun --oversubscribe --bind-to none -n 2 "$FDTRAIN" train "$R" checkpoint.every=0 --no-progress \
  --run-dir "$TMP/sig" > "$TMP/sig.log" 2>&1 &
pid=$!
for _ in $(seq 600); do grep -q '"step":20,' "$TMP/sig/metrics.jsonl" 2>/dev/null && break; sleep 0.1; done
kill -USR1 $pid
wait $pid; rc=$?
stopped=$(sed -n 's/^  "steps": \([0-9]*\),*$/\1/p' "$TMP/sig/summary.json")
end=$(( ${stopped:-0} + 5 ))
"${MPI[@]}" steps=$end checkpoint.every=0 --run-dir "$TMP/sig" --resume auto > "$TMP/sig.resume.log" 2>&1; rc2=$?
"${MPI[@]}" steps=$end checkpoint.every=0 --run-dir "$TMP/ref" > /dev/null 2>&1
if [ $rc -eq 0 ] && [ -n "$stopped" ] && [ "$stopped" -lt 2000 ] && [ $rc2 -eq 0 ] \
   && [ "$(sed -n 's/^  "steps": \([0-9]*\),*$/\1/p' "$TMP/sig/summary.json")" = "$end" ] \
   && [ -n "$(sha "$TMP/ref")" ] && [ "$(sha "$TMP/sig")" = "$(sha "$TMP/ref")" ]; then
  echo "ok: SIGUSR1 stopped the job at step $stopped with exit 0 and a checkpoint; resumed to step $end, the weights of an uninterrupted run"
else
  echo "FAIL: SIGUSR1: exit $rc at step '$stopped', resume exit $rc2, weights $(sha "$TMP/sig") vs $(sha "$TMP/ref")"
  tail -3 "$TMP/sig.log" | sed 's/^/    /'; FAILURES=$((FAILURES+1))
fi

# Damaged checkpoints: exit 2, the file named, nothing in the run directory changed.
sed -i 's/^steps: 2000/steps: 15/' "$R"
damage() {  # damage NAME COMMAND-ON-DIR
  local d="$TMP/bad_$1"
  cp -r "$TMP/straight" "$d"
  local step="$d/checkpoints/step_00000010"
  eval "$2"
  local before after out rc
  before=$(cd "$d" && find . -type f -not -path './checkpoints/*' ! -name .lock -exec md5sum {} + | sort)
  out=$("${MPI[@]}" --run-dir "$d" --resume "$step" 2>&1); rc=$?
  after=$(cd "$d" && find . -type f -not -path './checkpoints/*' ! -name .lock -exec md5sum {} + | sort)
  if [ $rc -eq 2 ] && grep -q "$3" <<<"$out" && [ "$before" = "$after" ]; then
    echo "ok: $1: exit 2, /$3/, run directory unchanged"
  else
    echo "FAIL: $1: exit $rc"; echo "$out" | tail -5 | sed 's/^/    /'; FAILURES=$((FAILURES+1))
  fi
}
damage missing_shard 'rm "$step/rank_00001.h5"' "rank_00001.h5"
damage truncated 'truncate -s 3000 "$step/rank_00000.h5"' "rank_00000.h5"
damage flipped 'size=$(stat -c %s "$step/rank_00001.h5"); printf "\xff\xff\xff\xff\xff\xff\xff\xff" | dd of="$step/rank_00001.h5" bs=1 seek=$((size * 7 / 10)) conv=notrunc status=none' "rank_00001.h5"
finish
