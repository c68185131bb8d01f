#!/usr/bin/env bash
# QLoRA on tensor-sharded linears (issue 39; docs/QUANTIZATION.md "Tensor parallelism"): each
# rank keeps the whole weight's 4-bit blocks of its slices (quantize the whole tensor, keep the
# rank's blocks; their absmax in fp32), so the base a T-way run computes with is the unsharded
# run's, value for value:
#  - numerics: 20 fp32 steps of the same global batch, NF4 blocks of 32 with double
#    quantization, LoRA on every linear of a Llama with GQA and an untied head: T=2, T=4 (its 2
#    kv heads replicated: their weights whole, double-quantized as at T=1), T=2 x D=2 with
#    ZeRO-2 and ZeRO-3 (the 4-bit segments partitioned further), T=2 with Megatron's sequence
#    parallelism, T=2 x P=2 and Ulysses' S=2 give T=1's losses and gradient norms to 1e-5 relative; GPT-2
#    (Conv1D weights, the fused c_attn's q | k | v parts) at T=2 too; each run ends with its
#    sample, generated over the whole model (the 4-bit slices gathered and dequantized);
#  - a 4-bit directory (`ckpt export --hf-dir --quantized` of the T=1 run) as model.init_from:
#    T=2 takes its stored blocks as they are and trains as T=1 over it;
#  - the estimate's 4-bit base per rank (and every other category) is the run's, about 1/T of
#    T=1's;
#  - hostile: a block size whose blocks a rank's slice would cut (64 at T=4: o_proj's 32 input
#    features per rank) is refused at validation, exit 2, with the arithmetic and the largest
#    block size that fits; no run directory.
source "$(dirname "$0")/common.bash"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPI=(timeout 120 mpirun --oversubscribe --bind-to none)
fail() { echo "FAIL: $*"; FAILURES=$((FAILURES + 1)); }

# Token ids below the vocabulary (200), as llm.c .bin files.
python3 - "$TMP/train.bin" <<'PY'
import random, struct, sys
r = random.Random(7)
toks = [r.randrange(200) for _ in range(8000)]
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253)))
    f.write(struct.pack(f"<{len(toks)}H", *toks))
PY
# q: 128 x 128 (64 rows per rank at T=2), k/v: 64 x 128, o: 128 x 128 (64 or 32 input features
# per rank), gate/up 256 x 128, down 128 x 256.
LLAMA=$TMP/llama.yaml
cat > "$LLAMA" <<YAML
model:
  arch: llama
  n_layer: 2
  n_head: 4
  n_kv_head: 2
  d_model: 128
  d_ff: 256
  vocab_size: 200
  max_seq_len: 64
  quantize: {type: nf4, block_size: 32, double_quant: true}
data: {format: tokens, train: [$TMP/train.bin], val_fraction: 0.0, seq_len: 32}
batch: {micro: 2, global: 4}
optimizer: {lr: 1.0e-2}
lora: {r: 4, alpha: 8, dropout: 0.0, targets: [all-linear]}
steps: 20
checkpoint: {every: 0}
logging: {every: 1, sample_tokens: 8}
YAML
GPT=$TMP/gpt.yaml
sed 's/^  arch: llama/  arch: gpt2/; /n_kv_head/d; /d_ff/d' "$LLAMA" > "$GPT"

# train NAME RECIPE N ARGS...: mpirun -n N fdtrain train RECIPE ARGS into $TMP/NAME.
train() {
  local name=$1 recipe=$2 n=$3; shift 3
  "${MPI[@]}" -n "$n" "$FDTRAIN" train "$recipe" "$@" --run-dir "$TMP/$name" --no-progress \
    >"$TMP/$name.log" 2>&1 || { fail "$name: exit $?"; tail -5 "$TMP/$name.log" | sed "s/^/    /"; return 1; }
}
# same_as REF NAME: the losses and gradient norms of every step, to 1e-5 relative.
same_as() {
  if python3 - "$TMP/$1" "$TMP/$2" <<'PY'
import json, sys
def steps(run):
    return {m["step"]: m for m in map(json.loads, open(run + "/metrics.jsonl")) if "grad_norm" in m}
a, b = steps(sys.argv[1]), steps(sys.argv[2])
assert len(a) == 20 and sorted(a) == sorted(b), (len(a), len(b))
worst = max(abs(b[s][k] - a[s][k]) / abs(a[s][k]) for s in a for k in ("loss", "grad_norm"))
print(f"    steps 1-20, largest relative difference of loss and grad_norm {worst:.3g}")
assert worst <= 1e-5, worst
# The sample is generated over the whole model (the slices gathered, the base dequantized), so
# it exists; its tokens are not compared: sampling from a barely trained model's nearly equal
# logits turns fp32 sum orders into other tokens (the gather itself is exact:
# tests/mpi/tensor_parallel_test.cc).
assert len(json.load(open(sys.argv[2] + "/summary.json"))["sample_tokens"]) == 8
PY
  then echo "ok: $2: the losses and gradient norms of $1"; else fail "$2: differs from $1's"; fi
}

# 1. Numerics against T=1 (one rank, the same 4 sequences per step).
train q1 "$LLAMA" 1 batch.accumulation=2 checkpoint.every=20
train q2 "$LLAMA" 2 parallel.tensor=2 batch.accumulation=2
train q4 "$LLAMA" 4 parallel.tensor=4 batch.accumulation=2
train q2d2 "$LLAMA" 4 parallel.tensor=2 zero.stage=2
train q2d2z3 "$LLAMA" 4 parallel.tensor=2 zero.stage=3
train q2sp "$LLAMA" 2 parallel.tensor=2 parallel.sequence_parallel=true batch.accumulation=2
train q2p "$LLAMA" 4 parallel.tensor=2 parallel.pipeline=2 batch.accumulation=2
# Ulysses: the weights are whole on every sp rank, 4-bit as at T=1.
train qs2 "$LLAMA" 2 parallel.sequence=2 batch.accumulation=2
for run in q2 q4 q2d2 q2d2z3 q2sp q2p qs2; do same_as q1 $run; done
# GPT-2 at lr 3e-3: at 1e-2 Adam turns the summation order's last bits in its near-zero
# gradient components into full steps (the plain LoRA run does the same).
train g1 "$GPT" 1 batch.accumulation=2 optimizer.lr=3.0e-3
train g2 "$GPT" 2 parallel.tensor=2 batch.accumulation=2 optimizer.lr=3.0e-3
same_as g1 g2

# 2. A 4-bit directory as model.init_from, its blocks taken as stored: a base (one full step,
# exported as a Hugging Face directory), trained over with QLoRA at T=1 and exported as the 4-bit
# base it held (`ckpt export --hf-dir --quantized`); T=2 over that directory trains as T=1.
train base "$LLAMA" 1 model.quantize=null lora=null steps=1 checkpoint.every=1 batch.accumulation=2
DIR=$TMP/dir.yaml
# dir.yaml: the recipe with model: {init_from: DIR, quantize} for the architecture.
dir_recipe() {
  python3 - "$LLAMA" "$DIR" "$1" <<'PY'
import sys
out, skip = [], False
for l in open(sys.argv[1]).read().split("\n"):
    if l == "model:":
        out += ["model:", f"  init_from: {sys.argv[3]}",
                "  quantize: {type: nf4, block_size: 32, double_quant: true}"]
        skip = True
    elif not (skip and l.startswith("  ")):
        skip = False
        out.append(l)
open(sys.argv[2], "w").write("\n".join(out))
PY
}
if "$FDTRAIN" ckpt export "$TMP/base" --hf-dir "$TMP/basedir" >"$TMP/export.log" 2>&1 &&
   dir_recipe "$TMP/basedir" && train over "$DIR" 1 batch.accumulation=2 steps=1 checkpoint.every=1 &&
   "$FDTRAIN" ckpt export "$TMP/over" --hf-dir "$TMP/q4dir" --quantized >>"$TMP/export.log" 2>&1; then
  dir_recipe "$TMP/q4dir"
  train d1 "$DIR" 1 batch.accumulation=2
  train d2 "$DIR" 2 parallel.tensor=2 batch.accumulation=2
  same_as d1 d2
else
  fail "making the 4-bit directory"; tail -3 "$TMP/export.log" | sed 's/^/    /'
fi

# 3. The estimate by execution: every category per rank (the 4-bit base included) is the run's;
# the 4-bit base per rank about 1/T of T=1's (norms whole, the kv weights' statistics in fp32).
estimate_matches() {  # estimate_matches RUN N ARGS...
  local run=$1 n=$2; shift 2
  "$FDTRAIN" estimate "$LLAMA" "$@" --world-size "$n" --json >"$TMP/$run.est.json" 2>"$TMP/$run.est.err" \
    || { fail "$run: estimate exit $?"; head -3 "$TMP/$run.est.err"; return; }
  if python3 - "$TMP/$run.est.json" "$TMP/$run/summary.json" "$TMP/q1/summary.json" <<'PY'
import json, sys
est, summ, one = (json.load(open(p)) for p in sys.argv[1:])
st = next(s for s in est["stages"] if s["stage"] == est["recipe_stage"])
for k in ("params", "grads", "master", "optimizer", "activations", "quantized"):
    assert st[k] == summ["memory"][k], (k, st[k], summ["memory"][k])
T = summ["tensor_parallel"]["size"]
ratio = summ["quantized_base_bytes"] / one["quantized_base_bytes"]
print(f"    4-bit base per rank {summ['quantized_base_bytes']} bytes, {ratio:.3f} of T=1's at T={T}")
assert ratio < 1.25 / T, ratio
PY
  then echo "ok: $run: the estimate's memory by category is the run's; the 4-bit base ~1/T per rank"
  else fail "$run: estimate vs summary.json"; fi
}
estimate_matches q2 2 parallel.tensor=2 batch.accumulation=2
estimate_matches q2d2z3 4 parallel.tensor=2 zero.stage=3

# 4. Refused: blocks of 64 at T=4 would be cut (o_proj: 32 input features per rank).
out=$("${MPI[@]}" -n 4 "$FDTRAIN" train "$LLAMA" parallel.tensor=4 model.quantize.block_size=64 \
  batch.accumulation=2 --run-dir "$TMP/cut" --no-progress 2>&1)
rc=$?
pattern="model.quantize.block_size: with parallel.tensor 4: self_attn.o_proj \(row-parallel, \[128, 128\]\) gives each rank 32 input features per row, not a multiple of 64 \(32 % 64 = 32\): .*the largest block size whose blocks every rank's slices hold whole is 32"
if [ "$rc" -eq 2 ] && grep -Eq -- "$pattern" <<<"$out" && [ ! -e "$TMP/cut" ]; then
  echo "ok: cut: exit 2, the block size the slices would cut, and the one that fits"
else
  fail "cut: exit $rc"; echo "$out" | grep -v '^--\|^$' | head -5 | sed 's/^/    /'
fi
finish
