#!/usr/bin/env bash
# Chaos test: kill or stop a random rank of a multi-rank training run at a
# random moment, TRIALS times (default 20), and check what a user relies on:
#   tests/chaos/run.sh [TRIALS] [FDTRAIN]        (make chaos TRIALS=N)
#
# Each trial runs a tiny model under `mpirun -n 2` or `-n 3` (random) with a
# checkpoint every 5 steps and dist.timeout_s=5, then, at a random moment
# (startup, a step, a checkpoint write, the end), sends SIGKILL (2 in 3
# trials) or SIGSTOP to a random rank. Checked:
#   - the job ends with a non-zero status within 60 s (SIGSTOP: the peers'
#     communicator timeout ends it, or the MPI_Init/MPI_Finalize watchdog of
#     lib/dist/init.cc, or, for a rank stopped once it reached finalize with
#     no live peer left to notice, its exit guard); no rank process (or guard)
#     is left behind;
#   - no checkpoint is lost: `latest`, if any, passes `fdtrain ckpt inspect`
#     (every checksum), and is no older than the last step the job logged
#     allows (saves behind the step, checkpoint.async, the default: the
#     checkpoint of step c is committed before the next save, of step c + 5, is
#     staged, so before step c + 2 * every + 1 starts; CHAOS_SYNC=1 runs synchronous saves,
#     where it is complete before step c + 1 starts); each trial says whether a save
#     was in flight when the fault came (a .step_N.tmp directory was left);
#   - `--resume auto --overwrite` (a requeue script's command) then completes
#     from that checkpoint (or from scratch if there was none) with the final weights (summary.json weights_sha256) of
#     an uninterrupted run at the same world size: training is deterministic.
# Prints one line per trial and a summary (trials, failures, hangs, lost
# checkpoints, worst time to exit); exits 1 if any trial failed.
set -u
TRIALS=${1:-20}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
FDTRAIN_BIN=${2:-${FDTRAIN:-$ROOT/build/bin/fdtrain}}
[ -x "$FDTRAIN_BIN" ] || { echo "chaos: no fdtrain binary at $FDTRAIN_BIN (make build, or pass it)"; exit 2; }
source "$ROOT/tests/cli/common.bash" "$FDTRAIN_BIN"  # FDTRAIN, TMP (removed at exit), write_recipe
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd "$ROOT"
SEED=${CHAOS_SEED:-$RANDOM}
RANDOM=$SEED
# CHAOS_EVERY=1: a save after every step, so that most moments fall inside a save in flight.
EVERY=${CHAOS_EVERY:-5}
R=$TMP/r.yaml
write_recipe "$R"
sed -i "s/^steps: 3/steps: 150/; s/^  n_layer: 1/  n_layer: 2/; s/^  d_model: 16/  d_model: 64/" "$R"
ASYNC=true
[ -n "${CHAOS_SYNC:-}" ] && ASYNC=false
ARGS=(train "$R" checkpoint.every=$EVERY checkpoint.keep_last=2 checkpoint.async=$ASYNC dist.timeout_s=5 --no-progress)
sha() { sed -n 's/^  "weights_sha256": "\([0-9a-f]*\)",*$/\1/p' "$1/summary.json" 2>/dev/null; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

# Reference runs, uninterrupted, one per world size; their duration bounds the fault time.
declare -A REF DUR
for n in 2 3; do
  t0=$(now)
  mpirun --oversubscribe --bind-to none -n $n "$FDTRAIN" "${ARGS[@]}" --run-dir "$TMP/ref$n" \
    > "$TMP/ref$n.log" 2>&1 || { echo "chaos: the reference run at -n $n failed"; tail -5 "$TMP/ref$n.log"; exit 1; }
  REF[$n]=$(sha "$TMP/ref$n")
  DUR[$n]=$(secs "$t0" "$(now)")
  echo "reference -n $n: ${DUR[$n]} s, weights ${REF[$n]:0:16}"
done
echo "seed $SEED (CHAOS_SEED=$SEED reproduces the fault schedule)"

# The rank processes of the job whose mpirun is $1: "pid rank" lines.
rank_pids() {
  local p
  for p in $(pgrep -P "$1" 2>/dev/null); do
    local r
    r=$(tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
    [ -n "$r" ] && echo "$p $r"
  done
}

FAILED=0 HANGS=0 LOST=0 INFLIGHT=0 MISSED=0 WORST=0 WORST_KILL=0 WORST_STOP=0
trial=0
while [ $trial -lt "$TRIALS" ]; do
  n=$((2 + RANDOM % 2))
  victim=$((RANDOM % n))
  if [ $((RANDOM % 3)) -eq 2 ]; then sig=STOP; else sig=KILL; fi
  # A moment between 0.2 s and the reference run's duration, in ms.
  span_ms=$(awk -v d="${DUR[$n]}" 'BEGIN { printf "%d", d * 1000 - 200 }')
  delay_ms=$((200 + ((RANDOM << 15) | RANDOM) % span_ms))
  d=$TMP/t$trial
  rm -rf "$d"
  mpirun --oversubscribe --bind-to none -n $n "$FDTRAIN" "${ARGS[@]}" --run-dir "$d" > "$d.log" 2>&1 &
  mpid=$!
  start=$(now)
  sleep "$(awk -v m=$delay_ms 'BEGIN { printf "%.3f", m / 1000 }')"
  pid=$(rank_pids $mpid | awk -v r=$victim '$2 == r { print $1 }')
  if [ -z "$pid" ] || ! kill -$sig "$pid" 2>/dev/null; then
    # The ranks were not up yet or had already finished: not a trial.
    wait $mpid 2>/dev/null
    MISSED=$((MISSED + 1))
    [ $MISSED -gt $((TRIALS * 3)) ] && { echo "chaos: too many missed trials"; exit 1; }
    continue
  fi
  hit=$(now)
  # Wait up to 90 s for the job to end; past that it is a hang.
  rc=""
  for _ in $(seq 900); do
    if ! kill -0 $mpid 2>/dev/null; then wait $mpid; rc=$?; break; fi
    sleep 0.1
  done
  took=$(secs "$hit" "$(now)")
  problems=()
  if [ -z "$rc" ]; then
    HANGS=$((HANGS + 1))
    if grep -q '"exit_reason": "completed"' "$d/summary.json" 2>/dev/null; then
      # Every rank had finished: the stopped rank's exit guard should have ended it.
      problems+=("hang: still running after 90 s, after the run completed (the exit guard did not end the stopped rank)")
    else
      problems+=("hang: still running after 90 s")
    fi
    kill -KILL $mpid 2>/dev/null; wait $mpid 2>/dev/null
  elif [ "$rc" -eq 0 ]; then
    problems+=("the job exited 0 after its rank $victim got SIG$sig")
  elif awk -v t="$took" 'BEGIN { exit !(t > 60) }'; then
    problems+=("took ${took} s to exit (> 60 s)")
  fi
  if [ -n "$rc" ]; then  # hangs are counted apart
    WORST=$(awk -v a="$WORST" -v b="$took" 'BEGIN { print (b > a) ? b : a }')
    if [ $sig = KILL ]; then WORST_KILL=$(awk -v a="$WORST_KILL" -v b="$took" 'BEGIN { print (b > a) ? b : a }')
    else WORST_STOP=$(awk -v a="$WORST_STOP" -v b="$took" 'BEGIN { print (b > a) ? b : a }'); fi
  fi
  # Nothing may be left behind (a stopped rank included).
  left=$(pgrep -f -- "--run-dir $d" 2>/dev/null | tr '\n' ' ')
  if [ -n "$left" ]; then
    problems+=("processes left behind: $left")
    for p in $left; do kill -CONT "$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; done
  fi

  # Checkpoints: latest is complete and as new as the logged steps require.
  last_step=$(grep -o '"step": *[0-9]*' "$d/metrics.jsonl" 2>/dev/null | tail -1 | grep -o '[0-9]*$')
  last_step=${last_step:-0}
  latest=$(cat "$d/checkpoints/latest" 2>/dev/null)
  inflight=""
  compgen -G "$d/checkpoints/.step_*.tmp" > /dev/null && { inflight=", a save in flight"; INFLIGHT=$((INFLIGHT + 1)); }
  latest_step=0
  [ -n "$latest" ] && latest_step=$((10#${latest#step_}))
  need=$(( last_step > EVERY ? (last_step - 1) / EVERY * EVERY : 0 ))
  [ $ASYNC = true ] && need=$(( need > EVERY ? need - EVERY : 0 ))
  lost=0
  if [ -n "$latest" ] && ! "$FDTRAIN" ckpt inspect "$d" > "$d.inspect" 2>&1; then
    lost=1; problems+=("latest ($latest) fails ckpt inspect: $(tail -1 "$d.inspect")")
  fi
  if [ "$latest_step" -lt "$need" ]; then
    lost=1; problems+=("latest is '${latest:-none}' but step $last_step was logged (step_$need expected)")
  fi
  LOST=$((LOST + lost))

  # Resume to the end: same weights as the uninterrupted run.
  timeout 180 mpirun --oversubscribe --bind-to none -n $n "$FDTRAIN" "${ARGS[@]}" --run-dir "$d" \
    --resume auto --overwrite > "$d.resume.log" 2>&1
  rc2=$?
  if [ $rc2 -ne 0 ]; then
    problems+=("--resume auto exited $rc2: $(grep -m1 'error' "$d.resume.log")")
  else
    # A job killed after it completed (its summary written, a rank still finalizing) is
    # finished: the resume says so and changes nothing.
    # It starts from `latest`, or from a newer checkpoint that was complete (renamed into place
    # before `latest` was rewritten: the resume takes the newest that verifies).
    from=$(grep -o 'resuming from [^ ]*step_[0-9]*' "$d.resume.log" | grep -o '[0-9]*$' | head -1)
    if [ -n "$latest" ] && { [ -z "$from" ] || [ $((10#$from)) -lt "$latest_step" ]; } \
       && ! { grep -q "the run is finished" "$d.resume.log" && grep -q '"status": "completed"' "$d/summary.json"; }; then
      problems+=("the resume did not start from $latest (nor a newer complete checkpoint): '${from:-none}'")
    fi
    [ "$(sha "$d")" = "${REF[$n]}" ] || problems+=("final weights $(sha "$d" | cut -c1-16) differ from the reference ${REF[$n]:0:16}")
  fi

  trial=$((trial + 1))
  line=$(printf 'trial %2d: -n %d, SIG%-4s rank %d at %5.1f s: exit %s after %4s s; latest %-13s (step %d logged%s); resumed %s' \
    $trial $n $sig $victim "$(awk -v m=$delay_ms 'BEGIN { print m / 1000 }')" "${rc:-hang}" "$took" \
    "${latest:-none}" "$last_step" "$inflight" "$([ $rc2 -eq 0 ] && echo ok || echo FAILED)")
  if [ ${#problems[@]} -eq 0 ]; then
    echo "ok: $line"
  else
    FAILED=$((FAILED + 1))
    echo "FAIL: $line"
    for p in "${problems[@]}"; do echo "    $p"; done
    tail -3 "$d.log" | sed 's/^/    job: /'
    [ -n "${CHAOS_KEEP:-}" ] && cp -r "$d" "$d.log" "$d.resume.log" "$CHAOS_KEEP/" 2>/dev/null
  fi
  rm -rf "$d"
done

echo "chaos: $TRIALS trials (seed $SEED, checkpoint.every=$EVERY, async $ASYNC; $INFLIGHT with a save in flight)," \
  "$FAILED failed, $HANGS hangs, $LOST lost checkpoints," \
  "worst time to exit (hangs apart) ${WORST} s (SIGKILL ${WORST_KILL} s, SIGSTOP ${WORST_STOP} s)," \
  "$MISSED missed faults not counted"
[ $FAILED -eq 0 ]
