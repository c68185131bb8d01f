#!/usr/bin/env bash
# model.init_from: a run starts from `fdtrain ckpt export` output (.safetensors
# and .h5) with exactly the exported weights; `ckpt inspect` verifies a
# checkpoint; exporting over an existing file is refused.
source "$(dirname "$0")/common.bash"
R=$TMP/r.yaml
write_recipe "$R"
sed -i 's/^steps: 3/steps: 10/' "$R"
"$FDTRAIN" train "$R" checkpoint.every=10 --run-dir "$TMP/base" --no-progress > /dev/null 2>&1 \
  || { echo "FAIL: base run"; exit 1; }
out=$("$FDTRAIN" ckpt inspect "$TMP/base" 2>&1) || { echo "FAIL: inspect"; echo "$out"; FAILURES=$((FAILURES+1)); }
grep -q "checksums ok" <<<"$out" && echo "ok: ckpt inspect verifies the checksums" \
  || { echo "FAIL: inspect output"; echo "$out" | head; FAILURES=$((FAILURES+1)); }
for ext in safetensors h5; do
  "$FDTRAIN" ckpt export "$TMP/base" --out "$TMP/base.$ext" > /dev/null \
    || { echo "FAIL: export $ext"; FAILURES=$((FAILURES+1)); continue; }
  # One step at a vanishing learning rate and no weight decay leaves fp32 weights unchanged.
  "$FDTRAIN" train "$R" model.init_from="$TMP/base.$ext" steps=1 optimizer.lr=1e-30 \
    optimizer.weight_decay=0 checkpoint.every=1 --run-dir "$TMP/from_$ext" --no-progress > "$TMP/$ext.log" 2>&1 \
    || { echo "FAIL: train from $ext"; tail -3 "$TMP/$ext.log"; FAILURES=$((FAILURES+1)); continue; }
  rel=$("$FDTRAIN" ckpt diff "$TMP/from_$ext" "$TMP/base" | sed -n 's/^relative_difference //p')
  if awk -v r="$rel" 'BEGIN { exit !(r != "" && r == 0) }'; then
    echo "ok: a run from the .$ext export starts with the exported weights (difference $rel)"
  else
    echo "FAIL: init_from .$ext: relative difference '$rel'"; FAILURES=$((FAILURES+1))
  fi
done
expect_fail 2 "exists" ckpt export "$TMP/base" --out "$TMP/base.safetensors"
expect_fail 2 "model.init_from.*n_layer" train "$R" model.init_from="$TMP/base.safetensors" \
  model.n_layer=2 --run-dir "$TMP/wrong"
finish
