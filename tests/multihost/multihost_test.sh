#!/usr/bin/env bash
# fdtrain across simulated hosts (issue 40; tests/multihost/hosts.bash): Open MPI starts its
# daemons in 2 network namespaces through an rsh agent, as it would over ssh, and the ranks of
# different hosts talk TCP over the test's bridge.
#  - placement: ranks 0-1 on host 1 and 2-3 on host 2 (mpirun's by-slot mapping of the
#    hostfile), each host with its own hostname; the bytes through each host's link counted;
#  - ZeRO stages 0-3 across 2 hosts x 2 ranks give the weights_sha256 of the same run on one
#    host with 4 ranks, bitwise (fdtrain's collectives sum in a fixed, rank-ordered way that does
#    not depend on where the ranks run: lib/dist/communicator.h); summary.json's `network` block
#    finds 2 nodes (1 on one host) and its bytes per step, in all and across nodes, are those of
#    `fdtrain estimate --nodes 2`;
#  - the pipeline with one stage per host (parallel.pipeline 2: stage 0 on host 1, stage 1 on
#    host 2) gives the one-host run's weights, bitwise;
#  - resume across host counts: a checkpoint of 2 hosts x 2 ranks resumed on 1 host x 2 ranks and
#    on 2 hosts x 1 rank continues with the uninterrupted run's losses (1e-5 relative: another
#    world size sums in another order);
#  - hostile: a hostfile naming a host that does not answer (the agent answers as ssh does for a
#    host without a route) ends mpirun with that message at once, no hang;
#  - hostile: another fdtrain build on one host (a copy with another build ID bound over the
#    binary's path in that host's mount namespace), and another recipe file there: refused at
#    start on every rank with exit 2, naming the rank, its host and what differs;
#  - faults across hosts (dist.timeout_s 10): host 2's link taken down mid-run ends every fdtrain
#    process on both hosts within the timeout, naming the collective and the group's ranks by
#    host; host 2's processes killed ends mpirun at once; the newest checkpoint of each resumes on
#    the remaining host (2 ranks) and on both hosts with a straight run's losses;
#  - a save stalled on host 2 past dist.timeout_s: the job ends, naming the checkpoint writer's
#    communicator and the hosts; the previous checkpoint stays `latest`;
#  - hostile: host 2's recipe with other ZeRO settings (zero.quantized_gradients): refused the same;
#    3 ranks (2 + 1) with dist.hierarchical: refused at start (exit 2) naming the hosts' ranks;
#  - dist.hierarchical across the hosts (stages 2, 3): the one-host run's losses to 1e-5, fewer bytes
#    across; ZeRO++ (qwZ + hpZ + qgZ int4 + dist.hierarchical): bytes per step, in all and across,
#    as `estimate --nodes 2` counts, >= 3.5x fewer across than ZeRO-3, final loss within 1%;
#  - shaped links (tc token bucket, 200 Mbit/s each way): in place, and ZeRO-3 still bitwise.
# Needs root and network namespaces; otherwise it says why and exits 77 (ctest: skipped).
#
#   tests/multihost/multihost_test.sh FDTRAIN
set -u
FDTRAIN=$(realpath "$1")
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/hosts.bash"
if ! why=$(hosts_supported); then
  echo "SKIPPED: simulated hosts need root and network namespaces: $why"
  exit 77
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
FAILURES=0
fail() { echo "FAIL: $*"; FAILURES=$((FAILURES + 1)); }
hosts_up 2 || { echo "FAIL: could not make the simulated hosts"; exit 1; }
TMP=$HOSTS_DIR/work
mkdir -p "$TMP"
json() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }

RECIPE='model: {n_layer: 2, n_head: 2, d_model: 32, vocab_size: 256, max_seq_len: 32}
data: {format: text, train: [/usr/share/games/fortunes/fortunes], val_fraction: 0.0, seq_len: 16}
batch: {micro: 2, global: 8}
optimizer: {lr: 1.0e-3}
steps: 10
checkpoint: {every: 5}
logging: {every: 1, sample_tokens: 0}'
R=$TMP/r.yaml
echo "$RECIPE" >"$R"

# on_hosts NAME N ARGS...: N ranks over the hosts (2 per host); local NAME N ARGS...: on this one.
on_hosts() {
  local name=$1 n=$2; shift 2
  timeout 180 mpirun "${MPIRUN_HOSTS[@]}" -n "$n" "$FDTRAIN" train "$R" "$@" --run-dir "$TMP/$name" \
    --no-progress >"$TMP/$name.log" 2>&1 || { fail "$name: exit $?"; tail -5 "$TMP/$name.log" | sed 's/^/    /'; }
}
local_run() {
  local name=$1 n=$2; shift 2
  timeout 180 mpirun --oversubscribe --bind-to none -n "$n" "$FDTRAIN" train "$R" "$@" \
    --run-dir "$TMP/$name" --no-progress >"$TMP/$name.log" 2>&1 ||
    { fail "$name: exit $?"; tail -5 "$TMP/$name.log" | sed 's/^/    /'; }
}
same_weights() {  # same_weights A B
  local a b
  a=$(json "$TMP/$1/summary.json" weights_sha256 2>/dev/null) b=$(json "$TMP/$2/summary.json" weights_sha256 2>/dev/null)
  if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "ok: $2: weights ${a:0:16}, bitwise $1's"
  else fail "$2: weights '$b' vs $1's '$a'"; fi
}

# 1. Placement: 4 ranks, 2 per host, each host its own name.
placed=$(timeout 60 mpirun "${MPIRUN_HOSTS[@]}" -n 4 sh -c 'echo "$OMPI_COMM_WORLD_RANK $(hostname)"' 2>&1 | sort)
want=$(printf '0 %sh1\n1 %sh1\n2 %sh2\n3 %sh2' "$HOSTS_TAG" "$HOSTS_TAG" "$HOSTS_TAG" "$HOSTS_TAG")
[ "$placed" = "$want" ] && echo "ok: ranks 0-1 on ${HOSTS_TAG}h1, 2-3 on ${HOSTS_TAG}h2" ||
  fail "placement: $(echo "$placed" | tr '\n' ';')"

# 2. ZeRO stages 0-3: 2 hosts x 2 ranks against 1 host x 4 ranks, bitwise.
for z in 0 1 2 3; do
  before=$(hosts_link_bytes)
  on_hosts z$z 4 zero.stage=$z
  after=$(hosts_link_bytes)
  local_run z${z}l 4 zero.stage=$z
  same_weights z${z}l z$z
  [ $((after - before)) -gt 100000 ] && echo "    stage $z: $((after - before)) bytes through the hosts' links" ||
    fail "z$z: only $((after - before)) bytes through the links (did the ranks talk over the network?)"
  [ "$(json "$TMP/z$z/run.json" host)" = "${HOSTS_TAG}h1" ] || fail "z$z: run.json's host is not ${HOSTS_TAG}h1"
  # The network block: 2 nodes found, every group's bytes per step and those across nodes equal
  # to `fdtrain estimate --nodes 2`'s; on one host none cross.
  "$FDTRAIN" estimate "$R" zero.stage=$z --world-size 4 --nodes 2 --json >"$TMP/z$z.est.json" 2>&1 ||
    fail "z$z: estimate --nodes 2"
  if python3 - "$TMP/z$z/summary.json" "$TMP/z${z}l/summary.json" "$TMP/z$z.est.json" "$z" <<'PY'
import json, sys
hosts, one, est = (json.load(open(p)) for p in sys.argv[1:4])
z = int(sys.argv[4])
n, n1 = hosts["network"], one["network"]
st = next(s for s in est["stages"] if s["stage"] == z)
assert n["nodes"] == 2 and n1["nodes"] == 1, (n, n1)
assert n["bytes_per_step"] == st["network_bytes_per_step"] == n1["bytes_per_step"], (n, st, n1)
assert n["inter_node_bytes_per_step"] == st["inter_node_bytes_per_step"] > 0, (n, st)
assert n1["inter_node_bytes_per_step"] == 0, n1
print(f"    stage {z}: {n['bytes_per_step']} bytes per step and rank, {n['inter_node_bytes_per_step']} "
      "across nodes (the largest rank), as estimate --nodes 2 counts")
PY
  then echo "ok: z$z: summary.json's network block (2 nodes) is the estimate's"
  else fail "z$z: network block vs estimate --nodes 2"; fi
done

# 3. A pipeline with one stage per host.
on_hosts pipe 4 parallel.pipeline=2 batch.accumulation=2
local_run pipel 4 parallel.pipeline=2 batch.accumulation=2
same_weights pipel pipe

# 4. Resume across host counts: z2's checkpoint of step 5 on one host (2 ranks, accumulation 2)
# and on both hosts with one rank each: steps 6-10 as z2's.
continues() {  # continues NAME: steps 6-10 of NAME against z2's, 1e-5 relative
  if python3 - "$TMP/z2/metrics.jsonl" "$TMP/$1/metrics.jsonl" <<'PY'
import json, sys
a, b = ({m["step"]: m["loss"] for m in map(json.loads, open(p)) if "grad_norm" in m} for p in sys.argv[1:])
steps = [s for s in a if s > 5]
assert len(steps) == 5 and all(s in b for s in steps), (sorted(a), sorted(b))
worst = max(abs(b[s] - a[s]) / abs(a[s]) for s in steps)
print(f"    steps 6-10: largest relative difference {worst:.3g}")
assert worst <= 1e-5, worst
PY
  then echo "ok: $1: continues z2 (2 hosts x 2 ranks) to 1e-5"; else fail "$1: does not continue z2"; fi
}
local_run r1 2 zero.stage=2 batch.accumulation=2 --resume "$TMP/z2/checkpoints/step_00000005"
continues r1
printf '%s slots=1\n%s slots=1\n' "$(host_addr 1)" "$(host_addr 2)" >"$HOSTS_DIR/hostfile1"
timeout 180 mpirun "${MPIRUN_HOSTS[@]/$HOSTFILE/$HOSTS_DIR/hostfile1}" -n 2 "$FDTRAIN" train "$R" \
  zero.stage=2 batch.accumulation=2 --resume "$TMP/z2/checkpoints/step_00000005" --run-dir "$TMP/r2" \
  --no-progress >"$TMP/r2.log" 2>&1 || { fail "r2: exit $?"; tail -5 "$TMP/r2.log" | sed 's/^/    /'; }
continues r2

# 5. A host that does not answer: mpirun ends with the launcher's message, no hang.
printf '%s slots=2\n198.18.1.250 slots=2\n' "$(host_addr 1)" >"$HOSTS_DIR/hostfile2"
start=$(date +%s)
out=$(timeout 120 mpirun "${MPIRUN_HOSTS[@]/$HOSTFILE/$HOSTS_DIR/hostfile2}" -n 4 "$FDTRAIN" train "$R" \
  --run-dir "$TMP/unreachable" --no-progress 2>&1)
rc=$? secs=$(($(date +%s) - start))
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -q "No route to host" <<<"$out" && [ "$secs" -le 60 ]; then
  echo "ok: unreachable host: exit $rc after ${secs}s, the launcher names it"
else
  fail "unreachable host: exit $rc after ${secs}s"; echo "$out" | tail -5 | sed 's/^/    /'
fi

# 6. Another fdtrain build on host 2 (a copy whose build ID differs, at the same path), and
# another recipe there (another optimizer.lr in the file at the recipe's path): refused at start on
# every rank, exit 2, naming rank 2 on host 2 and what differs; no run directory.
refused_on_hosts() {  # refused_on_hosts NAME PATTERN
  local out rc
  out=$(timeout 120 mpirun "${MPIRUN_HOSTS[@]}" -n 4 "$FDTRAIN" train "$R" \
        --run-dir "$TMP/$1" --no-progress 2>&1)
  rc=$?
  if [ "$rc" -eq 2 ] && grep -Eq -- "$2" <<<"$out" && [ ! -e "$TMP/$1" ]; then
    echo "ok: $1: exit 2, /$2/"
  else
    fail "$1: exit $rc"; echo "$out" | grep -v '^--\|^$' | head -4 | sed 's/^/    /'
  fi
}
cp "$FDTRAIN" "$HOSTS_DIR/fdtrain.other"
python3 - "$HOSTS_DIR/fdtrain.other" "$(readelf -n "$FDTRAIN" | awk '/Build ID/ { print $3 }')" <<'PY'
import sys
path, hexid = sys.argv[1], sys.argv[2]
data = bytearray(open(path, "rb").read())
old = bytes.fromhex(hexid)
at = data.find(old)
assert at >= 0 and data.find(old, at + 1) < 0, "the build ID once in the file"
data[at] ^= 0xFF
open(path, "wb").write(data)
PY
host_bind 2 "$HOSTS_DIR/fdtrain.other" "$FDTRAIN"
refused_on_hosts otherbuild "rank 2 \(host ${HOSTS_TAG}h2\) runs fdtrain [0-9.]+ \(build [0-9a-f]{40}\) but rank 0 \(host ${HOSTS_TAG}h1\) runs fdtrain [0-9.]+ \(build [0-9a-f]{40}\): every rank must run the same fdtrain build"
host_unbind 2
sed 's/^optimizer: {lr: 1.0e-3}/optimizer: {lr: 2.0e-3}/' "$R" >"$HOSTS_DIR/r.other.yaml"
host_bind 2 "$HOSTS_DIR/r.other.yaml" "$R"
refused_on_hosts otherrecipe "rank 2 \(host ${HOSTS_TAG}h2\) resolved another recipe than rank 0 \(host ${HOSTS_TAG}h1\): 1 field\(s\) differ: optimizer.lr \(0.001 on rank 0\)"
host_unbind 2
# Mismatched ZeRO settings: host 2's recipe turns ZeRO++'s quantized gradients on.
printf '%s\nzero: {stage: 3, quantized_gradients: int4}\n' "$RECIPE" >"$HOSTS_DIR/r.zero.yaml"
printf '%s\nzero: {stage: 3}\n' "$RECIPE" >"$TMP/rz.yaml"
host_bind 2 "$HOSTS_DIR/r.zero.yaml" "$TMP/rz.yaml"
R_SAVED=$R
R=$TMP/rz.yaml
refused_on_hosts otherzero "rank 2 \(host ${HOSTS_TAG}h2\) resolved another recipe than rank 0 \(host ${HOSTS_TAG}h1\): 1 field\(s\) differ: zero.quantized_gradients \(none on rank 0\)"
R=$R_SAVED
host_unbind 2

# 7. Faults across hosts (dist.timeout_s 10): host 2's link taken down mid-run, then host 2's
# processes all killed mid-run. The link: every fdtrain process on both hosts ends within the
# timeout, the message naming its collective and the group's ranks by host (mpirun itself waits
# for host 2's daemon until the link is back: the launcher's TCP connection, not fdtrain's). The
# kill: mpirun ends at once. After each, the newest checkpoint resumes on host 1 alone (2 ranks,
# accumulation 2: the same 8 sequences per step) and on both hosts again, with the losses of a
# run that was never interrupted.
FAULT="dist.timeout_s=10 steps=100000 checkpoint.every=20 logging.every=1"
h_procs() {  # fdtrain processes on host I
  local p n=0
  for p in $(ip netns pids "${HOSTS_TAG}h$1"); do
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = fdtrain ] && n=$((n + 1))
  done
  echo "$n"
}
newest_ckpt() { ls -d "$TMP/$1"/checkpoints/step_* 2>/dev/null | sort | tail -1; }
fault_run() {  # fault_run NAME link|kill: starts the run, breaks host 2 after its first checkpoint
  local name=$1 how=$2 pid t
  timeout 180 mpirun "${MPIRUN_HOSTS[@]}" -n 4 "$FDTRAIN" train "$R" zero.stage=2 $FAULT \
    --run-dir "$TMP/$name" --no-progress >"$TMP/$name.log" 2>&1 &
  pid=$!
  for ((t = 0; t < 600; t++)); do [ -n "$(newest_ckpt "$name")" ] && break; sleep 0.1; done
  if [ -z "$(newest_ckpt "$name")" ]; then  # not started in 60 s: nothing to break
    kill "$pid" 2>/dev/null
    wait "$pid"
    echo "no-checkpoint 0"
    return
  fi
  sleep 1
  local start=$(date +%s)
  if [ "$how" = link ]; then host_link 2 down; else kill -9 $(ip netns pids "${HOSTS_TAG}h2"); fi
  # Every fdtrain process gone within the timeout (and a margin for the abort).
  for ((t = 0; t < 40; t++)); do
    [ "$(h_procs 1)" = 0 ] && [ "$(h_procs 2)" = 0 ] && break
    sleep 1
  done
  local gone=$(($(date +%s) - start))
  [ "$how" = link ] && host_link 2 up
  wait "$pid"
  local rc=$?
  echo "$rc $gone"
}
read -r rc gone <<<"$(fault_run linkdown link)"
if [ "$rc" != no-checkpoint ] && [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$gone" -le 30 ] &&
   grep -q "did not complete within 10 s.*the group's ranks: ranks 0-1 on host ${HOSTS_TAG}h1, ranks 2-3 on host ${HOSTS_TAG}h2" "$TMP/linkdown.log"; then
  echo "ok: linkdown: every fdtrain process ended ${gone}s after the link went down (timeout 10 s), naming the group's ranks by host; mpirun exit $rc"
else
  fail "linkdown: exit $rc, processes gone after ${gone}s"; grep -v "^--\|^$\|step " "$TMP/linkdown.log" | tail -5 | sed 's/^/    /'
fi
read -r rc gone <<<"$(fault_run hostkill kill)"
if [ "$rc" != no-checkpoint ] && [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$gone" -le 30 ]; then
  echo "ok: hostkill: host 2's processes killed, every fdtrain process ended after ${gone}s; mpirun exit $rc"
else
  fail "hostkill: exit $rc, processes gone after ${gone}s"; grep -v "^--\|^$\|step " "$TMP/hostkill.log" | tail -5 | sed 's/^/    /'
fi
# Resume: the newest checkpoint of each, 5 more steps on 1 host x 2 ranks and on 2 hosts x 2,
# against a straight run to the same step.
for name in linkdown hostkill; do
  ck=$(newest_ckpt "$name")
  [ -n "$ck" ] || { fail "$name: no checkpoint to resume"; continue; }
  at=$((10#${ck##*step_}))
  end=$((at + 5))
  local_run "${name}1" 2 zero.stage=2 batch.accumulation=2 steps=$end checkpoint.every=0 logging.every=1 \
    --resume "$ck"
  on_hosts "${name}2" 4 zero.stage=2 steps=$end checkpoint.every=0 logging.every=1 --resume "$ck"
  on_hosts "${name}s" 4 zero.stage=2 steps=$end checkpoint.every=0 logging.every=1
  if python3 - "$TMP/${name}s/metrics.jsonl" "$TMP/${name}1/metrics.jsonl" "$TMP/${name}2/metrics.jsonl" "$at" <<'PY'
import json, sys
at = int(sys.argv[4])
def losses(p):
    return {m["step"]: m["loss"] for m in map(json.loads, open(p)) if "grad_norm" in m and m["step"] > at}
s, one, two = (losses(p) for p in sys.argv[1:4])
assert len(s) == 5 and sorted(one) == sorted(s) == sorted(two), (sorted(s), sorted(one), sorted(two))
w1 = max(abs(one[k] - s[k]) / abs(s[k]) for k in s)
w2 = max(abs(two[k] - s[k]) / abs(s[k]) for k in s)
print(f"    from step {at}: 1 host {w1:.3g}, 2 hosts {w2:.3g} largest relative difference")
assert w1 <= 1e-5 and w2 == 0.0, (w1, w2)
PY
  then echo "ok: $name: its checkpoint of step $at resumes on 1 host (1e-5) and on 2 hosts (bitwise) as the straight run"
  else fail "$name: resume from step $at"; fi
done

# 7b. A save that stalls on host 2 (its rank 2 takes 20 s to write its shard of step 10: the
# ckptslow fault) with dist.timeout_s 10: the save's collective on the other ranks times out
# and ends the job within the timeout, the message naming the checkpoint writer's communicator
# and the group's ranks by host; step 5's checkpoint stays `latest` and verifies.
start=$(date +%s)
FDTRAIN_FAULT=ckptslow:rank=2:step=10:ms=20000 timeout 120 mpirun "${MPIRUN_HOSTS[@]}" \
  -x FDTRAIN_FAULT -n 4 "$FDTRAIN" train "$R" dist.timeout_s=10 steps=30 --run-dir "$TMP/slowsave" \
  --no-progress >"$TMP/slowsave.log" 2>&1
rc=$? secs=$(($(date +%s) - start))
latest=$(cat "$TMP/slowsave/checkpoints/latest" 2>/dev/null)
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$secs" -le 40 ] && [ "$latest" = step_00000005 ] &&
   grep -q "on the checkpoint writer's communicator (rank [0-3] of 4) did not complete within 10 s.*the group's ranks: ranks 0-1 on host ${HOSTS_TAG}h1, ranks 2-3 on host ${HOSTS_TAG}h2" "$TMP/slowsave.log" &&
   "$FDTRAIN" ckpt inspect "$TMP/slowsave/checkpoints/step_00000005" >"$TMP/slowsave.inspect" 2>&1; then
  echo "ok: slowsave: a save stalled on host 2 ends the job after ${secs}s (exit $rc), naming the writer's communicator and the hosts; latest is step 5 and verifies"
else
  fail "slowsave: exit $rc after ${secs}s, latest '$latest'"
  grep -v "^--\|^$\|step " "$TMP/slowsave.log" | tail -5 | sed 's/^/    /'
fi

# 8. Node-aware collectives and ZeRO++ across the hosts. dist.hierarchical (stage 2 and 3): the
# one-host run's losses to 1e-5 (sums grouped by host), fewer bytes across; ZeRO++ (all three
# switches, with dist.hierarchical) against plain ZeRO-3 on the same hosts: its network block is
# estimate --nodes 2's, at least 3.5x fewer bytes across hosts, the final loss within 1%.
for z in 2 3; do
  on_hosts h$z 4 zero.stage=$z dist.hierarchical=true
  if python3 - "$TMP/z${z}l" "$TMP/z$z" "$TMP/h$z" <<'PY'
import json, sys
one, flat, hier = sys.argv[1:4]
loss = lambda d: {m["step"]: m["loss"] for m in map(json.loads, open(d + "/metrics.jsonl")) if "grad_norm" in m}
a, b = loss(one), loss(hier)
assert sorted(a) == sorted(b) and len(a) == 10, (sorted(a), sorted(b))
worst = max(abs(b[s] - a[s]) / abs(a[s]) for s in a)
across = lambda d: json.load(open(d + "/summary.json"))["network"]["inter_node_bytes_per_step"]
assert worst <= 1e-5 and across(hier) < across(flat), (worst, across(hier), across(flat))
print(f"    losses within {worst:.3g} of one host's; {across(hier)} bytes across per step (flat {across(flat)})")
PY
  then echo "ok: h$z: dist.hierarchical across hosts"
  else fail "h$z: dist.hierarchical across hosts"; fi
done
# Hostile: 3 ranks (2 on host 1, 1 on host 2) cannot split by host: refused at start, exit 2.
out=$(timeout 120 mpirun "${MPIRUN_HOSTS[@]}" -n 3 "$FDTRAIN" train "$R" dist.hierarchical=true \
      batch.global=6 --run-dir "$TMP/uneven" --no-progress 2>&1)
rc=$?
if [ "$rc" -eq 2 ] && grep -q "dist.hierarchical: node-aware collectives need every host to run the same number of the data-parallel group's ranks, consecutively, but the group's ranks are ranks 0-1 on host ${HOSTS_TAG}h1, rank 2 on host ${HOSTS_TAG}h2" <<<"$out"; then
  echo "ok: uneven: 2 + 1 ranks refused with dist.hierarchical, naming the hosts"
else
  fail "uneven: exit $rc"; echo "$out" | grep -v '^--\|^$' | head -4 | sed 's/^/    /'
fi
ZPP="zero.stage=3 zero.quantized_weights=true zero.hierarchical_partition=true zero.quantized_gradients=int4 dist.hierarchical=true"
on_hosts zpp 4 $ZPP
"$FDTRAIN" estimate "$R" $ZPP --world-size 4 --nodes 2 --json >"$TMP/zpp.est.json" 2>&1 || fail "zpp: estimate"
if python3 - "$TMP/z3/summary.json" "$TMP/zpp/summary.json" "$TMP/zpp.est.json" <<'PY'
import json, sys
plain, zpp, est = (json.load(open(p)) for p in sys.argv[1:4])
st = next(s for s in est["stages"] if s["stage"] == 3)
n, p = zpp["network"], plain["network"]
assert n["bytes_per_step"] == st["network_bytes_per_step"], (n, st)
assert n["inter_node_bytes_per_step"] == st["inter_node_bytes_per_step"], (n, st)
ratio = p["inter_node_bytes_per_step"] / n["inter_node_bytes_per_step"]
drift = abs(zpp["final_loss"] - plain["final_loss"]) / plain["final_loss"]
print(f"    {n['inter_node_bytes_per_step']} bytes across per step ({ratio:.1f}x fewer than ZeRO-3's "
      f"{p['inter_node_bytes_per_step']}), as estimated; final loss {zpp['final_loss']:.4f} vs {plain['final_loss']:.4f}")
assert ratio >= 3.5 and drift <= 0.01, (ratio, drift)
PY
then echo "ok: zpp: ZeRO++ across hosts"
else fail "zpp: ZeRO++ across hosts"; fi

# 9. Shaped links (a token bucket of 200 Mbit/s each way on every host's link, as the ZeRO++
# bench uses): the qdiscs are in place and ZeRO-3 still gives the one-host weights.
saved=$(json "$TMP/z3l/summary.json" weights_sha256)
hosts_down
hosts_up 2 200mbit || { echo "FAIL: could not make the shaped hosts"; exit 1; }
TMP=$HOSTS_DIR/work
mkdir -p "$TMP"
R=$TMP/r.yaml
echo "$RECIPE" >"$R"
shaped=$(tc qdisc show dev "${HOSTS_TAG}v1"; tc -n "${HOSTS_TAG}h2" qdisc show dev eth0)
if [ "$(grep -c "tbf .*rate 200Mbit" <<<"$shaped")" = 2 ]; then echo "ok: links shaped: tbf 200Mbit"
else fail "no tbf qdisc: $shaped"; fi
on_hosts z3s 4 zero.stage=3
got=$(json "$TMP/z3s/summary.json" weights_sha256 2>/dev/null)
[ -n "$saved" ] && [ "$got" = "$saved" ] && echo "ok: z3s: weights ${got:0:16} over the shaped links, bitwise the one-host run's" ||
  fail "z3s: weights '$got' vs '$saved'"

hosts_down
[ "$FAILURES" -eq 0 ] && echo "all passed" || echo "$FAILURES failure(s)"
[ "$FAILURES" -eq 0 ]
