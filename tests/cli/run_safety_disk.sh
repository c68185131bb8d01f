#!/usr/bin/env bash
# A resume on a full disk never empties metrics.jsonl (issue 16, item 2); a full disk during
# an asynchronous save (issue 41) ends the run as failed with step 5 intact.
# The run directory is on a 2 MiB tmpfs: a run with a checkpoint every 5 steps
# fails at step 10 (the disk is full) and ends with summary.json status
# "failed"; the partial checkpoint is removed, so `--resume auto` gets its
# space back, continues from step 5 and keeps metrics lines 1-5; with the disk
# filled to the last byte, a resume fails with one message (exit 1) and
# leaves metrics.jsonl and summary.json exactly as they were.
# Needs root to mount a tmpfs; skips with a message where mount is not permitted.
source "$(dirname "$0")/common.bash"
MNT=$TMP/small
cleanup() { umount "$MNT" 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
if ! mkdir -p "$MNT" || ! mount -t tmpfs -o size=2m tmpfs "$MNT" 2>/dev/null; then
  echo "skip: cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN); the full-disk resume test did not run"
  exit 0
fi
R=$TMP/r.yaml
write_recipe "$R"
# A checkpoint of this model is about 1.5 MB: the second one does not fit.
sed -i 's/^steps: 3/steps: 20/; s/^  n_layer: 1/  n_layer: 2/; s/^  d_model: 16/  d_model: 64/' "$R"
RUN=$MNT/run
fail() { echo "FAIL: $*"; FAILURES=$((FAILURES + 1)); }
field() { python3 -c 'import json,sys; v=json.load(open(sys.argv[1])).get(sys.argv[2]); print("null" if v is None else v)' "$RUN/summary.json" "$1" 2>/dev/null; }
lines() { wc -l < "$RUN/metrics.jsonl"; }

# Saves behind the step (the default): the full disk is found by the writer thread during the
# step-10 save and ends the run at the next step boundary: status failed, the message, the
# partial checkpoint removed and step 5 still `latest`, verified.
out=$("$FDTRAIN" train "$R" checkpoint.every=5 checkpoint.keep_last=1 --run-dir "$RUN" --no-progress 2>&1); rc=$?
steps=$(field steps)
if [ $rc -eq 1 ] && grep -Eiq "no space left|disk is full" <<<"$out" && [ "$(field status)" = failed ] \
   && [ "${steps:-0}" -ge 10 ] && [ ! -e "$RUN/checkpoints/.step_00000010.tmp" ] && [ ! -e "$RUN/checkpoints/step_00000010" ] \
   && [ "$(cat "$RUN/checkpoints/latest")" = step_00000005 ] && "$FDTRAIN" ckpt inspect "$RUN" > /dev/null 2>&1 \
   && ! grep -Eq "terminate called|what\(\)|Segmentation|core dumped|HDF5-DIAG" <<<"$out"; then
  echo "ok: a full disk during an asynchronous save ends the run after step $steps: exit 1, status failed, step 5 intact"
else
  fail "async save on a full disk: exit $rc, status $(field status), steps $steps, latest $(cat "$RUN/checkpoints/latest" 2>/dev/null)"
  echo "$out" | tail -4 | sed 's/^/    /'; ls -la "$RUN/checkpoints" | sed 's/^/    /'
fi
rm -rf "$RUN"

# Synchronous saves: the run ends at step 10 itself.
out=$("$FDTRAIN" train "$R" checkpoint.every=5 checkpoint.keep_last=1 checkpoint.async=false --run-dir "$RUN" --no-progress 2>&1); rc=$?
if [ $rc -eq 1 ] && grep -Eiq "no space left|disk is full" <<<"$out" && [ "$(field status)" = failed ] \
   && [ "$(field steps)" = 10 ] && [ ! -e "$RUN/checkpoints/.step_00000010.tmp" ] && [ "$(lines)" -eq 10 ]; then
  echo "ok: the full disk ends the run at step 10: exit 1, status failed, partial checkpoint removed"
else
  fail "first run: exit $rc, status $(field status), steps $(field steps), $(lines) metrics lines"
  echo "$out" | tail -4 | sed 's/^/    /'; ls -la "$RUN/checkpoints" | sed 's/^/    /'
fi

# The resume gets the space back, keeps lines 1-5 and fails again at the next save.
out=$("$FDTRAIN" train "$R" checkpoint.every=5 checkpoint.keep_last=1 checkpoint.async=false --run-dir "$RUN" --resume auto --no-progress 2>&1); rc=$?
steps=$(python3 -c 'import json,sys; print(" ".join(str(json.loads(l)["step"]) for l in open(sys.argv[1])))' "$RUN/metrics.jsonl")
if [ $rc -eq 1 ] && [ "$steps" = "1 2 3 4 5 6 7 8 9 10" ] && [ "$(field status)" = failed ] && [ "$(field start_step)" = 5 ]; then
  echo "ok: the resume kept metrics 1-5, trained 6-10 and failed again with a summary"
else
  fail "resume: exit $rc, metrics steps '$steps', status $(field status)"; echo "$out" | tail -4 | sed 's/^/    /'
fi

# Not a byte free: the resume cannot rewrite metrics.jsonl; nothing is lost.
before=$(cd "$RUN" && md5sum metrics.jsonl summary.json config.yaml)
dd if=/dev/zero of="$MNT/filler" bs=4k status=none 2>/dev/null
out=$("$FDTRAIN" train "$R" checkpoint.every=5 checkpoint.keep_last=1 checkpoint.async=false --run-dir "$RUN" --resume auto --no-progress 2>&1); rc=$?
after=$(cd "$RUN" && md5sum metrics.jsonl summary.json config.yaml)
if [ $rc -eq 1 ] && grep -iq "metrics.jsonl.*no space left on device.*nothing else in .* was changed" <<<"$out" \
   && [ "$before" = "$after" ] && ! ls "$RUN"/*.tmp > /dev/null 2>&1; then
  echo "ok: on a full disk the resume fails with one message, metrics.jsonl and summary.json intact"
else
  fail "full-disk resume: exit $rc"; echo "$out" | tail -4 | sed 's/^/    /'; diff <(echo "$before") <(echo "$after")
fi
if grep -Eq "terminate called|what\(\)|Segmentation|core dumped|HDF5-DIAG" <<<"$out"; then fail "raw crash output"; fi

# The disk fills up under a running job (another program writes): the metrics line cannot be
# appended (or the event file written), and the summary is still written, into the room the run kept for it.
rm -f "$MNT/filler"; rm -rf "$RUN"
RUN=$MNT/run2
sed -i 's/^steps: 20/steps: 100000/' "$R"
"$FDTRAIN" train "$R" --run-dir "$RUN" --no-progress > "$TMP/fill.log" 2>&1 &
pid=$!
for _ in $(seq 600); do grep -q '"step":20[,}]' "$RUN/metrics.jsonl" 2>/dev/null && break; sleep 0.1; done
dd if=/dev/zero of="$MNT/filler" bs=4k status=none 2>/dev/null
wait $pid; rc=$?
if [ $rc -eq 1 ] && [ "$(field status)" = failed ] && grep -qi "no space left on device" "$RUN/summary.json" \
   && [ ! -e "$RUN/.summary_reserve" ]; then
  echo "ok: a disk filled by someone else: exit 1 and a failed summary, written into the reserved room"
else
  fail "disk filled while running: exit $rc, status $(field status)"; tail -3 "$TMP/fill.log" | sed 's/^/    /'
fi
finish
