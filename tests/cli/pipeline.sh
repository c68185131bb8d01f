#!/usr/bin/env bash
# Pipeline parallelism end to end (issue 22, docs/RECIPE.md `parallel`), a
# tiny GPT-2 (its head tied to the embedding), 4 blocks:
#  - resume across layouts: a P=2 x D=2 run (mpirun -n 4, 4 micro-batches)
#    checkpointed at step 4 and resumed at P=1 x D=2 (-n 2), and at P=2 x D=2
#    with another partition and the gpipe schedule, continues bitwise
#    (weights_sha256, the losses of steps 5-8); resumed at P=1 x D=4 and
#    P=4 x D=1 (-n 4, accumulation 2 and 8: the same global batch) it sees the
#    same data, and its losses match to 1e-5 relative (the documented bound at
#    another data-parallel width D: the sums over replicas run in another
#    order), bitwise what the same resumes give without a pipeline (D=2 to
#    D=4; P=4 x D=1 against P=1 x D=1);
#  - faults on the send/recv path: a stage rank killed or stalled at step 3
#    ends the job within 60 s, naming the rank (the stall: the timed-out
#    send_recv and its peer), and summary.json / `fdtrain runs` say how;
#  - bad input under mpirun: a world P does not divide, P > n_layer, a
#    partition list that does not sum to n_layer, ZeRO-3 with a pipeline: exit
#    2, one message naming the key, no run directory;
#  - summary.json's pipeline block: its fields and types, and the exact bytes
#    each stage sends per step;
#  - NVMe optimizer offload under a pipeline (issue 35): P=2 at -n 2 (GPT-2,
#    tied head, ZeRO-2) and P=2 x D=2 at -n 4 (Llama, bf16, ZeRO-1) give the
#    weights_sha256 of the same offloaded run without a pipeline (one file per
#    rank: the stages once shared one and hung, dist.timeout_s short here so
#    that a regression fails fast), and leave no state file; a pipeline whose
#    rank 0 finds its file in use by another job exits at once (its neighbour
#    once waited for it until dist.timeout_s);
#  - a world with a factor 3 (issue 35): P=3 at -n 3 and P=3 x D=2 at -n 6
#    complete (they once aborted in the summary) and resume with --resume auto
#    (steps 2 -> 4) to the weights and losses of the unpipelined run at D;
#    summary.json's model_state_bytes_estimate is rank 0's stage's, its
#    measured peaks to the byte.
source "$(dirname "$0")/common.bash"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPI=(timeout 120 mpirun --oversubscribe --bind-to none)
fail() { echo "FAIL: $*"; FAILURES=$((FAILURES + 1)); }
json() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))
for k in sys.argv[2].split("."): d=d[int(k)] if isinstance(d,list) else d[k]
print(d)' "$1" "$2"; }
# losses RUN FROM: "step loss" for every step > FROM in RUN/metrics.jsonl.
losses() { python3 -c 'import json,sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    if "loss" in m and m.get("step", 0) > int(sys.argv[2]): print(m["step"], repr(m["loss"]))' \
  "$1/metrics.jsonl" "$2"; }

R=$TMP/r.yaml
write_recipe "$R"
sed -i 's/^steps: 3/steps: 8/; s/^  n_layer: 1/  n_layer: 4/' "$R"
# train N ARGS...: mpirun -n N fdtrain train $R ARGS --no-progress
train() { local n=$1; shift; "${MPI[@]}" -n "$n" "$FDTRAIN" train "$R" "$@" --no-progress; }

# 1. Resume across layouts.
P2=(parallel.pipeline=2 batch.accumulation=4 checkpoint.every=4)
train 4 "${P2[@]}" --run-dir "$TMP/p2d2" >"$TMP/p2d2.log" 2>&1 || { fail "P=2 x D=2 run"; tail -5 "$TMP/p2d2.log"; }
CK=$TMP/p2d2/checkpoints/step_00000004
straight=$(json "$TMP/p2d2/summary.json" weights_sha256)
# resumed NAME EXACT N ARGS...: resume $CK at mpirun -n N with ARGS into $TMP/NAME; EXACT=1:
# weights_sha256 and losses bitwise, else the losses to 1e-5 relative.
resumed() {
  local name=$1 exact=$2 n=$3; shift 3
  train "$n" "$@" checkpoint.every=4 --resume "$CK" --run-dir "$TMP/$name" >"$TMP/$name.log" 2>&1 \
    || { fail "$name: resume"; tail -5 "$TMP/$name.log"; return; }
  local got la lb
  got=$(json "$TMP/$name/summary.json" weights_sha256)
  la=$(losses "$TMP/p2d2" 4); lb=$(losses "$TMP/$name" 4)
  if [ "$exact" = 1 ]; then
    if [ -n "$straight" ] && [ "$got" = "$straight" ] && [ "$la" = "$lb" ] && [ "$(wc -l <<<"$la")" -eq 4 ]; then
      echo "ok: $name: resumed at step 4, weights ${got:0:16} and the losses of steps 5-8 bitwise the P=2 x D=2 run's"
    else
      fail "$name: weights $got vs $straight"; diff <(echo "$la") <(echo "$lb") | head -9 | sed 's/^/    /'
    fi
    return
  fi
  if awk 'NR == FNR { a[$1] = $2; next } ($1 in a) { n++; r = $2 - a[$1]; if (r < 0) r = -r; r /= (a[$1] < 0 ? -a[$1] : a[$1]);
        if (r > max) max = r; if (r > 1e-5) bad++ }
        END { printf "    %d steps compared, largest relative loss difference %.3g\n", n, max; exit !(n == 4 && bad == 0) }' \
      <(echo "$la") <(echo "$lb"); then
    echo "ok: $name: resumed at step 4, the losses of steps 5-8 match the P=2 x D=2 run's to 1e-5 relative" \
         "(weights $([ "$got" = "$straight" ] && echo bitwise equal || echo "${got:0:16} vs ${straight:0:16}"))"
  else
    fail "$name: losses of steps 5-8 differ"; paste <(echo "$la") <(echo "$lb") | sed 's/^/    /'
  fi
}
resumed p1d2 1 2 parallel.pipeline=1 batch.accumulation=4
resumed p2d2_gpipe 1 4 parallel.pipeline=2 batch.accumulation=4 "parallel.partition=[3, 1]" parallel.schedule=gpipe
resumed p1d4 0 4 parallel.pipeline=1 batch.accumulation=2
resumed p4d1 0 4 parallel.pipeline=4 batch.accumulation=8
# What differs at another D is what differs without a pipeline: a P=1 x D=2 run (bitwise the
# P=2 x D=2 run) resumed at D=4 from its own step-4 checkpoint ends with p1d4's weights, bitwise.
train 2 batch.accumulation=4 checkpoint.every=4 --run-dir "$TMP/u2" >"$TMP/u2.log" 2>&1 || { fail "P=1 x D=2 run"; tail -5 "$TMP/u2.log"; }
train 4 batch.accumulation=2 --resume "$TMP/u2/checkpoints/step_00000004" --run-dir "$TMP/u4" >"$TMP/u4.log" 2>&1 \
  || { fail "P=1 x D=2 run resumed at D=4"; tail -5 "$TMP/u4.log"; }
u2=$(json "$TMP/u2/summary.json" weights_sha256); u4=$(json "$TMP/u4/summary.json" weights_sha256)
p1d4=$(json "$TMP/p1d4/summary.json" weights_sha256)
if [ -n "$u2" ] && [ "$u2" = "$straight" ] && [ "$u4" = "$p1d4" ] && [ "$(losses "$TMP/u4" 4)" = "$(losses "$TMP/p1d4" 4)" ]; then
  echo "ok: P=1 x D=2 gives the P=2 x D=2 weights ${u2:0:16}; resumed at D=4 it gives p1d4's weights ${u4:0:16} and losses"
else
  fail "unpipelined reference: P=1 x D=2 $u2 (P=2 x D=2 $straight); resumed at D=4 $u4 (p1d4 $p1d4)"
  paste <(losses "$TMP/u4" 4) <(losses "$TMP/p1d4" 4) | sed 's/^/    /'
fi
# And P=4 x D=1 is bitwise the same resume without a pipeline (P=1 x D=1, one process).
"$FDTRAIN" train "$R" batch.accumulation=8 checkpoint.every=4 --resume "$CK" --run-dir "$TMP/p1d1" \
  --no-progress >"$TMP/p1d1.log" 2>&1 || { fail "p1d1: resume"; tail -5 "$TMP/p1d1.log"; }
a=$(json "$TMP/p4d1/summary.json" weights_sha256); b=$(json "$TMP/p1d1/summary.json" weights_sha256)
if [ -n "$a" ] && [ "$a" = "$b" ] && [ "$(losses "$TMP/p4d1" 4)" = "$(losses "$TMP/p1d1" 4)" ]; then
  echo "ok: p4d1: weights ${a:0:16} and losses bitwise those of the same resume at P=1 x D=1"
else
  fail "p4d1 vs p1d1: weights $a vs $b"; paste <(losses "$TMP/p4d1" 4) <(losses "$TMP/p1d1" 4) | sed 's/^/    /'
fi

# 2. summary.json's pipeline block (of the P=2 x D=2 run). Bytes each stage sends per step
# (fp32, M = 4 micro-batches of B = 2 sequences of T = 16 tokens, C = 16; the tied matrix
# E = wte's V*C elements, not the position table, which the head never touches): stage 0 each
# micro-batch's activations, M*B*T*C, and after the update the matrix to the head's copy, E;
# stage 1 each micro-batch's activation gradient and the head's gradient for the matrix,
# M*(B*T*C + E).
if python3 - "$TMP/p2d2/summary.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))["pipeline"]
print("    pipeline:", json.dumps(p))
M, B, T, C, V, maxT = 4, 2, 16, 16, 256, 32
assert p["stages"] == 2 and p["replicas"] == 2 and p["micro_batches"] == M, p
assert p["schedule"] == "1f1b", p["schedule"]
assert p["stage_blocks"] == [1, 3], p["stage_blocks"]  # parameters: the embedding counts on stage 0
assert abs(p["bubble_fraction"] - 1 / 5) < 1e-12, p["bubble_fraction"]  # (P-1)/(M+P-1)
idle = p["idle_fraction"]
assert isinstance(idle, list) and len(idle) == 2, idle
assert all(isinstance(x, float) and 0 <= x < 1 for x in idle), idle
b = p["p2p_bytes_per_step"]
assert isinstance(b, list) and all(isinstance(x, int) for x in b), b
E = V * C
want = [(M * B * T * C + E) * 4, M * (B * T * C + E) * 4]
assert b == want, f"p2p_bytes_per_step {b}, expected {want}"
PY
then echo "ok: summary.json pipeline block: 2 stages x 2 replicas, blocks [1, 3], idle in [0, 1), p2p bytes exact"
else fail "summary.json pipeline block"; fi
# The checkpoint records the layout that wrote it: ckpt inspect shows it, and each shard's stage.
ins=$("$FDTRAIN" ckpt inspect "$CK" 2>&1)
if grep -q "pipeline: 2 stages x 2 data-parallel replicas (rank = stage x 2 + replica), 1f1b schedule, transformer blocks per stage \[1, 3\]" <<<"$ins" \
   && grep -q "rank_00003.h5  rank 3 (stage 1, replica 1)" <<<"$ins"; then
  echo "ok: ckpt inspect shows the P=2 x D=2 layout and each shard's stage and replica"
else
  fail "ckpt inspect of a pipeline checkpoint"; echo "$ins" | head -8 | sed 's/^/    /'
fi
# The resumed gpipe run with blocks [3, 1]: its own schedule and blocks, and the same bytes per
# step (the activations' size does not depend on the partition; the embedding sent to the
# head's copy when the checkpoint loads is not a step's).
if python3 - "$TMP/p2d2/summary.json" "$TMP/p2d2_gpipe/summary.json" <<'PY'
import json, sys
a, b = (json.load(open(f))["pipeline"] for f in sys.argv[1:])
assert b["schedule"] == "gpipe" and b["stage_blocks"] == [3, 1], b
assert b["p2p_bytes_per_step"] == a["p2p_bytes_per_step"], (b["p2p_bytes_per_step"], a["p2p_bytes_per_step"])
PY
then echo "ok: the resumed gpipe run's pipeline block: blocks [3, 1], the same bytes per step"
else fail "the resumed gpipe run's pipeline block"; fi

# 3. Faults on the send/recv path (mirrors faults.sh): P=2 at -n 2, a run that would go on for long.
WORST=0
fault_case() {  # fault_case NAME FAULT PATTERN...
  local name=$1 fault=$2; shift 2
  local start secs out rc p
  start=$(date +%s.%N)
  out=$(FDTRAIN_FAULT=$fault timeout 90 mpirun --oversubscribe --bind-to none -n 2 "$FDTRAIN" train "$R" \
        parallel.pipeline=2 batch.accumulation=2 steps=100000 dist.timeout_s=5 --run-dir "$TMP/$name" \
        --no-progress 2>&1); rc=$?
  secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  WORST=$(awk -v a="$WORST" -v b="$secs" 'BEGIN { print (b > a) ? b : a }')
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || awk -v s="$secs" 'BEGIN { exit !(s > 60) }'; then
    fail "$name: exit $rc after ${secs}s"; echo "$out" | tail -20 | sed 's/^/    /'; return
  fi
  for p in "$@"; do
    grep -Eq -- "$p" <<<"$out" || { fail "$name: no line matches /$p/"; echo "$out" | tail -20 | sed 's/^/    /'; return; }
  done
  echo "ok: $name: exit $rc after ${secs}s, the message names the rank"
}
fault_case kill "kill:rank=1:step=3" "rank 1.*(signal 9|Killed)"
# A stalled stage: its neighbour's send_recv on the pipeline group times out, naming the peer.
fault_case stall1 "stall:rank=1:step=3" \
  "rank 0 .*: send_recv #[0-9]+ \\(rank 0 of 2 on split\\(.*\\): send .* to rank 1 \\(world rank 1\\).*did not complete within 5 s"
fault_case stall0 "stall:rank=0:step=3" \
  "rank 1 .*: send_recv #[0-9]+ \\(rank 1 of 2 on split\\(.*\\): .*receive .* from rank 0 \\(world rank 0\\)\\) did not complete within 5 s"
echo "worst time to exit: ${WORST}s"
summary_failed() {  # summary_failed NAME RANK: status failed, recorded by RANK, the send_recv named
  if python3 - "$TMP/$1/summary.json" "$2" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert s["status"] == "failed" and s["exit_reason"] == "error", s
assert s["failed_rank"] == int(sys.argv[2]), s["failed_rank"]
assert "send_recv" in s["error"] and "did not complete within 5 s" in s["error"], s["error"]
PY
  then echo "ok: $1: summary.json status failed, failed_rank $2, the send_recv named"
  else fail "$1: summary.json"; head -c 600 "$TMP/$1/summary.json" 2>&1 | sed 's/^/    /'; fi
}
summary_failed stall1 0
summary_failed stall0 1
status=$("$FDTRAIN" runs "$TMP/kill" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["status"])')
[ "$status" = killed ] && [ ! -e "$TMP/kill/summary.json" ] && echo "ok: kill: no summary, runs says killed" \
  || fail "kill: status '$status'"

# 4. Bad input under mpirun: every rank agrees, exit 2, one message (printed once: by rank 0 for a
# recipe error every rank finds, by the trainer's rank 0 for a setup error), no run directory.
refused() {  # refused N PATTERN ARGS...
  local n=$1 pattern=$2; shift 2
  local out rc dir=$TMP/bad
  rm -rf "$dir"
  out=$("${MPI[@]}" -n "$n" "$FDTRAIN" train "$R" "$@" --run-dir "$dir" --no-progress 2>&1); rc=$?
  if [ $rc -ne 2 ] || ! grep -Eq -- "$pattern" <<<"$out" || [ "$(grep -c 'fdtrain: error' <<<"$out")" -ne 1 ] \
     || grep -Eq "terminate called|Aborted|what\(\):|core dumped" <<<"$out"; then
    fail "-n $n $*: exit $rc, expected 2 and one message /$pattern/"; echo "$out" | head -20 | sed 's/^/    /'
  elif [ -e "$dir" ]; then
    fail "-n $n $*: refused, but left $(find "$dir" | head -5 | tr '\n' ' ')"
  else
    echo "ok: -n $n $*: exit 2, /$pattern/, no run directory"
  fi
}
refused 3 "parallel.pipeline: 2 pipeline stages do not divide the 3 rank\\(s\\) of this job.*mpirun -n 4" \
  parallel.pipeline=2 batch.accumulation=4
refused 2 "parallel.pipeline: 2 stages but the model has 1 transformer block\\(s\\) \\(model.n_layer\\)" \
  parallel.pipeline=2 model.n_layer=1
refused 2 "parallel.partition: the blocks per stage sum to 3 but the model has 4 \\(model.n_layer\\)" \
  parallel.pipeline=2 "parallel.partition=[1, 2]"
refused 2 "zero.stage: ZeRO stage 3 cannot be combined with a pipeline \\(parallel.pipeline is 2\\)" \
  parallel.pipeline=2 zero.stage=3

# 5. NVMe optimizer offload under a pipeline: every rank its own state file, the weights of the
# same offloaded run without a pipeline (at world D), bitwise; nothing left in the directory.
OFF=$TMP/offload
mkdir -p "$OFF"
NVME=(zero.offload_optimizer.device=nvme "zero.offload_optimizer.path=$OFF" dist.timeout_s=15)
offload_case() {  # offload_case NAME N D ARGS...: P=N/D at -n N against the unpipelined run at -n D
  local name=$1 n=$2 d=$3; shift 3
  local a b files start secs
  start=$(date +%s)
  train "$n" "${NVME[@]}" "$@" --run-dir "$TMP/$name" >"$TMP/$name.log" 2>&1 \
    || { fail "$name: exit $? after $(( $(date +%s) - start ))s"; tail -5 "$TMP/$name.log" | sed 's/^/    /'; return; }
  secs=$(( $(date +%s) - start ))
  if [ "$d" = 1 ]; then
    "$FDTRAIN" train "$R" "${NVME[@]}" "$@" parallel.pipeline=1 --run-dir "$TMP/$name.ref" --no-progress \
      >"$TMP/$name.ref.log" 2>&1 || { fail "$name: unpipelined run"; tail -5 "$TMP/$name.ref.log"; return; }
  else
    train "$d" "${NVME[@]}" "$@" parallel.pipeline=1 --run-dir "$TMP/$name.ref" >"$TMP/$name.ref.log" 2>&1 \
      || { fail "$name: unpipelined run"; tail -5 "$TMP/$name.ref.log"; return; }
  fi
  a=$(json "$TMP/$name/summary.json" weights_sha256); b=$(json "$TMP/$name.ref/summary.json" weights_sha256)
  files=$(json "$TMP/$name/summary.json" offload.optimizer_file_bytes)
  if [ -n "$a" ] && [ "$a" = "$b" ] && [ "$(losses "$TMP/$name" 0)" = "$(losses "$TMP/$name.ref" 0)" ] \
     && [ "$files" -gt 0 ]; then
    echo "ok: $name: $n ranks in ${secs}s, weights ${a:0:16} and losses bitwise the unpipelined run's at -n $d" \
         "(rank 0's state file $files bytes)"
  else
    fail "$name: weights $a vs unpipelined $b, optimizer_file_bytes $files"
    paste <(losses "$TMP/$name" 0) <(losses "$TMP/$name.ref" 0) | sed 's/^/    /'
  fi
  [ -z "$(ls -A "$OFF")" ] && echo "ok: $name: no state file left in the offload directory" \
    || fail "$name: left in $OFF: $(ls -A "$OFF")"
}
offload_case off_p2d1 2 1 parallel.pipeline=2 zero.stage=2 batch.accumulation=2 steps=3
LLAMA=(model.arch=llama model.n_kv_head=1 model.d_ff=48)
offload_case off_p2d2_llama 4 2 parallel.pipeline=2 zero.stage=1 precision=bf16 batch.accumulation=2 steps=3 \
  "${LLAMA[@]}"
# Another job holds rank 0's file: the first stage is refused, and its neighbour, set up, does
# not wait for it in the tied head's first transfer (until dist.timeout_s, 600 s by default):
# exit 1 at once, one message naming the file; the other job runs on unharmed.
"$FDTRAIN" train "$R" steps=100000 "${NVME[@]}" --run-dir "$TMP/holder" --no-progress >"$TMP/holder.log" 2>&1 &
holder=$!
for _ in $(seq 100); do [ -e "$OFF/optimizer_rank_00000.fdstate" ] && break; sleep 0.1; done
start=$(date +%s)
out=$(timeout 120 mpirun --oversubscribe --bind-to none -n 2 "$FDTRAIN" train "$R" parallel.pipeline=2 \
      zero.offload_optimizer.device=nvme "zero.offload_optimizer.path=$OFF" --run-dir "$TMP/second" \
      --no-progress 2>&1); rc=$?
secs=$(( $(date +%s) - start ))
if [ $rc -eq 1 ] && [ $secs -lt 60 ] && grep -q "optimizer_rank_00000.fdstate is in use by another fdtrain job" <<<"$out" \
   && [ "$(grep -c 'fdtrain: error' <<<"$out")" -eq 1 ]; then
  echo "ok: a pipeline whose rank 0 finds its state file in use exits 1 after ${secs}s, naming the file"
else
  fail "a pipeline whose rank 0 finds its state file in use: exit $rc after ${secs}s"; echo "$out" | tail -8 | sed 's/^/    /'
fi
kill -TERM $holder
wait $holder  # 143: stopped as asked
if [ "$(json "$TMP/holder/summary.json" status)" = interrupted ] && [ -z "$(ls -A "$OFF")" ]; then
  echo "ok: the job holding the file ran on (stopped by SIGTERM); no state file left"
else
  fail "the job holding the file: $(tail -2 "$TMP/holder.log"); left in $OFF: $(ls -A "$OFF")"
fi

# 6. A world with a factor 3: P=3 x D, 4 blocks; 2 steps, then --resume auto to 4 steps, against
# 4 steps without a pipeline at world D (the same data, bitwise); and summary.json's
# model_state_bytes_estimate, computed by rank 0 (the first stage) over its D replicas, equals
# rank 0's measured model-state peaks.
three_case() {  # three_case N ARGS...
  local n=$1 d=$(( $1 / 3 )) name=p3n$1; shift
  local args=(parallel.pipeline=3 batch.accumulation=3 "$@") a b
  train "$n" "${args[@]}" steps=2 --run-dir "$TMP/$name" >"$TMP/$name.log" 2>&1 \
    || { fail "$name: P=3 at -n $n, exit $?"; tail -5 "$TMP/$name.log" | sed 's/^/    /'; return; }
  [ "$(json "$TMP/$name/summary.json" status)" = completed ] && echo "ok: $name: P=3 at -n $n completed" \
    || fail "$name: status $(json "$TMP/$name/summary.json" status)"
  train "$n" "${args[@]}" steps=4 --resume auto --run-dir "$TMP/$name" >"$TMP/$name.r.log" 2>&1 \
    || { fail "$name: --resume auto, exit $?"; tail -5 "$TMP/$name.r.log" | sed 's/^/    /'; return; }
  if [ "$d" = 1 ]; then
    "$FDTRAIN" train "$R" batch.accumulation=3 "$@" steps=4 --run-dir "$TMP/$name.ref" --no-progress \
      >"$TMP/$name.ref.log" 2>&1 || { fail "$name: unpipelined run"; tail -5 "$TMP/$name.ref.log"; return; }
  else
    train "$d" batch.accumulation=3 "$@" steps=4 --run-dir "$TMP/$name.ref" >"$TMP/$name.ref.log" 2>&1 \
      || { fail "$name: unpipelined run"; tail -5 "$TMP/$name.ref.log"; return; }
  fi
  a=$(json "$TMP/$name/summary.json" weights_sha256); b=$(json "$TMP/$name.ref/summary.json" weights_sha256)
  if [ "$(json "$TMP/$name/summary.json" status)" = completed ] && [ "$(json "$TMP/$name/summary.json" start_step)" = 2 ] \
     && [ -n "$a" ] && [ "$a" = "$b" ] && [ "$(losses "$TMP/$name" 0)" = "$(losses "$TMP/$name.ref" 0)" ] \
     && [ "$(losses "$TMP/$name" 0 | wc -l)" -eq 4 ]; then
    echo "ok: $name: resumed at step 2 to step 4: weights ${a:0:16} and losses bitwise the unpipelined run's at -n $d"
  else
    fail "$name: resumed: weights $a vs unpipelined $b"
    paste <(losses "$TMP/$name" 0) <(losses "$TMP/$name.ref" 0) | sed 's/^/    /'
  fi
  if python3 - "$TMP/$name/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
est, mem = s["model_state_bytes_estimate"], s["memory_per_rank"][0]
for k in ("params", "grads", "master", "optimizer"):
    assert est[k] == mem[k], f"{k}: estimate {est[k]}, rank 0 measured {mem[k]}"
PY
  then echo "ok: $name: model_state_bytes_estimate is rank 0's measured model states, to the byte"
  else fail "$name: model_state_bytes_estimate"; fi
}
three_case 3
three_case 6 zero.stage=2

finish
