#!/usr/bin/env bash
# Bitwise resume: 30 steps straight vs 15 steps, resume from the step-15
# checkpoint, 15 more: the same weights_sha256 and identical per-step losses,
# for ZeRO stages 0-3, fp32 and bf16, world 1, 2 and 4.
source "$(dirname "$0")/common.bash"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
R=$TMP/r.yaml
write_recipe "$R"
sed -i 's/^steps: 3/steps: 30/; s/^  micro: 2/  micro: 4/' "$R"
run() {  # run WORLD ARGS...
  local world=$1; shift
  if [ "$world" = 1 ]; then "$FDTRAIN" train "$R" "$@" --no-progress
  else timeout 300 mpirun --oversubscribe --bind-to none -n "$world" "$FDTRAIN" train "$R" "$@" --no-progress; fi
}
sha() { sed -n 's/^  "weights_sha256": "\([0-9a-f]*\)",*$/\1/p' "$1/summary.json"; }
losses() { sed -n 's/.*"loss":\([^,]*\),.*"step":\([0-9]*\),.*/\2 \1/p' "$1/metrics.jsonl" | awk -v from="$2" '$1 > from'; }

for world in 1 2 4; do
  for precision in fp32 bf16; do
    for stage in 0 1 2 3; do
      tag="w${world}_${precision}_s$stage"
      set_args=(zero.stage=$stage precision=$precision checkpoint.every=15 checkpoint.keep_last=2)
      run "$world" "${set_args[@]}" --run-dir "$TMP/$tag.straight" > "$TMP/$tag.log" 2>&1 \
        || { echo "FAIL: $tag straight run"; tail -5 "$TMP/$tag.log"; FAILURES=$((FAILURES+1)); continue; }
      run "$world" "${set_args[@]}" --resume "$TMP/$tag.straight/checkpoints/step_00000015" \
        --run-dir "$TMP/$tag.resumed" > "$TMP/$tag.rlog" 2>&1 \
        || { echo "FAIL: $tag resumed run"; tail -5 "$TMP/$tag.rlog"; FAILURES=$((FAILURES+1)); continue; }
      a=$(sha "$TMP/$tag.straight"); b=$(sha "$TMP/$tag.resumed")
      la=$(losses "$TMP/$tag.straight" 15); lb=$(losses "$TMP/$tag.resumed" 15)
      if [ -n "$a" ] && [ "$a" = "$b" ] && [ "$la" = "$lb" ] && [ "$(wc -l <<<"$la")" -eq 15 ]; then
        echo "ok: $tag: weights ${a:0:16} and the losses of steps 16-30 identical"
      else
        echo "FAIL: $tag: weights $a vs $b"; diff <(echo "$la") <(echo "$lb") | head -5
        FAILURES=$((FAILURES+1))
      fi
    done
  done
done
finish
