#!/usr/bin/env bash
# Resuming at another world size and accumulation: 20 steps at world 2 with
# micro 4 (global batch 8), checkpoint at step 10, resumed at world 1 with
# micro 4 and accumulation 2 (the same global batch). The sampler draws the
# same sequences for every split of a step, so the losses of steps 11-20
# match the straight world-2 run to a relative difference <= 1e-5 (not
# bitwise: the sums run in another order).
source "$(dirname "$0")/common.bash"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
R=$TMP/r.yaml
write_recipe "$R"
sed -i 's/^steps: 3/steps: 20/; s/^  micro: 2/  micro: 4/' "$R"
losses() { sed -n 's/.*"loss":\([^,]*\),.*"step":\([0-9]*\),.*/\2 \1/p' "$1/metrics.jsonl" | awk '$1 > 10'; }

timeout 300 mpirun --oversubscribe --bind-to none -n 2 "$FDTRAIN" train "$R" checkpoint.every=10 \
  --run-dir "$TMP/w2" --no-progress > "$TMP/w2.log" 2>&1 \
  || { echo "FAIL: world-2 run"; tail -5 "$TMP/w2.log"; FAILURES=$((FAILURES+1)); finish; }
timeout 300 "$FDTRAIN" train "$R" checkpoint.every=10 batch.accumulation=2 \
  --resume "$TMP/w2/checkpoints/step_00000010" --run-dir "$TMP/w1" --no-progress > "$TMP/w1.log" 2>&1 \
  || { echo "FAIL: resume at world 1, accumulation 2"; tail -5 "$TMP/w1.log"; FAILURES=$((FAILURES+1)); finish; }

# Per step: |resumed - straight| / |straight|; the largest, and a failure past 1e-5.
if awk 'NR == FNR { straight[$1] = $2; next }
    ($1 in straight) { n++; $3 = $2; $2 = straight[$1]; r = $3 - $2; if (r < 0) r = -r; r /= ($2 < 0 ? -$2 : $2);
      if (n == 1 || r > max) { max = r; at = $1 } if (r > 1e-5) { bad++; printf "  step %d: %s vs %s (rel %.3g)\n", $1, $2, $3, r } }
    END { printf "%d steps compared, largest relative difference %.3g (step %d)\n", n, max, at;
          exit !(n == 10 && bad == 0) }' <(losses "$TMP/w2") <(losses "$TMP/w1"); then
  echo "ok: losses of steps 11-20 at world 1, accumulation 2 match the world-2 run"
else
  echo "FAIL: the resumed losses differ from the straight world-2 run (or not 10 steps)"
  FAILURES=$((FAILURES+1))
fi
finish
