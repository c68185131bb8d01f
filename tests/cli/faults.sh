#!/usr/bin/env bash
# A rank that is killed, stalls or throws ends the whole job with a non-zero
# status within 60 s and a message naming the rank (FDTRAIN_FAULT injects the
# fault; dist.timeout_s bounds how long peers wait for a stalled rank).
source "$(dirname "$0")/common.bash"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
R=$TMP/r.yaml
write_recipe "$R"
sed -i 's/^steps: 3/steps: 100000/' "$R"   # would run for a long time without the fault
WORST=0

# fault_case NAME FAULT PATTERN [overrides...]
fault_case() {
  local name=$1 fault=$2 pattern=$3
  shift 3
  local start end out rc
  start=$(date +%s.%N)
  out=$(FDTRAIN_FAULT=$fault timeout 90 mpirun --oversubscribe --bind-to none -n 2 \
        "$FDTRAIN" train "$R" "$@" --run-dir "$TMP/$name" --no-progress 2>&1)
  rc=$?
  end=$(date +%s.%N)
  local secs
  secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
  WORST=$(awk -v a="$WORST" -v b="$secs" 'BEGIN { print (b > a) ? b : a }')
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then
    echo "FAIL: $name: exit $rc after ${secs}s"; echo "$out" | tail -20 | sed 's/^/    /'
    FAILURES=$((FAILURES + 1)); return
  fi
  if awk -v s="$secs" 'BEGIN { exit !(s > 60) }'; then
    echo "FAIL: $name: took ${secs}s (> 60 s)"; FAILURES=$((FAILURES + 1)); return
  fi
  if ! grep -Eq -- "$pattern" <<<"$out"; then
    echo "FAIL: $name: no line matches /$pattern/"; echo "$out" | tail -20 | sed 's/^/    /'
    FAILURES=$((FAILURES + 1)); return
  fi
  echo "ok: $name: exit $rc after ${secs}s, /$pattern/"
}

fault_case kill "kill:rank=1:step=3" "rank 1|process rank 1|signal 9|Killed"
fault_case stall "stall:rank=1:step=3" "rank 0 .*did not complete within 5 s" dist.timeout_s=5
fault_case throw "throw:rank=0:step=2" "rank 0 failed at step 3: .*injected fault"
fault_case throw1 "throw:rank=1:step=2" "rank 1 failed at step 3: .*injected fault"
echo "worst time to exit: ${WORST}s"

# How each run ended, in its run directory: a failure (a throw on either rank, or the timeout of
# the rank that waited for a stalled peer, through the communicator's abort hook) leaves
# summary.json with status failed and the rank that recorded it; a rank killed outright leaves
# none, and `fdtrain runs` reports the run as killed (nobody holds its lock).
summary_is() {  # summary_is NAME RANK PATTERN
  if python3 - "$TMP/$1/summary.json" "$2" "$3" <<'PY'
import json, re, sys
s = json.load(open(sys.argv[1]))
assert s["status"] == "failed" and s["exit_reason"] == "error", s
assert s["failed_rank"] == int(sys.argv[2]), s["failed_rank"]
assert re.search(sys.argv[3], s["error"]), s["error"]
PY
  then echo "ok: $1: summary.json status failed, failed_rank $2"; else
    echo "FAIL: $1: summary.json"; cat "$TMP/$1/summary.json" 2>&1 | head -5 | sed 's/^/    /'
    FAILURES=$((FAILURES + 1))
  fi
}
summary_is stall 0 "did not complete within 5 s"
summary_is throw 0 "injected fault"
summary_is throw1 1 "injected fault"
status=$("$FDTRAIN" runs "$TMP/kill" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["status"])')
[ "$status" = killed ] && [ ! -e "$TMP/kill/summary.json" ] && echo "ok: kill: no summary, runs says killed" \
  || { echo "FAIL: kill: status '$status'"; FAILURES=$((FAILURES + 1)); }
finish
