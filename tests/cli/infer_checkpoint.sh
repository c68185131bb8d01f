#!/usr/bin/env bash
# Which checkpoint `eval RUN` and `generate RUN` read: they name the step they
# load (the run's checkpoints/latest), warn when it is older than the run's
# last step (summary.json "steps", else the last metrics.jsonl "step"), fall
# back from a damaged `latest` to the newest checkpoint that verifies (as
# --resume auto does), and, when the run has no checkpoint at all, say why
# instead of "not a checkpoint".
source "$(dirname "$0")/common.bash"
R=$TMP/r.yaml
write_recipe "$R"
head -c 60 /usr/share/games/fortunes/literature > "$TMP/val.txt"
"$FDTRAIN" train "$R" steps=6 checkpoint.every=3 checkpoint.keep_last=2 --run-dir "$TMP/run" \
  --no-progress > "$TMP/train.log" 2>&1 || { echo "FAIL: training run"; tail -5 "$TMP/train.log"; exit 1; }

# stderr_of ARGS...: fdtrain's stderr (stdout dropped); exit status must be 0.
stderr_of() {
  local err
  if ! err=$("$FDTRAIN" "$@" 2>&1 > /dev/null); then
    echo "FAIL: fdtrain $* exited non-zero"; echo "$err" | sed 's/^/    /'
    FAILURES=$((FAILURES + 1))
  fi
  printf '%s\n' "$err"
}
# check WHAT OUTPUT PATTERN [!]: OUTPUT has a line matching PATTERN (with !, has none).
check() {
  local what=$1 out=$2 pattern=$3 negate=${4:-}
  if grep -Eq -- "$pattern" <<<"$out"; then [ -z "$negate" ]; else [ -n "$negate" ]; fi \
    && { echo "ok: $what"; return; }
  echo "FAIL: $what: /$pattern/ ${negate:+un}expected in:"; echo "$out" | sed 's/^/    /'
  FAILURES=$((FAILURES + 1))
}

for cmd in "eval --data $TMP/val.txt --windows 1" "generate --max-tokens 2"; do
  name=${cmd%% *}
  # shellcheck disable=SC2086
  err=$(stderr_of ${cmd%% *} "$TMP/run" ${cmd#* })
  check "$name names the step it loads" "$err" "using checkpoint step_00000006 of $TMP/run"
  check "$name: no warning for the run's last step" "$err" "older|warn" !
  # shellcheck disable=SC2086
  err=$(stderr_of ${cmd%% *} "$TMP/run/checkpoints" ${cmd#* })
  check "$name names the step from a checkpoints directory" "$err" "using checkpoint step_00000006"
done

# latest points at an older step (as after a run that went on but crashed before its next save).
echo step_00000003 > "$TMP/run/checkpoints/latest"
STALE="step_00000003 is at step 3, but the run went on to step 6"
for cmd in "eval --data $TMP/val.txt --windows 1" "generate --max-tokens 2"; do
  # shellcheck disable=SC2086
  err=$(stderr_of ${cmd%% *} "$TMP/run" ${cmd#* })
  check "${cmd%% *} uses the older step named by latest" "$err" "using checkpoint step_00000003"
  check "${cmd%% *} warns that it is older than the run's last step (summary.json)" "$err" "$STALE"
done
mv "$TMP/run/summary.json" "$TMP/summary.json.away"
err=$(stderr_of generate "$TMP/run" --max-tokens 2)
check "without summary.json, the last step comes from metrics.jsonl" "$err" "$STALE"

# The newest checkpoint is damaged: the newest one that verifies, as --resume auto chooses, and
# said so.
mv "$TMP/summary.json.away" "$TMP/run/summary.json"
echo step_00000006 > "$TMP/run/checkpoints/latest"
truncate -s 2000 "$TMP/run/checkpoints/step_00000006/rank_00000.h5"
FELL_BACK="\`latest\` does not verify; using step_00000003, the newest checkpoint that verifies"
for cmd in "eval --data $TMP/val.txt --windows 1" "generate --max-tokens 2"; do
  # shellcheck disable=SC2086
  err=$(stderr_of ${cmd%% *} "$TMP/run" ${cmd#* })
  check "${cmd%% *}: a damaged latest falls back to the newest checkpoint that verifies" "$err" \
    "$FELL_BACK"
  check "${cmd%% *}: says why step 6 was passed over" "$err" "passing over .*step_00000006"
  check "${cmd%% *} loads step 3" "$err" "using checkpoint step_00000003 of $TMP/run"
done

# No checkpoint at all.
"$FDTRAIN" train "$R" checkpoint.every=0 checkpoint.at_end=false --run-dir "$TMP/none" --no-progress > /dev/null 2>&1 \
  || { echo "FAIL: run without checkpoints"; exit 1; }
NONE="none has no checkpoints: the run saved none \(checkpoint.every: 0 and checkpoint.at_end: false in .*config.yaml\).*checkpoint.at_end=true"
expect_fail 2 "$NONE" eval "$TMP/none" --data "$TMP/val.txt"
expect_fail 2 "$NONE" generate "$TMP/none"
# Checkpoints were due (every 3) but are not there.
rm -rf "$TMP/run/checkpoints"
GONE="run has no checkpoints: checkpoint.every is 3 .*step 6"
expect_fail 2 "$GONE" eval "$TMP/run" --data "$TMP/val.txt"
expect_fail 2 "$GONE" generate "$TMP/run"
finish
