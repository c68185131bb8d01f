#!/usr/bin/env bash
# A short run leaves config.yaml (loadable again), command.txt, metrics.jsonl
# and summary.json with the documented fields; the same recipe twice gives the
# same weights_sha256; print-config output validates and reproduces itself.
source "$(dirname "$0")/common.bash"
R=$TMP/r.yaml
write_recipe "$R"
sed -i 's/^steps: 3/steps: 6/; s/^  val_fraction: 0.0/  val_fraction: 0.2/' "$R"

for run in a b; do
  "$FDTRAIN" train "$R" seed=7 --run-dir "$TMP/$run" --no-progress > "$TMP/$run.log" 2>&1 \
    || { echo "FAIL: run $run"; cat "$TMP/$run.log"; exit 1; }
done
for f in config.yaml command.txt metrics.jsonl summary.json; do
  [ -s "$TMP/a/$f" ] || { echo "FAIL: $f missing"; FAILURES=$((FAILURES+1)); }
done
for key in steps final_loss eval_loss tokens_per_s world_size precision weights_sha256 memory \
           params grads optimizer activations exit_reason; do
  grep -q "\"$key\"" "$TMP/a/summary.json" || { echo "FAIL: summary.json lacks $key"; FAILURES=$((FAILURES+1)); }
done
[ "$(wc -l < "$TMP/a/metrics.jsonl")" -eq 6 ] || { echo "FAIL: expected 6 metrics lines"; FAILURES=$((FAILURES+1)); }
for key in step loss lr grad_norm tokens_per_s elapsed_s; do
  grep -q "\"$key\":" <(head -1 "$TMP/a/metrics.jsonl") || { echo "FAIL: metrics lack $key"; FAILURES=$((FAILURES+1)); }
done
grep -q "seed=7" "$TMP/a/command.txt" || { echo "FAIL: command.txt"; FAILURES=$((FAILURES+1)); }

sha() { grep -o '"weights_sha256": "[0-9a-f]*"' "$1/summary.json"; }
if [ -n "$(sha "$TMP/a")" ] && [ "$(sha "$TMP/a")" = "$(sha "$TMP/b")" ]; then
  echo "ok: deterministic $(sha "$TMP/a")"
else
  echo "FAIL: weights differ: $(sha "$TMP/a") vs $(sha "$TMP/b")"; FAILURES=$((FAILURES+1))
fi
# A different seed must change the weights (the digest is not constant).
"$FDTRAIN" train "$R" seed=8 --run-dir "$TMP/c" --no-progress > /dev/null 2>&1
[ "$(sha "$TMP/a")" != "$(sha "$TMP/c")" ] || { echo "FAIL: seed does not change weights"; FAILURES=$((FAILURES+1)); }

# The stored config reproduces the run, and print-config is a fixed point.
"$FDTRAIN" validate "$TMP/a/config.yaml" > /dev/null || { echo "FAIL: config.yaml invalid"; FAILURES=$((FAILURES+1)); }
"$FDTRAIN" print-config "$R" seed=7 > "$TMP/p1.yaml"
"$FDTRAIN" print-config "$TMP/p1.yaml" > "$TMP/p2.yaml"
cmp -s "$TMP/p1.yaml" "$TMP/p2.yaml" || { echo "FAIL: print-config not a fixed point"; FAILURES=$((FAILURES+1)); }
cmp -s "$TMP/p1.yaml" "$TMP/a/config.yaml" || { echo "FAIL: config.yaml != print-config"; FAILURES=$((FAILURES+1)); }
"$FDTRAIN" train "$TMP/a/config.yaml" --run-dir "$TMP/d" --no-progress > /dev/null 2>&1
[ "$(sha "$TMP/a")" = "$(sha "$TMP/d")" ] || { echo "FAIL: config.yaml does not reproduce the run"; FAILURES=$((FAILURES+1)); }

# `fdtrain RECIPE` is shorthand for `fdtrain train RECIPE`.
"$FDTRAIN" "$R" seed=7 --run-dir "$TMP/e" --no-progress > /dev/null 2>&1
[ "$(sha "$TMP/a")" = "$(sha "$TMP/e")" ] || { echo "FAIL: shorthand"; FAILURES=$((FAILURES+1)); }
finish
