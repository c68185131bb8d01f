#!/usr/bin/env bash
# fdtrain runs / plot over a small sweep (two world-1 runs, one under mpirun -n 2):
# one table row per run with the overrides that tell it apart and the numbers of
# summary.json; --json equal to summary.json; the SVG parses as XML with one
# polyline per series, axes, ticks and a legend; a finished run directory is
# refused (exit 2, the message says what/where/what to do, no file touched).
source "$(dirname "$0")/common.bash"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
PY=/usr/bin/python3
R=$TMP/r.yaml
write_recipe "$R"
sed -i 's/^steps: 3/steps: 6/; s/^  val_fraction: 0.0/  val_fraction: 0.2/' "$R"
common=(steps=6 logging.eval_every=3)
S=$TMP/sweep
for lr in 1e-3 3e-3; do
  "$FDTRAIN" train "$R" "${common[@]}" optimizer.lr=$lr --run-dir "$S/lr$lr" --no-progress \
    > "$TMP/lr$lr.log" 2>&1 || { echo "FAIL: run lr$lr"; cat "$TMP/lr$lr.log"; exit 1; }
done
timeout 120 mpirun --oversubscribe --bind-to none -n 2 "$FDTRAIN" train "$R" "${common[@]}" \
  zero.stage=3 --run-dir "$S/z3" --no-progress > "$TMP/z3.log" 2>&1 \
  || { echo "FAIL: run z3"; cat "$TMP/z3.log"; exit 1; }

# run.json records the overrides as a list from the start.
$PY - "$S/lr1e-3/run.json" <<'PY' || { echo "FAIL: run.json"; FAILURES=$((FAILURES+1)); }
import json, sys
r = json.load(open(sys.argv[1]))
assert r["overrides"] == ["steps=6", "logging.eval_every=3", "optimizer.lr=1e-3"], r
assert "optimizer.lr=1e-3" in r["command"] and r["world_size"] == 1, r
PY

# The table: a header, one row per run, the common overrides once.
"$FDTRAIN" runs "$S" > "$TMP/table.txt" 2> "$TMP/table.err" || { echo "FAIL: fdtrain runs"; cat "$TMP/table.err"; FAILURES=$((FAILURES+1)); }
cat "$TMP/table.txt"
[ "$(wc -l < "$TMP/table.txt")" -eq 5 ] || { echo "FAIL: expected 5 lines"; FAILURES=$((FAILURES+1)); }
grep -Eq '^run +overrides +steps +train loss +eval loss +tok/s +peak mem +status$' "$TMP/table.txt" \
  || { echo "FAIL: header"; FAILURES=$((FAILURES+1)); }
grep -Eq '^lr1e-3 +optimizer.lr=1e-3 +6/6 +[0-9.]+ +[0-9.]+ +[0-9]+ +[0-9.]+ [KM]iB +completed$' "$TMP/table.txt" \
  || { echo "FAIL: row lr1e-3"; FAILURES=$((FAILURES+1)); }
grep -Eq '^z3 +zero.stage=3 +6/6 .* completed$' "$TMP/table.txt" || { echo "FAIL: row z3"; FAILURES=$((FAILURES+1)); }
grep -q '^common overrides: steps=6 logging.eval_every=3$' "$TMP/table.txt" \
  || { echo "FAIL: common overrides"; FAILURES=$((FAILURES+1)); }

# --json: the same runs, numbers equal to summary.json.
"$FDTRAIN" runs "$S/lr3e-3" "$S/z3" --json > "$TMP/runs.json" || { echo "FAIL: runs --json"; FAILURES=$((FAILURES+1)); }
$PY - "$TMP/runs.json" "$S" <<'PY' || { echo "FAIL: runs --json differs from summary.json"; FAILURES=$((FAILURES+1)); }
import json, sys
rows = json.load(open(sys.argv[1]))
assert [r["name"] for r in rows] == ["lr3e-3", "z3"], rows
for r in rows:
    s = json.load(open(f"{sys.argv[2]}/{r['name']}/summary.json"))
    for k in ("final_loss", "eval_loss", "tokens_per_s", "exit_reason", "steps", "overrides",
              "zero_stage", "world_size", "peak_rss_bytes"):
        assert r[k] == s[k], (k, r[k], s[k])
    assert r["peak_memory_bytes"] == s["memory"]["total"]
assert rows[1]["world_size"] == 2 and rows[1]["zero_stage"] == 3 and rows[0]["lr"] == 3e-3
PY
expect_fail 2 "no/such/dir: no such directory" runs "$TMP/no/such/dir"
mkdir -p "$TMP/empty"
expect_fail 2 "empty: holds no run directory" runs "$TMP/empty"

# The plot: valid XML, one polyline per series, axes with ticks, a legend.
"$FDTRAIN" plot "$S" --out "$TMP/loss.svg" || { echo "FAIL: fdtrain plot"; FAILURES=$((FAILURES+1)); }
$PY - "$TMP/loss.svg" "$S" <<'PY' || { echo "FAIL: the SVG"; FAILURES=$((FAILURES+1)); }
import json, sys, xml.etree.ElementTree as ET
ns = {"s": "http://www.w3.org/2000/svg"}
root = ET.parse(sys.argv[1]).getroot()
assert root.tag == "{http://www.w3.org/2000/svg}svg", root.tag
names = ["lr1e-3", "lr3e-3", "z3"]
for cls in ("train", "eval"):
    lines = root.findall(f".//s:polyline[@class='{cls}']", ns)
    assert sorted(l.get("data-run") for l in lines) == names, (cls, [l.get("data-run") for l in lines])
    for l in lines:
        pts = [tuple(map(float, p.split(","))) for p in l.get("points").split()]
        steps = [json.loads(x)["step"] for x in open(f"{sys.argv[2]}/{l.get('data-run')}/metrics.jsonl")
                 if cls == "train" or "eval_loss" in json.loads(x)]
        assert len(pts) == len(steps), (cls, l.get("data-run"), len(pts), len(steps))
        assert all(a[0] < b[0] for a, b in zip(pts, pts[1:])), "x must grow with the step"
        assert (l.get("stroke-dasharray") is not None) == (cls == "eval")
colours = {l.get("data-run"): l.get("stroke") for l in root.findall(".//s:polyline", ns)}
assert len(set(colours.values())) == 3, colours
for axis in ("x-axis", "y-axis"):
    g = root.find(f".//s:g[@class='{axis}']", ns)
    assert g is not None and g.find("s:line[@class='axis']", ns) is not None, axis
    assert len(g.findall("s:text[@class='tick-label']", ns)) >= 3, axis
labels = [t.text for t in root.findall(".//s:text[@class='axis-label']", ns)]
assert labels == ["step", "loss"], labels
legend = [t.text for t in root.findall(".//s:g[@class='legend']/s:text[@class='legend-label']", ns)]
assert legend == names, legend
PY
expect_fail 2 "plot is an SVG file" plot "$S" --out "$TMP/loss.png"

# A finished run is refused: exit 2, what/where/what to do, nothing touched.
# (.lock, the run directory's lock file, names whichever job held it last.)
before=$(cd "$S/lr1e-3" && find . -type f ! -name .lock -exec md5sum {} + | sort)
expect_fail 2 "lr1e-3: the run directory already holds a finished run \(completed after 6 of 6 steps\); nothing was changed. Pass --overwrite .*--resume auto" \
  train "$R" "${common[@]}" optimizer.lr=1e-3 --run-dir "$S/lr1e-3"
after=$(cd "$S/lr1e-3" && find . -type f ! -name .lock -exec md5sum {} + | sort)
[ "$before" = "$after" ] || { echo "FAIL: the refused run's files changed"; diff <(echo "$before") <(echo "$after"); FAILURES=$((FAILURES+1)); }
finish
