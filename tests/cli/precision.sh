#!/usr/bin/env bash
# Mixed precision end to end on the quickstart model (150 steps, one rank):
#   - bf16 and fp16 track fp32: eval loss within 2% of fp32's;
#   - an infinite gradient injected in fp16 training (FDTRAIN_FAULT=inf) skips
#     the step, halves the loss scale (hysteresis 1), is logged and counted in
#     metrics.jsonl and summary.json, and the run goes on and converges.
source "$(dirname "$0")/common.bash"
Q=recipes/quickstart.yaml
COMMON=(steps=150 zero.stage=0 batch.micro=8 logging.sample_tokens=0 logging.every=10 --no-progress)
eval_loss() { sed -n 's/^  "eval_loss": \([0-9.e+-]*\),*$/\1/p' "$1/summary.json"; }

for p in fp32 bf16 fp16; do
  "$FDTRAIN" train "$Q" precision=$p "${COMMON[@]}" --run-dir "$TMP/$p" > "$TMP/$p.log" 2>&1 \
    || { echo "FAIL: $p run"; tail -5 "$TMP/$p.log"; FAILURES=$((FAILURES+1)); }
done
ref=$(eval_loss "$TMP/fp32")
for p in bf16 fp16; do
  l=$(eval_loss "$TMP/$p")
  if awk -v a="$l" -v r="$ref" 'BEGIN { d = (a - r) / r; if (d < 0) d = -d; exit !(d <= 0.02) }'; then
    echo "ok: $p eval loss $l vs fp32 $ref (within 2%)"
  else
    echo "FAIL: $p eval loss $l vs fp32 $ref (more than 2% apart)"; FAILURES=$((FAILURES+1))
  fi
done

# fp16 with an infinite gradient at step 40 (0-based), hysteresis 1: the scale halves.
FDTRAIN_FAULT=inf:rank=0:step=40 "$FDTRAIN" train "$Q" precision=fp16 loss_scale.hysteresis=1 \
  loss_scale.initial_scale_power=12 "${COMMON[@]}" --run-dir "$TMP/inf" > "$TMP/inf.log" 2>&1 \
  || { echo "FAIL: fp16 run with an injected inf"; tail -5 "$TMP/inf.log"; FAILURES=$((FAILURES+1)); }
line=$(grep '"step":41,' "$TMP/inf/metrics.jsonl")
if grep -q '"skipped":true' <<<"$line" && grep -q '"loss_scale":2048.0' <<<"$line"; then
  echo "ok: step 41 skipped, loss scale 4096 -> 2048: $line"
else
  echo "FAIL: step 41 not skipped with the scale halved: $line"; FAILURES=$((FAILURES+1))
fi
grep -q "step 41 skipped: non-finite gradients" "$TMP/inf.log" \
  || { echo "FAIL: skipped step not logged"; FAILURES=$((FAILURES+1)); }
skipped=$(sed -n 's/^  "skipped_steps": \([0-9]*\),*$/\1/p' "$TMP/inf/summary.json")
[ "${skipped:-0}" -ge 1 ] || { echo "FAIL: summary skipped_steps = $skipped"; FAILURES=$((FAILURES+1)); }
l=$(eval_loss "$TMP/inf")
if awk -v a="$l" -v r="$ref" 'BEGIN { exit !(a < 3.0 && (a - r) / r < 0.03) }'; then
  echo "ok: the run went on and converged: eval loss $l (fp32 $ref), $skipped step(s) skipped"
else
  echo "FAIL: eval loss $l after the injected overflow (fp32 $ref)"; FAILURES=$((FAILURES+1))
fi
finish
