#!/usr/bin/env bash
# Tensor parallelism end to end (issue 39, docs/RECIPE.md `parallel.tensor`):
#  - numerics: 20 fp32 steps of the same global batch at T=2 and T=4 (kv heads replicated:
#    2 kv heads over 4 ranks), with Megatron's sequence parallelism at T=2 and T=4, T=2 x D=2
#    with ZeRO-2 and ZeRO-3, and LoRA at T=2, give the
#    losses and gradient norms of T=1 to 1e-5 relative at every step (the data is the same;
#    only the order of fp32 sums differs) for a Llama with GQA, an untied head and a
#    vocabulary of 259 (uneven rows over the ranks), a Llama with a tied head, and GPT-2
#    (fused c_attn, biases, learned positions, tied head); ZeRO stages 0, 2 and 3 at T=2 give
#    one weights_sha256 (bitwise), activation checkpointing too;
#  - Ulysses (parallel.sequence): S=2, S=4 (kv heads gathered), S=2 x D=2, S=2 x T=2 and GPT-2
#    give T=1's losses to 1e-5; at 2048 tokens S=4 holds <= 0.3 of S=1's activations per rank;
#  - with a pipeline: T=2 x P=2 (mpirun -n 4, micro 2 x accumulation 2: T=1's split) gives
#    T=1's losses and gradient norms to 1e-5 for the Llama and GPT-2 (its tied head's rows
#    handed between the first and last stage's same tp rank), with and without sequence
#    parallelism, and T=2 x P=2 x D=2 (-n 8) for the tied Llama with ZeRO-1; its estimate's model states (largest rank and per stage) and tp bytes per
#    step are the run's; its checkpoint of step 10 resumed at T=1 x D=4 continues with T=1's
#    losses to 1e-5;
#  - Ulysses with a pipeline: S=2 x P=2 (-n 4) gives T=1's losses and gradient norms to 1e-5 for
#    the Llama and GPT-2 (its tied head's gradient handed per sp rank), and S=2 x T=2 x P=2
#    (-n 8) for the Llama; its estimate's memory by category (largest rank and per stage) and
#    sp bytes per step are the run's (and Ulysses' count); its checkpoint of step 10 resumed at
#    T=2 x D=2 continues with T=1's losses to 1e-5;
#  - summary.json's tensor_parallel block, and parameters per rank about 1/T; the estimate's
#    model states, activations (and comm buffers of a run that evaluates) and tp / sp bytes per
#    step are the runs' (and Megatron's / Ulysses' counts);
#  - hostile: T not dividing the query heads, kv heads neither divided nor dividing, T x P
#    not dividing the world, a batch.global that does not fit, T with a pipeline and ZeRO-3,
#    device cuda, a 4-bit base whose blocks the slices would cut: exit 2 at validation, one message with the arithmetic, no run
#    directory (an objective works: tests/cli/preference_parallel.sh);
#  - a rank killed or stalled in a tensor-parallel step (and stalled in a T=2 x P=2 step and an
#    S=2 x P=2 step) ends the job within 60 s, naming it.
source "$(dirname "$0")/common.bash"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPI=(timeout 120 mpirun --oversubscribe --bind-to none)
fail() { echo "FAIL: $*"; FAILURES=$((FAILURES + 1)); }
json() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))
for k in sys.argv[2].split("."): d=d[int(k)] if isinstance(d,list) else d[k]
print(d)' "$1" "$2"; }

# A Llama with GQA (4 query heads, 2 kv heads), an untied head and 259 rows: 130 + 129 at
# T=2, 65 + 65 + 65 + 64 at T=4.
LLAMA=$TMP/llama.yaml
cat > "$LLAMA" <<'YAML'
model:
  arch: llama
  n_layer: 2
  n_head: 4
  n_kv_head: 2
  d_model: 64
  d_ff: 96
  vocab_size: 259
  max_seq_len: 64
data:
  format: text
  train: [/usr/share/games/fortunes/fortunes]
  val_fraction: 0.0
  seq_len: 32
batch:
  micro: 2
  global: 4
optimizer:
  lr: 3.0e-3
steps: 20
checkpoint:
  every: 0
logging:
  every: 1
  sample_tokens: 0
YAML
GPT=$TMP/gpt.yaml
write_recipe "$GPT"
sed -i 's/^steps: 3/steps: 20/; s/^  n_layer: 1/  n_layer: 2/; s/^  n_head: 2/  n_head: 4/; s/^  d_model: 16/  d_model: 32/; s/^  micro: 2/  micro: 2\n  global: 4/' "$GPT"

# train NAME RECIPE N ARGS...: mpirun -n N fdtrain train RECIPE ARGS into $TMP/NAME.
train() {
  local name=$1 recipe=$2 n=$3; shift 3
  "${MPI[@]}" -n "$n" "$FDTRAIN" train "$recipe" "$@" --run-dir "$TMP/$name" --no-progress \
    >"$TMP/$name.log" 2>&1 || { fail "$name: exit $?"; tail -5 "$TMP/$name.log" | sed 's/^/    /'; }
}
# same_as REF NAME [TOL KEYS FIRST]: the losses and gradient norms (KEYS) of every step of NAME
# (from step FIRST, default 1) match REF's to TOL (1e-5) relative.
same_as() {
  local tol=${3:-1e-5} keys=${4:-loss,grad_norm}
  if python3 - "$TMP/$1/metrics.jsonl" "$TMP/$2/metrics.jsonl" "$tol" "$keys" "${5:-1}" <<'PY'
import json, sys
first = int(sys.argv[5])
def steps(path):
    return {m["step"]: m for m in map(json.loads, open(path))
            if "grad_norm" in m and m["step"] >= first}
a, b = steps(sys.argv[1]), steps(sys.argv[2])
tol, keys = float(sys.argv[3]), sys.argv[4].split(",")
assert len(a) == 21 - first and sorted(a) == sorted(b), (len(a), len(b))
worst = max(abs(b[s][k] - a[s][k]) / abs(a[s][k]) for s in a for k in keys)
print(f"    steps {first}-20, largest relative difference of {' and '.join(keys)} {worst:.3g}")
assert worst <= tol, worst
PY
  then echo "ok: $2: the $keys of $1 to $tol"; else fail "$2: differs from $1's"; fi
}

# 1. Numerics against T=1 (one rank, the same global batch of 4 sequences).
train l1 "$LLAMA" 1 batch.accumulation=2
train l2 "$LLAMA" 2 parallel.tensor=2 batch.accumulation=2
train l4 "$LLAMA" 4 parallel.tensor=4 batch.accumulation=2
train l2d2 "$LLAMA" 4 parallel.tensor=2 zero.stage=2
train l2d2z3 "$LLAMA" 4 parallel.tensor=2 zero.stage=3
train l2d2z0 "$LLAMA" 4 parallel.tensor=2 zero.stage=0
train l2d2ac "$LLAMA" 4 parallel.tensor=2 zero.stage=2 activation_checkpointing.layers=all
# Megatron's sequence parallelism (the norm regions split along the sequence).
train l2sp "$LLAMA" 2 parallel.tensor=2 parallel.sequence_parallel=true batch.accumulation=2
train l4sp "$LLAMA" 4 parallel.tensor=4 parallel.sequence_parallel=true batch.accumulation=2
for run in l2 l4 l2d2 l2d2z3 l2sp l4sp; do same_as l1 $run; done
w=$(json "$TMP/l2d2/summary.json" weights_sha256)
for run in l2d2z3 l2d2z0 l2d2ac; do
  got=$(json "$TMP/$run/summary.json" weights_sha256)
  [ -n "$w" ] && [ "$got" = "$w" ] && echo "ok: $run: weights ${w:0:16}, bitwise T=2 x D=2 ZeRO-2's" \
    || fail "$run: weights $got vs $w"
done
# DeepSpeed-Ulysses (parallel.sequence): S=2 and S=4 (2 kv heads over 4 ranks: gathered), S=2 x
# D=2 with ZeRO-2, S=2 x T=2, and GPT-2 (learned positions). (Packed rows across the slices:
# tests/mpi/tensor_parallel_test.cc.)
train s2 "$LLAMA" 2 parallel.sequence=2 batch.accumulation=2
train s4 "$LLAMA" 4 parallel.sequence=4 batch.accumulation=2
train s2d2 "$LLAMA" 4 parallel.sequence=2 zero.stage=2
train s2t2 "$LLAMA" 4 parallel.sequence=2 parallel.tensor=2 batch.accumulation=2
for run in s2 s4 s2d2 s2t2; do same_as l1 $run; done
# bf16 (fp32 master weights): the same losses to bf16's rounding of another summation order; and
# the optimizer state offloaded to NVMe at T=2 x D=2: the weights of the run without, bitwise
# (one state file per rank, none left behind).
train b1 "$LLAMA" 1 batch.accumulation=2 precision=bf16
train b2 "$LLAMA" 2 parallel.tensor=2 batch.accumulation=2 precision=bf16
same_as b1 b2 2e-3 loss
mkdir -p "$TMP/nvme"
train l2d2nv "$LLAMA" 4 parallel.tensor=2 zero.stage=2 zero.offload_optimizer.device=nvme \
  zero.offload_optimizer.path="$TMP/nvme"
got=$(json "$TMP/l2d2nv/summary.json" weights_sha256)
[ -n "$w" ] && [ "$got" = "$w" ] && [ -z "$(ls -A "$TMP/nvme")" ] &&
  echo "ok: l2d2nv: NVMe-offloaded optimizer at T=2 x D=2, weights ${w:0:16} bitwise ZeRO-2's" ||
  fail "l2d2nv: weights $got vs $w; left in the offload directory: $(ls -A "$TMP/nvme")"
# Tied heads: a Llama tying its head to the embedding, and GPT-2.
train t1 "$LLAMA" 1 batch.accumulation=2 model.tie_embeddings=true
train t2 "$LLAMA" 4 parallel.tensor=2 model.tie_embeddings=true
same_as t1 t2
train g1 "$GPT" 1 batch.accumulation=2
train g2 "$GPT" 2 parallel.tensor=2 batch.accumulation=2
train g2d2 "$GPT" 4 parallel.tensor=2 zero.stage=3
train g2sp "$GPT" 4 parallel.tensor=2 parallel.sequence_parallel=true zero.stage=2
same_as g1 g2
same_as g1 g2d2
same_as g1 g2sp
train gs2 "$GPT" 2 parallel.sequence=2 batch.accumulation=2
same_as g1 gs2
# LoRA on every linear (column-parallel B and row-parallel A split, the other factor whole).
LORA=(lora.r=4 "lora.targets=[all-linear]")
train a1 "$LLAMA" 1 batch.accumulation=2 "${LORA[@]}"
train a2 "$LLAMA" 4 parallel.tensor=2 zero.stage=2 "${LORA[@]}"
same_as a1 a2
# With a pipeline: T=2 x P=2 (one block per stage), micro 2 x accumulation 2 as T=1's.
TP=(parallel.tensor=2 parallel.pipeline=2 batch.accumulation=2)
train lp "$LLAMA" 4 "${TP[@]}" checkpoint.every=10
train lpsp "$LLAMA" 4 "${TP[@]}" parallel.sequence_parallel=true
train gp "$GPT" 4 "${TP[@]}"
train gpsp "$GPT" 4 "${TP[@]}" parallel.sequence_parallel=true
same_as l1 lp
same_as l1 lpsp
same_as g1 gp
same_as g1 gpsp
# T=2 x P=2 x D=2 (-n 8, micro 1: the same 4 sequences), a tied Llama, ZeRO-1 over each
# stage's replicas holding the same slices.
train lpd "$LLAMA" 8 "${TP[@]}" batch.micro=1 zero.stage=1 model.tie_embeddings=true
same_as t1 lpd
grep -q "pipeline: 2 stages x 1 data-parallel replica x 2 tensor-parallel ranks" "$TMP/lp.log" \
  && echo "ok: lp: the setup line names the T x P layout" || fail "lp: no T x P setup line"
# Its checkpoint of step 10 resumed at T=1 x D=4 (micro 1: the same 4 sequences per step).
train lpr "$LLAMA" 4 batch.micro=1 --resume "$TMP/lp/checkpoints/step_00000010"
same_as l1 lpr 1e-5 loss,grad_norm 11
# Ulysses with a pipeline: S=2 x P=2 (sp rank u's slice of the hidden state to sp rank u of the
# next stage; GPT-2's tied head's gradient from each sp rank of the last stage to the same of the
# first), and S=2 x T=2 x P=2 (-n 8) on the Llama; micro 2 x accumulation 2 as T=1's.
SP=(parallel.sequence=2 parallel.pipeline=2 batch.accumulation=2)
train sp2p "$LLAMA" 4 "${SP[@]}" checkpoint.every=10
train gsp2p "$GPT" 4 "${SP[@]}"
train sp2t2p "$LLAMA" 8 "${SP[@]}" parallel.tensor=2
same_as l1 sp2p
same_as g1 gsp2p
same_as l1 sp2t2p
grep -q "pipeline: 2 stages x 1 data-parallel replica x 2 Ulysses sequence-parallel ranks, " \
  "$TMP/sp2p.log" && grep -q "x 2 Ulysses sequence-parallel ranks x 2 tensor-parallel ranks" \
  "$TMP/sp2t2p.log" && echo "ok: sp2p, sp2t2p: the setup line names the S x P (x T) layout" ||
  fail "sp2p, sp2t2p: no S x P setup line"
# Its checkpoint of step 10 (each stage's D x S = 2 ZeRO partitions) resumed at T=2 x D=2.
train sp2pr "$LLAMA" 4 parallel.tensor=2 --resume "$TMP/sp2p/checkpoints/step_00000010"
same_as l1 sp2pr 1e-5 loss,grad_norm 11

# 2. summary.json: the layout, and each rank's parameters about 1/T of T=1's.
if python3 - "$TMP/l1/summary.json" "$TMP/l2/summary.json" <<'PY'
import json, sys
one, two = (json.load(open(p)) for p in sys.argv[1:])
t = two["tensor_parallel"]
assert t["size"] == 2 and t["replicas"] == 1 and t["bytes_per_step"] > 0, t
assert "tensor_parallel" not in one
p1 = one["memory"]["params"]; p2 = two["memory"]["params"]
print(f"    parameters per rank: T=1 {p1} bytes, T=2 {p2} bytes ({p2 / p1:.3f})")
assert 0.5 <= p2 / p1 <= 0.56, p2 / p1   # the norms are whole on every rank
PY
then echo "ok: summary.json tensor_parallel {size 2, replicas 1}; parameters per rank ~1/2"; else
  fail "summary.json of T=2"; fi

# The estimate by execution: per rank, each category of model state and the bytes sent over the
# tp group per step, equal to what the runs measured; without replicated parts (2 kv heads over
# 2 ranks, no biases, no LoRA), the bytes are Megatron's count.
estimate_matches() {  # estimate_matches RUN N ARGS...: the estimate of RUN's layout vs its summary
  local run=$1 n=$2; shift 2
  "$FDTRAIN" estimate "$LLAMA" "$@" --world-size "$n" --json >"$TMP/$run.est.json" 2>"$TMP/$run.est.err" \
    || { fail "$run: estimate exit $?"; head -3 "$TMP/$run.est.err"; return; }
  if python3 - "$TMP/$run.est.json" "$TMP/$run/summary.json" "$run" <<'PY'
import json, sys
est, summ, run = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
st = next(s for s in est["stages"] if s["stage"] == est["recipe_stage"])
for k in ("params", "grads", "master", "optimizer", "activations"):
    assert st[k] == summ["memory"][k], (k, st[k], summ["memory"][k])
# The comm buffers when the run evaluated, as the estimate does (a later stage's receive buffer).
evaluated = summ.get("eval_loss") is not None
assert not evaluated or st["comm_buffers"] == summ["memory"]["comm"], (st, summ["memory"])
for kind in ("tensor_parallel", "sequence_parallel"):
    if kind not in est and kind not in summ:
        continue
    t = est[kind]
    assert t["bytes_per_step"] == summ[kind]["bytes_per_step"], (kind, t, summ[kind])
    if run in ("l2", "l2sp", "lp", "lpsp", "s2", "s4", "s2t2", "sp2p"):
        assert t["bytes_per_step"] == t["formula_bytes_per_step"], (kind, t)
    print(f"    {kind}: {t['bytes_per_step']} bytes per step (the formula's "
          f"{t['formula_bytes_per_step']})")
if "pipeline" in est:  # each stage's figures are its first rank's (tp and sp rank 0's), measured
    T = est.get("tensor_parallel", {}).get("size", 1)
    S = est.get("sequence_parallel", {}).get("size", 1)
    D = est["pipeline"]["replicas"]
    assert summ["pipeline"]["stages"] == est["pipeline"]["stages"], summ["pipeline"]
    # Every rank of the stage at tp rank 0 (tp rank 1 holds 129 of the 259 vocabulary rows).
    for st in est["pipeline"]["per_stage"]:
        for r in range(st["stage"] * D * S * T, (st["stage"] + 1) * D * S * T, T):
            mem = summ["memory_per_rank"][r]
            for k in ("params", "grads", "master", "optimizer", "activations"):
                assert st[k] == mem[k], (st["stage"], r, k, st[k], mem[k])
            assert not evaluated or st["comm_buffers"] == mem["comm"], (st["stage"], r, mem)
    for kind, key in (("tensor_parallel", "tp_bytes_per_step"),
                      ("sequence_parallel", "sp_bytes_per_step")):
        if kind in est:
            per = [st[key] for st in est["pipeline"]["per_stage"]]
            assert max(per) == summ[kind]["bytes_per_step"], (kind, per, summ[kind])
            print(f"    per stage: {kind} bytes {per}")
    print("    per stage: its ranks' model states and activations as measured")
print(f"    model states and activations{' and comm buffers' if evaluated else ''} by category "
      "as measured")
PY
  then echo "ok: $run: the estimate's memory by category and tp / sp bytes per step are the run's"; else
    fail "$run: estimate vs summary.json"; fi
}
estimate_matches l2 2 parallel.tensor=2 batch.accumulation=2
estimate_matches l2d2z3 4 parallel.tensor=2 zero.stage=3
estimate_matches l4 4 parallel.tensor=4 batch.accumulation=2
estimate_matches l2sp 2 parallel.tensor=2 parallel.sequence_parallel=true batch.accumulation=2
estimate_matches lp 4 "${TP[@]}" checkpoint.every=10
estimate_matches lpsp 4 "${TP[@]}" parallel.sequence_parallel=true
estimate_matches s2 2 parallel.sequence=2 batch.accumulation=2
estimate_matches s4 4 parallel.sequence=4 batch.accumulation=2
estimate_matches s2t2 4 parallel.sequence=2 parallel.tensor=2 batch.accumulation=2
estimate_matches sp2p 4 "${SP[@]}" checkpoint.every=10
# With an evaluation (a later stage's receive buffer for it among the comm buffers).
train sp2pv "$LLAMA" 4 "${SP[@]}" data.val_fraction=0.1 steps=2
estimate_matches sp2pv 4 "${SP[@]}" data.val_fraction=0.1 steps=2

# Activations per rank of a 2048-token sequence (the estimate runs the step on the counting
# device, as summary.json measures it): Ulysses at S=4 holds at most 0.3 of S=1's, with as many
# key/value heads as ranks (fewer are gathered whole: their k and v stay whole-sequence).
act() {  # act S: the recipe stage's activation peak per rank at parallel.sequence=S
  "$FDTRAIN" estimate "$LLAMA" parallel.sequence="$1" data.seq_len=2048 model.max_seq_len=2048 \
    model.n_kv_head=4 batch.micro=1 batch.global=0 --world-size "$1" --json |
    python3 -c 'import json,sys; e=json.load(sys.stdin)
print(next(s for s in e["stages"] if s["stage"] == e["recipe_stage"])["activations"])'
}
a1=$(act 1) a4=$(act 4)
if [ -n "$a1" ] && [ -n "$a4" ] && python3 -c "import sys; r=$a4/$a1; print(f'    T=2048: S=1 {$a1} bytes, S=4 {$a4} bytes ({r:.3f}x)'); sys.exit(r > 0.3)"; then
  echo "ok: Ulysses S=4 activations per rank <= 0.3x S=1's at T=2048"
else fail "Ulysses activations at T=2048: S=1 $a1, S=4 $a4"; fi

# 3. Refused at validation: exit 2, one message naming parallel.tensor with the arithmetic.
refused() {  # refused NAME N PATTERN ARGS...
  local name=$1 n=$2 pattern=$3; shift 3
  local out rc
  out=$("${MPI[@]}" -n "$n" "$FDTRAIN" train "$LLAMA" "$@" --run-dir "$TMP/$name" --no-progress 2>&1)
  rc=$?
  if [ "$rc" -eq 2 ] && grep -Eq -- "$pattern" <<<"$out" && [ ! -e "$TMP/$name" ]; then
    echo "ok: $name: exit 2, /$pattern/"
  else
    fail "$name: exit $rc"; echo "$out" | grep -v '^--\|^$' | head -5 | sed 's/^/    /'
  fi
}
refused heads 3 "parallel.tensor: 4 query heads do not split over 3 ranks \(4 % 3 = 1\)" \
  parallel.tensor=3 batch.global=0
refused kv 2 "parallel.tensor: 3 key/value heads neither split over 2 ranks nor divide them" \
  parallel.tensor=2 model.n_head=6 model.n_kv_head=3 model.d_model=96 batch.global=0
refused world 3 "parallel.tensor: 2 tensor-parallel ranks x 1 pipeline stage\(s\) = 2 do not divide the 3 rank\(s\)" \
  parallel.tensor=2 batch.global=0
refused global 4 "batch.global: 4 sequences per step do not fit 4 rank\(s\) of 4 tensor-parallel rank\(s\).* = 2 \* 1 \* 1 = 2; set batch.accumulation to 2" \
  parallel.tensor=4
refused pipez3 4 "ZeRO stage 3 cannot be combined with a pipeline" parallel.tensor=2 parallel.pipeline=2 zero.stage=3 \
  batch.global=0
refused cuda 2 "parallel.tensor: with device: cuda" parallel.tensor=2 device=cuda batch.global=0
refused sseq 2 "parallel.sequence: splits each sequence of data.seq_len 31 tokens over 2 ranks, which do not divide it \(31 % 2 = 1\)" \
  parallel.sequence=2 data.seq_len=31 batch.global=0
refused sheads 4 "parallel.sequence: 2 query heads \(per tensor-parallel rank: 4 / 2\) do not split over 4 sequence-parallel ranks" \
  parallel.sequence=4 parallel.tensor=2 batch.global=0
refused sworld 3 "parallel.sequence: 2 sequence-parallel ranks x 1 tensor-parallel rank\(s\) x 1 pipeline stage\(s\) = 2 do not divide the 3 rank\(s\)" \
  parallel.sequence=2 batch.global=0
refused smeg 4 "parallel.sequence: with parallel.sequence_parallel" parallel.sequence=2 \
  parallel.tensor=2 parallel.sequence_parallel=true batch.global=0
refused sp1 2 "parallel.sequence_parallel: splits the sequence over the tensor-parallel ranks, and parallel.tensor is 1" \
  parallel.sequence_parallel=true batch.global=0
refused spseq 4 "parallel.sequence_parallel: splits each sequence of data.seq_len 30 tokens over the 4 tensor-parallel ranks, which do not divide it \(30 % 4 = 2\)" \
  parallel.tensor=4 parallel.sequence_parallel=true data.seq_len=30 batch.global=0
# QLoRA: blocks of 64 that a rank's slice would cut (tests/cli/qlora_tensor_parallel.sh runs it).
refused quant 2 "model.quantize.block_size: with parallel.tensor 2: self_attn.o_proj \(row-parallel, \[64, 64\]\) gives each rank 32 input features per row, not a multiple of 64" \
  parallel.tensor=2 batch.global=0 lora.r=4 model.quantize.type=nf4

# 4. A rank killed or stalled inside a tensor-parallel step: the job ends within 60 s, naming it.
fault() {  # [LAYOUT=...] fault NAME N SPEC PATTERN ARGS... (LAYOUT: default parallel.tensor=2)
  local name=$1 n=$2 spec=$3 pattern=$4; shift 4
  local start out rc secs
  start=$(date +%s)
  out=$(FDTRAIN_FAULT=$spec "${MPI[@]}" -n "$n" "$FDTRAIN" train "$LLAMA" \
        ${LAYOUT:-parallel.tensor=2} batch.accumulation=2 steps=100000 "$@" \
        --run-dir "$TMP/$name" --no-progress 2>&1)
  rc=$?
  secs=$(($(date +%s) - start))
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$secs" -le 60 ] && grep -Eq -- "$pattern" <<<"$out"; then
    echo "ok: $name: exit $rc after ${secs}s, /$pattern/"
  else
    fail "$name: exit $rc after ${secs}s"; echo "$out" | grep -v '^--\|^$' | tail -8 | sed 's/^/    /'
  fi
}
fault kill 2 "kill:rank=1:step=3" "rank 1|process rank 1|signal 9|Killed"
fault stall 2 "stall:rank=1:step=3" "rank 0 .*did not complete within 5 s" dist.timeout_s=5
# T=2 x P=2: rank 3 (the last stage's tp rank 1) stalls; its tp peer and its pipeline peer wait.
fault tpstall 4 "stall:rank=3:step=3" "rank [0-2] .*did not complete within 5 s" \
  parallel.pipeline=2 dist.timeout_s=5
# S=2 x P=2: rank 3 (the last stage's sp rank 1) stalls; its sp peer and its pipeline peer wait.
LAYOUT=parallel.sequence=2 fault spstall 4 "stall:rank=3:step=3" \
  "rank [0-2] .*did not complete within 5 s" parallel.pipeline=2 dist.timeout_s=5

finish
