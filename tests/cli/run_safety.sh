#!/usr/bin/env bash
# A run directory never loses data (issue 16): each numbered case is one of
# the ways a shipped binary lost a user's results, reproduced and checked.
#   1. --resume auto with no checkpoint refuses to replace a run (exit 2, the
#      files unchanged); latest.tmp beside a complete step is recovered; a
#      missing or damaged `latest` falls back to the newest checkpoint that
#      verifies, with a warning.
#   3. --resume PATH into a directory holding another run is refused.
#   5. a second job on a directory in use is refused with the holder's pid.
#   6. --resume auto on a finished run says so, exits 0 and changes nothing.
#   8. weights are saved at the end by default (checkpoint.at_end), so
#      `generate RUN` works after a plain run.
#   9. every run ends with a summary.json that says how: SIGTERM and SIGINT
#      save a checkpoint and exit 143 / 130 (status interrupted), a loss above
#      max_loss ends as diverged (exit 1), a failure as failed (exit 1), under
#      mpirun too.
#  10. config.yaml records absolute paths and run.json the working directory:
#      `fdtrain train RUN/config.yaml` works from another directory.
# (2, a resume on a full disk: tests/cli/run_safety_disk.sh.)
source "$(dirname "$0")/common.bash"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
R=$TMP/r.yaml
write_recipe "$R"
sed -i 's/^steps: 3/steps: 7/' "$R"

fail() { echo "FAIL: $*"; FAILURES=$((FAILURES + 1)); }
# Every file of a run directory with its checksum (the lock file aside: it
# names whichever job held it last).
fingerprint() { (cd "$1" && find . -type f ! -name .lock -exec md5sum {} + | sort); }
field() { python3 -c 'import json,sys; v=json.load(open(sys.argv[1])).get(sys.argv[2]); print("null" if v is None else v)' "$1/summary.json" "$2" 2>/dev/null; }
# expect_run CODE ARGS...: fdtrain ARGS exits CODE (output in $OUT).
expect_run() {
  local code=$1; shift
  OUT=$("$FDTRAIN" "$@" 2>&1); local rc=$?
  if [ "$rc" -ne "$code" ]; then
    fail "fdtrain $* exited $rc, expected $code"; echo "$OUT" | tail -5 | sed 's/^/    /'; return 1
  fi
  return 0
}

# --- 1. --resume auto never replaces a run it cannot resume ---
A=$TMP/a
expect_run 0 train "$R" checkpoint.at_end=false --run-dir "$A" --no-progress
before=$(fingerprint "$A")
expect_fail 2 "--resume auto: the run directory holds a finished run \(completed after 7 of 7 steps\) but no checkpoint to resume from; nothing was changed. Pass --overwrite .* or choose a new --run-dir" \
  train "$R" steps=3 --run-dir "$A" --resume auto
[ "$before" = "$(fingerprint "$A")" ] || fail "1: a refused --resume auto changed the run directory"
[ "$(field "$A" steps)" = 7 ] || fail "1: summary.json no longer says 7 steps"
# --resume auto into a directory that holds nothing yet starts fresh (a requeued job's first start).
expect_run 0 train "$R" steps=2 --run-dir "$TMP/new" --resume auto --no-progress \
  && grep -q "no checkpoint in .*; starting fresh" <<<"$OUT" && echo "ok: 1: --resume auto into an empty directory starts fresh"

# latest.tmp beside a complete step (a save killed before its last rename) is recovered.
B=$TMP/b
expect_run 0 train "$R" steps=10 checkpoint.every=5 checkpoint.keep_last=3 --run-dir "$B" --no-progress
rm "$B/checkpoints/latest"
echo step_00000010 > "$B/checkpoints/latest.tmp"
mkdir "$B/checkpoints/.step_00000015.tmp"  # a partial save
expect_run 0 train "$R" steps=12 checkpoint.every=5 --run-dir "$B" --resume auto --no-progress
if grep -q "latest.tmp names step_00000010, a complete checkpoint newer than .latest.*it is now .latest." <<<"$OUT" \
   && grep -q "resuming from .*step_00000010 (step 10" <<<"$OUT" \
   && grep -q "removed .*\.step_00000015\.tmp" <<<"$OUT" && [ ! -e "$B/checkpoints/.step_00000015.tmp" ] \
   && [ "$(field "$B" steps)" = 12 ] && [ "$(field "$B" start_step)" = 10 ]; then
  echo "ok: 1: latest.tmp recovered, partial save removed, resumed from step 10"
else
  fail "1: latest.tmp recovery"; echo "$OUT" | tail -8 | sed 's/^/    /'
fi
# A `latest` naming a damaged checkpoint: the newest one that verifies, with a warning.
expect_run 0 train "$R" steps=20 checkpoint.every=5 checkpoint.keep_last=3 --run-dir "$TMP/c" --no-progress
truncate -s 2000 "$TMP/c/checkpoints/step_00000020/rank_00000.h5"
expect_run 0 train "$R" steps=22 checkpoint.every=5 --run-dir "$TMP/c" --resume auto --no-progress
if grep -q "warning: passing over .*step_00000020: .*rank_00000.h5" <<<"$OUT" \
   && grep -q "resuming from .*step_00000015, the newest checkpoint that verifies" <<<"$OUT" \
   && [ "$(field "$TMP/c" start_step)" = 15 ]; then
  echo "ok: 1: a damaged latest falls back to step 15 with a warning"
else
  fail "1: fallback from a damaged latest"; echo "$OUT" | tail -8 | sed 's/^/    /'
fi

# --- 3. --resume PATH into a directory holding another run ---
before=$(fingerprint "$A")
expect_fail 2 "a.*: the run directory holds a finished run .*, not the run of .*step_00000005; nothing was changed" \
  train "$R" steps=12 --run-dir "$A" --resume "$B/checkpoints/step_00000005"
[ "$before" = "$(fingerprint "$A")" ] || fail "3: the refused resume changed the run directory"
# into a directory of its own it is fine (and metrics start empty there).
expect_run 0 train "$R" steps=12 --run-dir "$TMP/b2" --resume "$B/checkpoints/step_00000005" --no-progress \
  && python3 -c 'import json,sys; s=[json.loads(l)["step"] for l in open(sys.argv[1])]; assert s and min(s) > 5, s' \
       "$TMP/b2/metrics.jsonl" && [ "$(field "$TMP/b2" start_step)" = 5 ] \
  && echo "ok: 3: --resume PATH into a new directory"

# Resuming an older checkpoint in place would mix two histories: refused; with --overwrite the
# later checkpoints go, and `latest` names the resumed step until the next save.
before=$(fingerprint "$B")
expect_fail 2 "b: the run has checkpoints after step 5 \(step_00000012, step_00000010\); resuming from step 5 in place would mix two histories" \
  train "$R" steps=12 checkpoint.every=5 --run-dir "$B" --resume "$B/checkpoints/step_00000005"
[ "$before" = "$(fingerprint "$B")" ] || fail "3: the refused in-place resume changed the run directory"
# (It diverges at once, max_loss=1, exit 1: no new checkpoint, so `latest` must name step 5.)
expect_run 1 train "$R" steps=7 checkpoint.every=5 checkpoint.at_end=false max_loss=1 --run-dir "$B" \
  --resume "$B/checkpoints/step_00000005" --overwrite --no-progress
if [ "$(cat "$B/checkpoints/latest")" = step_00000005 ] && [ ! -e "$B/checkpoints/step_00000010" ] \
   && [ ! -e "$B/checkpoints/step_00000012" ] \
   && grep -q "removed .*step_00000010: the run continues from step 5" "$B/logs/rank0.log"; then
  echo "ok: 3: --overwrite discards the later history; latest names the resumed step"
else
  fail "3: later checkpoints after an in-place resume: latest $(cat "$B/checkpoints/latest"), $(ls "$B/checkpoints")"
fi

# A run directory inside another run's files, or the root: refused before anything is made.
expect_fail 2 "is inside the run directory .*/b, whose files fdtrain manages" \
  train "$R" --run-dir "$B/checkpoints/step_00000005/nested" --resume "$B/checkpoints/step_00000005"
[ ! -e "$B/checkpoints/step_00000005/nested" ] || fail "2: a nested run directory was made"
expect_fail 2 "is inside the run directory" train "$R" --run-dir "$B/logs/x"
expect_fail 2 "--run-dir is the root of the file system" train "$R" --run-dir /
# A directory with a config.yaml of another program is not a run: refused even with --overwrite,
# and a refusal leaves the user's files (notes.tmp included) alone.
mkdir -p "$TMP/project/checkpoints/mine"
echo "name: my project" > "$TMP/project/config.yaml"
echo x > "$TMP/project/notes.tmp"; echo w > "$TMP/project/checkpoints/mine/weights.bin"
before=$(fingerprint "$TMP/project")
expect_fail 2 "holds a config.yaml that fdtrain did not write" train "$R" --run-dir "$TMP/project" --overwrite
expect_fail 2 "holds a config.yaml that fdtrain did not write" train "$R" --run-dir "$TMP/project" --resume auto
[ "$before" = "$(fingerprint "$TMP/project")" ] && echo "ok: a foreign directory is left alone" \
  || fail "a refused run changed a foreign directory"
# --overwrite of a real run removes what fdtrain wrote, not what the user added.
mkdir -p "$TMP/b2/checkpoints/mine"; echo w > "$TMP/b2/checkpoints/mine/weights.bin"
expect_run 0 train "$R" --run-dir "$TMP/b2" --overwrite --no-progress \
  && [ -f "$TMP/b2/checkpoints/mine/weights.bin" ] && [ -d "$TMP/b2/checkpoints/step_00000007" ] \
  && [ ! -e "$TMP/b2/checkpoints/step_00000012" ] && echo "ok: --overwrite keeps the user's own files" \
  || fail "--overwrite and the user's files: $(ls "$TMP/b2/checkpoints")"
# A `latest` that is a directory, and a step directory renamed: refused / passed over.
mkdir -p "$TMP/c2" && cp -r "$TMP/c/." "$TMP/c2/" && rm "$TMP/c2/checkpoints/latest" && mkdir "$TMP/c2/checkpoints/latest"
expect_fail 2 "checkpoints/latest: is not the plain file fdtrain writes" train "$R" steps=30 --run-dir "$TMP/c2" --resume auto
expect_fail 2 "the checkpoint in it is of step 15, but the directory is named step_00000017" \
  train "$R" steps=30 --run-dir "$TMP/c3" --resume "$(mv "$TMP/c2/checkpoints/step_00000015" "$TMP/c2/checkpoints/step_00000017" && echo "$TMP/c2/checkpoints/step_00000017")"

# --- 6. --resume auto on a finished run: exit 0, nothing touched ---
F=$TMP/f
expect_run 0 train "$R" --run-dir "$F" --no-progress
[ -d "$F/checkpoints/step_00000007" ] || fail "8: no checkpoint at the end of a default run"
before=$(fingerprint "$F")
if expect_run 0 train "$R" --run-dir "$F" --resume auto --no-progress; then
  grep -q "the run is finished: its checkpoint .*step_00000007 is at step 7 of steps = 7; nothing to do" <<<"$OUT" \
    || fail "6: no 'finished' message: $OUT"
  [ "$before" = "$(fingerprint "$F")" ] && echo "ok: 6: a finished run is left as it is" || fail "6: files changed"
fi

# Killed after its final save, before its summary: --resume auto trains nothing and writes the
# summary the run never wrote (the last logged loss, the same weights).
cp -r "$F" "$TMP/g" && rm "$TMP/g/summary.json"
if expect_run 0 train "$R" --run-dir "$TMP/g" --resume auto --no-progress; then
  if grep -q "resuming from .*step_00000007" <<<"$OUT" && [ "$(field "$TMP/g" status)" = completed ] \
     && [ "$(field "$TMP/g" final_loss)" = "$(field "$F" final_loss)" ] \
     && [ "$(field "$TMP/g" weights_sha256)" = "$(field "$F" weights_sha256)" ]; then
    echo "ok: 6: a run killed after its last save gets its summary on --resume auto"
  else
    fail "6: no summary for a run killed after its last save: $(field "$TMP/g" status) $(field "$TMP/g" final_loss)"
  fi
fi

# --- 8. weights saved by default: generate works on the run ---
expect_run 0 generate "$F" --prompt "The " --max-tokens 5 && echo "ok: 8: generate on a default run"

# --- 9. how a run ended: SIGTERM, SIGINT, diverged, failed ---
S=$TMP/sig.yaml
write_recipe "$S"
sed -i 's/^steps: 3/steps: 100000/' "$S"
# wait_for_step RUN N: until metrics.jsonl has step N (60 s at most).
wait_for_step() {
  for _ in $(seq 600); do
    grep -q "\"step\":$2[,}]" "$1/metrics.jsonl" 2>/dev/null && return 0; sleep 0.1
  done
  return 1
}
for sig in TERM INT; do
  D=$TMP/sig_$sig
  "$FDTRAIN" train "$S" --run-dir "$D" --no-progress > "$D.log" 2>&1 &
  pid=$!
  wait_for_step "$D" 20 || fail "9: SIG$sig: the run did not reach step 20"
  # --- 5. a second job on the same directory, while the first runs ---
  if [ $sig = TERM ]; then
    before=$(fingerprint "$D")
    expect_fail 2 "sig_TERM: the run directory is in use by another fdtrain job \(pid $pid on host .*\); nothing was changed" \
      train "$S" --run-dir "$D" --resume auto
    expect_fail 2 "in use by another fdtrain job \(pid $pid" train "$S" --run-dir "$D" --overwrite
  fi
  kill -$sig $pid
  wait $pid; rc=$?
  want=$([ $sig = TERM ] && echo 143 || echo 130)
  steps=$(field "$D" steps)
  if [ $rc -eq "$want" ] && [ "$(field "$D" status)" = interrupted ] && [ "$(field "$D" signal)" = SIG$sig ] \
     && [ "$(cat "$D/checkpoints/latest")" = "$(printf 'step_%08d' "$steps")" ]; then
    echo "ok: 9: SIG$sig: exit $rc, status interrupted, checkpoint of step $steps"
  else
    fail "9: SIG$sig: exit $rc (expected $want), status $(field "$D" status), signal $(field "$D" signal)"
    tail -5 "$D.log" | sed 's/^/    /'
  fi
done
# ... and the interrupted run resumes to its end.
expect_run 0 train "$S" steps=$(( $(field "$TMP/sig_TERM" steps) + 3 )) --run-dir "$TMP/sig_TERM" --resume auto --no-progress \
  && [ "$(field "$TMP/sig_TERM" status)" = completed ] && echo "ok: 9: the interrupted run resumed and completed"

# SIGTERM to the ranks of an mpirun job (as Slurm and Kubernetes deliver it).
M=$TMP/mpi_term
mpirun --oversubscribe --bind-to none -n 2 "$FDTRAIN" train "$S" --run-dir "$M" --no-progress > "$M.log" 2>&1 &
mpid=$!
if wait_for_step "$M" 10; then
  pkill -TERM -P $mpid -f "$FDTRAIN"  # the ranks: mpirun's children
  wait $mpid; rc=$?
  if [ $rc -eq 143 ] && [ "$(field "$M" status)" = interrupted ] && [ "$(field "$M" world_size)" = 2 ] \
     && "$FDTRAIN" ckpt inspect "$M" > /dev/null 2>&1; then
    echo "ok: 9: SIGTERM under mpirun -n 2: exit 143, status interrupted, checkpoint verifies"
  else
    fail "9: SIGTERM under mpirun: exit $rc, status $(field "$M" status)"; tail -5 "$M.log" | sed 's/^/    /'
  fi
else
  fail "9: the mpirun job did not reach step 10"; kill $mpid; wait $mpid
fi

# A loss above max_loss (byte-level text starts near ln 256 = 5.5): diverged, exit 1.
expect_fail 1 "above max_loss = 3" train "$R" max_loss=3 --run-dir "$TMP/div"
[ "$(field "$TMP/div" status)" = diverged ] && [ "$(field "$TMP/div" exit_reason)" = loss_above_max ] \
  && echo "ok: 9: max_loss ends the run as diverged" || fail "9: diverged summary: $(cat "$TMP/div/summary.json")"
# A failure on one rank of two: status failed, exit 1.
out=$(FDTRAIN_FAULT=throw:rank=1:step=3 timeout 120 mpirun --oversubscribe --bind-to none -n 2 \
  "$FDTRAIN" train "$R" --run-dir "$TMP/failed" --no-progress 2>&1); rc=$?
if [ $rc -ne 0 ] && [ "$(field "$TMP/failed" status)" = failed ] && [ "$(field "$TMP/failed" steps)" = 3 ] \
   && grep -q "injected fault" "$TMP/failed/summary.json"; then
  echo "ok: 9: a rank's failure ends the run with status failed (exit $rc)"
else
  fail "9: failed run: exit $rc, summary: $(cat "$TMP/failed/summary.json" 2>&1)"; echo "$out" | tail -5 | sed 's/^/    /'
fi

# --- 10. absolute paths: the run's config.yaml works from anywhere ---
mkdir -p "$TMP/work/data"
head -c 200000 /usr/share/games/fortunes/fortunes > "$TMP/work/data/train.txt"
sed 's|/usr/share/games/fortunes/fortunes|data/train.txt|' "$R" > "$TMP/work/rel.yaml"
(cd "$TMP/work" && "$FDTRAIN" train rel.yaml --run-dir run --no-progress > /dev/null 2>&1) || fail "10: relative run"
grep -q "  - $TMP/work/data/train.txt" "$TMP/work/run/config.yaml" || fail "10: config.yaml keeps a relative path"
python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["working_dir"] == sys.argv[2]' \
  "$TMP/work/run/run.json" "$TMP/work" || fail "10: run.json has no working_dir"
(cd / && "$FDTRAIN" train "$TMP/work/run/config.yaml" --run-dir "$TMP/again" --no-progress > /dev/null 2>&1) \
  && [ "$(field "$TMP/again" weights_sha256)" = "$(field "$TMP/work/run" weights_sha256)" ] \
  && echo "ok: 10: RUN/config.yaml reproduces the run from another directory" \
  || fail "10: config.yaml from another directory"
finish
