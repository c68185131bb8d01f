#!/usr/bin/env bash
# --profile: summary.json gets "profile" with the per-phase totals (each >= 0,
# their sum <= elapsed_s) and the log a table; without it there is no "profile".
source "$(dirname "$0")/common.bash"
R=$TMP/r.yaml
write_recipe "$R"
sed -i 's/^steps: 3/steps: 4/' "$R"
cat >> "$R" <<'YAML'
checkpoint:
  every: 2
YAML

"$FDTRAIN" train "$R" --run-dir "$TMP/p" --no-progress --profile > "$TMP/p.log" 2>&1 \
  || { echo "FAIL: profiled run"; cat "$TMP/p.log"; exit 1; }
python3 - "$TMP/p/summary.json" <<'PY' || FAILURES=$((FAILURES+1))
import json, sys
s = json.load(open(sys.argv[1]))
p = s.get("profile")
if p is None: sys.exit("FAIL: summary.json lacks profile")
keys = ["data_s", "forward_s", "backward_s", "comm_wait_s", "optimizer_s", "checkpoint_s"]
bad = [k for k in keys + ["other_s", "total_s"] if not isinstance(p.get(k), (int, float)) or p[k] < 0]
if bad: sys.exit(f"FAIL: profile fields missing or negative: {bad} in {p}")
if p.get("steps") != 3 or p.get("first_step_excluded") is not True:
    sys.exit(f"FAIL: profile should cover steps 2-4 (3 steps): {p}")
total = sum(p[k] for k in keys)
if total > s["elapsed_s"] or total > p["total_s"] + 1e-6:
    sys.exit(f"FAIL: phases sum {total} > elapsed {s['elapsed_s']} / total {p['total_s']}")
if p["forward_s"] <= 0 or p["backward_s"] <= 0 or p["checkpoint_s"] <= 0:
    sys.exit(f"FAIL: forward/backward/checkpoint not measured: {p}")
print(f"ok: profile {p}")
PY
for phase in data forward backward "comm wait" optimizer checkpoint; do
  grep -q "^ *$phase  " "$TMP/p.log" || grep -q " $phase  " "$TMP/p.log" \
    || { echo "FAIL: no '$phase' row in the profile table"; cat "$TMP/p.log"; FAILURES=$((FAILURES+1)); }
done

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPI=(timeout 120 mpirun --oversubscribe --bind-to none)
# A pipeline (P = 2 at mpirun -n 2, 4 micro-batches): rank 0's stage times its loads, forwards
# and the rest of its schedule, and its waits for the other stage (the bubble) are
# communication waits: every phase measured, their sum within the step time.
"${MPI[@]}" -n 2 "$FDTRAIN" train "$R" model.n_layer=2 parallel.pipeline=2 batch.accumulation=4 --run-dir "$TMP/pp" \
  --no-progress --profile > "$TMP/pp.log" 2>&1 || { echo "FAIL: profiled pipeline run"; cat "$TMP/pp.log"; exit 1; }
python3 - "$TMP/pp/summary.json" <<'PY' || FAILURES=$((FAILURES+1))
import json, sys
s = json.load(open(sys.argv[1]))
p = s["profile"]
keys = ["data_s", "forward_s", "backward_s", "comm_wait_s", "optimizer_s", "checkpoint_s"]
zero = [k for k in ["data_s", "forward_s", "backward_s", "comm_wait_s"] if not p[k] > 0]
if zero: sys.exit(f"FAIL: pipeline profile: {zero} not measured: {p}")
if any(p[k] < 0 for k in keys): sys.exit(f"FAIL: pipeline profile: a negative phase: {p}")
total = sum(p[k] for k in keys)
if total > p["total_s"] + 1e-6: sys.exit(f"FAIL: pipeline phases sum {total} > total {p['total_s']}")
idle = s["pipeline"]["idle_fraction"][0]
print(f"ok: pipeline profile {p} (stage 0 idle fraction {idle})")
PY

"$FDTRAIN" train "$R" --run-dir "$TMP/q" --no-progress > "$TMP/q.log" 2>&1 \
  || { echo "FAIL: plain run"; cat "$TMP/q.log"; exit 1; }
if grep -q '"profile"' "$TMP/q/summary.json" || grep -q "^.*profile (rank" "$TMP/q.log"; then
  echo "FAIL: profile without --profile"; FAILURES=$((FAILURES+1))
else
  echo "ok: no profile without --profile"
fi
finish
