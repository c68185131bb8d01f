#!/usr/bin/env bash
# make bench: packing by best fit against first come first served (issue 43), on
# recipes/sft_chat_lora.yaml as `make sft-demo` runs it (8 ranks, the recipe's steps), one run
# each, in this order: best_fit, first_come. Printed per run: rows, occupancy (positions
# holding tokens), targets per row, tokens/s over all positions and over useful (non-pad)
# positions, and the final eval loss. Goal: best_fit fills >= 95% of the positions, its useful
# tokens/s is >= 1.25x first_come's, and its eval loss is no worse.
#
# The eval loss is the mean over every validation target exactly once: the two orders make
# different numbers of validation rows R, and evaluation reads rows cyclically, so each run's
# logging.eval_batches is set to R / gcd(R, rows per evaluation batch), a whole number of
# passes over the validation rows.
#
#   bench/packing_bench.sh BUILD_DIR [KEY=VALUE ...]
#   KEY=VALUE  recipe overrides for both runs (steps=600 logging.eval_every=50: the eval curve)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD=${1:?usage: packing_bench.sh BUILD_DIR [KEY=VALUE ...]}
shift
FDTRAIN=$BUILD/bin/fdtrain
[ -x "$FDTRAIN" ] || { echo "packing_bench.sh: $FDTRAIN not built" >&2; exit 2; }
MPIRUN="mpirun --oversubscribe --bind-to none"
RECIPE=recipes/sft_chat_lora.yaml
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

if [ ! -f runs/pretrain_chat_base/hf/config.json ]; then
  echo "packing_bench.sh: making the base (recipes/pretrain_chat_base.yaml, as make sft-demo does)"
  $MPIRUN -n 2 "$FDTRAIN" train recipes/pretrain_chat_base.yaml --run-dir runs/pretrain_chat_base \
    --overwrite > "$WORK/base.log" 2>&1 || { tail -20 "$WORK/base.log"; exit 1; }
  "$FDTRAIN" ckpt export runs/pretrain_chat_base --hf-dir runs/pretrain_chat_base/hf --overwrite \
    > /dev/null
fi

echo "sft_chat_lora: packing_order best_fit against first_come (issue 43), 8 ranks"
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc --all) cores"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
extra=("$@")
for order in best_fit first_come; do
  # The validation rows of this order (a one-step probe), then the real run.
  $MPIRUN -n 8 "$FDTRAIN" train "$RECIPE" "data.packing_order=$order" steps=1 \
    logging.eval_every=0 checkpoint.every=0 --run-dir "$WORK/probe_$order" > "$WORK/probe.log" 2>&1 ||
    { tail -20 "$WORK/probe.log"; exit 1; }
  eval_batches=$(python3 - "$WORK/probe_$order/summary.json" "$FDTRAIN" "$RECIPE" <<'PY'
import json, math, subprocess, sys
s = json.load(open(sys.argv[1]))
rows = s["data"]["rows"]["val"]
per_batch = 8 * 2  # ranks x batch.micro of the recipe
print(rows // math.gcd(rows, per_batch))
PY
)
  $MPIRUN -n 8 "$FDTRAIN" train "$RECIPE" "data.packing_order=$order" \
    "logging.eval_batches=$eval_batches" "${extra[@]}" --run-dir "$WORK/$order" \
    > "$WORK/$order.log" 2>&1 || { tail -20 "$WORK/$order.log"; exit 1; }
  echo "$order: generate --chat \"What does the ls command do?\": $("$FDTRAIN" generate "$WORK/$order" \
    --chat --temperature 0 --max-tokens 80 --prompt "What does the ls command do?" 2>/dev/null)"
  cp "$WORK/$order/summary.json" "$WORK/summary_$order.json"
  cp "$WORK/$order/metrics.jsonl" "$WORK/metrics_$order.jsonl"
done
python3 - "$WORK" <<'PY'
import json, sys
w = sys.argv[1]
r = {o: json.load(open(f"{w}/summary_{o}.json")) for o in ("best_fit", "first_come")}
print(f"{'order':<11} {'rows':>5} {'occupancy':>9} {'targets/row':>11} {'tok/s':>8} {'useful tok/s':>12} {'eval loss':>9} {'steps':>5}")
for o, s in r.items():
    d = s["data"]
    print(f"{o:<11} {d['rows']['train']:>5} {100 * d['efficiency']:>8.1f}% {d['targets_per_row']:>11.1f} "
          f"{s['tokens_per_s']:>8.0f} {s['tokens_per_s'] * d['efficiency']:>12.0f} {s['eval_loss']:>9.4f} {s['steps']:>5}")
curve = {o: {m["step"]: m["eval_loss"] for m in map(json.loads, open(f"{w}/metrics_{o}.jsonl"))
             if m.get("eval_loss") is not None} for o in r}
print("eval loss by step: " + ", ".join(
    f"{s}: {curve['best_fit'][s]:.4f} / {curve['first_come'].get(s, float('nan')):.4f}"
    for s in sorted(curve["best_fit"])) + " (best_fit / first_come)")
b, f = r["best_fit"], r["first_come"]
useful = (b["tokens_per_s"] * b["data"]["efficiency"]) / (f["tokens_per_s"] * f["data"]["efficiency"])
print(f"useful tokens/s best_fit / first_come: {useful:.2f}x (goal >= 1.25x); "
      f"occupancy {100 * b['data']['efficiency']:.1f}% (goal >= 95%); "
      f"eval loss {b['eval_loss']:.4f} vs {f['eval_loss']:.4f} ({'no worse' if b['eval_loss'] <= f['eval_loss'] else 'WORSE'})")
PY
