#!/usr/bin/env bash
# Resharding on load, no conversion step: a checkpoint written at world 2
# stage 1 resumes at world 4 stage 3, and one written at world 4 resumes at
# world 1. After 15 more steps the weights match an uninterrupted run at the
# new world size (same global batch of 8 sequences) to ||dw|| / ||w|| <= 1e-5,
# and the first resumed loss equals the saved run's next loss within 1e-5.
source "$(dirname "$0")/common.bash"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
R=$TMP/r.yaml
write_recipe "$R"
sed -i 's/^steps: 3/steps: 30/' "$R"
sed -i 's/^  n_layer: 1/  n_layer: 2/; s/^  d_model: 16/  d_model: 32/' "$R"
run() {  # run WORLD MICRO STAGE DIR [ARGS...]
  local world=$1 micro=$2 stage=$3 dir=$4; shift 4
  local cmd=("$FDTRAIN" train "$R" batch.micro=$micro zero.stage=$stage checkpoint.every=15 "$@"
             --run-dir "$dir" --no-progress)
  if [ "$world" = 1 ]; then "${cmd[@]}"; else timeout 300 mpirun --oversubscribe --bind-to none -n "$world" "${cmd[@]}"; fi \
    > "$dir.log" 2>&1 || { echo "FAIL: run in $dir"; tail -5 "$dir.log"; FAILURES=$((FAILURES+1)); }
}
loss_at() { sed -n "s/.*\"loss\":\([^,]*\),.*\"step\":$2,.*/\1/p" "$1/metrics.jsonl"; }
check() {  # check NAME RESUMED REFERENCE SAVED_RUN
  local rel first next
  rel=$("$FDTRAIN" ckpt diff "$2/checkpoints" "$3/checkpoints" | sed -n 's/^relative_difference //p')
  first=$(loss_at "$2" 16); next=$(loss_at "$4" 16)
  if awk -v r="$rel" -v a="$first" -v b="$next" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(r != "" && r <= 1e-5 && d <= 1e-5) }'; then
    echo "ok: $1: ||dw||/||w|| = $rel vs the uninterrupted run; first resumed loss $first, saved run's next $next"
  else
    echo "FAIL: $1: ||dw||/||w|| = '$rel', first resumed loss $first vs $next"; FAILURES=$((FAILURES+1))
  fi
}

run 2 4 1 "$TMP/w2s1"                                   # saves at steps 15 and 30
run 4 2 3 "$TMP/w4s3" --resume "$TMP/w2s1/checkpoints/step_00000015"
run 4 2 3 "$TMP/w4s3_ref"                               # uninterrupted at world 4
check "world 2 stage 1 -> world 4 stage 3" "$TMP/w4s3" "$TMP/w4s3_ref" "$TMP/w2s1"

run 1 8 0 "$TMP/w1s0" --resume "$TMP/w4s3_ref/checkpoints/step_00000015"
run 1 8 0 "$TMP/w1s0_ref"                               # uninterrupted at world 1
check "world 4 stage 3 -> world 1 stage 0" "$TMP/w1s0" "$TMP/w1s0_ref" "$TMP/w4s3_ref"

# A checkpoint of another model is refused with the difference, and nothing is written.
out=$("$FDTRAIN" train "$R" model.n_layer=3 --resume "$TMP/w2s1/checkpoints/step_00000015" \
      --run-dir "$TMP/other" --no-progress 2>&1); rc=$?
if [ $rc -eq 2 ] && grep -q "model.n_layer: 2 -> 3" <<<"$out" && [ ! -e "$TMP/other/config.yaml" ]; then
  echo "ok: a different model is refused with its diff (exit 2), nothing written"
else
  echo "FAIL: different model: exit $rc"; echo "$out" | sed 's/^/    /'; FAILURES=$((FAILURES+1))
fi
finish
