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

"$FDTRAIN" train "$R" --run-dir "$TMP/q" --no-progress > "$TMP/q.log" 2>&1 \
  || { echo "FAIL: plain run"; cat "$TMP/q.log"; exit 1; }
if grep -q '"profile"' "$TMP/q/summary.json" || grep -q "^.*profile (rank" "$TMP/q.log"; then
  echo "FAIL: profile without --profile"; FAILURES=$((FAILURES+1))
else
  echo "ok: no profile without --profile"
fi
finish
