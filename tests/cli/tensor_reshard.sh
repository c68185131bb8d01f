#!/usr/bin/env bash
# Checkpoints of tensor-parallel runs reshard on load to every layout (DESIGN 17), for a Llama
# with a vocabulary that does not divide by the tp ranks (259 rows: the first rank holds one
# more) and a GPT-2 (tied embedding, fused c_attn in 3 blocks, biases):
#   reference: T=1 x D=2, 20 steps uninterrupted (checkpoints at 5, 10, 15, 20);
#   T=2 x D=2 ZeRO-2 (checkpoint at 10) -> resumed at T=1 x D=4 (checkpoint at 15) -> resumed
#   at T=4 x D=1 (GPT-2) or T=2 x D=1 ZeRO-3 (Llama) to step 20;
#   the T=1 x D=4 checkpoint of step 15 resumed at P=2 x D=2 (saving every step), its step 17
#   resumed at S=2 x D=2 (Ulysses) to step 20;
#   the reference's T=1 checkpoint of step 10 resumed at T=2 x D=2;
# every step's loss equals the reference's to <= 1e-5 relative. The last step's checkpoints,
# loaded at another T (and ZeRO-3, and a pipeline's to and from T=2), hold exactly the
# writer's weights (its sha256). `ckpt
# export` of the T=2 checkpoint holds the T=1 run's tensors (names, shapes, values to 1e-6
# relative), and `eval` reads it. A T=2 checkpoint with a tp rank's shard deleted, or a manifest without tp rank
# 1's segments, is refused with the file and what to do.
source "$(dirname "$0")/common.bash"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

recipe() {  # recipe FILE MODEL_LINES
  cat > "$1" <<YAML
model: {$2}
data:
  format: text
  train: [/usr/share/games/fortunes/fortunes]
  val_fraction: 0.0
  seq_len: 32
batch: {micro: 4, global: 8}
optimizer: {lr: 3.0e-3}
steps: 20
seed: 7
checkpoint: {every: 5, keep_last: 10}
logging: {every: 1, eval_every: 0, sample_tokens: 0}
zero: {stage: 2}
YAML
}
recipe "$TMP/llama.yaml" "arch: llama, n_layer: 2, n_head: 4, n_kv_head: 2, d_model: 32, d_ff: 64, vocab_size: 259, max_seq_len: 32"
recipe "$TMP/gpt.yaml" "arch: gpt2, n_layer: 2, n_head: 4, d_model: 32, vocab_size: 256, max_seq_len: 32"

run() {  # run NAME MODEL WORLD DIR [ARGS...]
  local name=$1 model=$2 world=$3 dir=$4; shift 4
  timeout 300 mpirun --oversubscribe --bind-to none -n "$world" "$FDTRAIN" train \
    "$TMP/$model.yaml" "$@" --run-dir "$dir" --no-progress > "$dir.log" 2>&1 \
    || { echo "FAIL: $name"; tail -5 "$dir.log" | sed 's/^/    /'; FAILURES=$((FAILURES+1)); return 1; }
}
# same_losses NAME REFERENCE RUN FIRST LAST: steps FIRST..LAST of RUN's metrics.jsonl match
# REFERENCE's to <= 1e-5 relative (every one present); prints the largest difference.
same_losses() {
  if python3 - "$2/metrics.jsonl" "$3/metrics.jsonl" "$4" "$5" <<'PY'; then
import json, sys
def losses(path):
    out = {}
    for line in open(path):
        r = json.loads(line)
        if "loss" in r and "step" in r:
            out[r["step"]] = r["loss"]
    return out
ref, got = losses(sys.argv[1]), losses(sys.argv[2])
first, last = int(sys.argv[3]), int(sys.argv[4])
worst, at = 0.0, None
for s in range(first, last + 1):
    if s not in ref or s not in got:
        print("  step %d missing" % s); sys.exit(1)
    rel = abs(got[s] - ref[s]) / abs(ref[s])
    if at is None or rel > worst: worst, at = rel, s
print("  steps %d-%d: largest relative loss difference %.3g (step %d)" % (first, last, worst, at))
sys.exit(0 if worst <= 1e-5 else 1)
PY
    echo "ok: $1"
  else
    echo "FAIL: $1: losses differ from the uninterrupted run"; FAILURES=$((FAILURES+1))
  fi
}

# same_tensors NAME A B TOL: safetensors files A and B hold the same tensors (names, shapes)
# and ||a - b|| / ||b|| over all of them is <= TOL.
same_tensors() {
  if python3 - "$2" "$3" "$4" <<'PY'; then
import json, math, struct, sys
def read(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__": continue
        b, e = t["data_offsets"]
        assert t["dtype"] == "F32", t["dtype"]
        out[name] = (t["shape"], struct.unpack("<%df" % ((e - b) // 4), raw[8 + n + b:8 + n + e]))
    return out
a, b = read(sys.argv[1]), read(sys.argv[2])
if sorted(a) != sorted(b):
    print("  tensors differ:", sorted(set(a) ^ set(b))); sys.exit(1)
num = den = 0.0
worst, at = 0.0, None
for name in b:
    if a[name][0] != b[name][0]:
        print("  %s: shape %s vs %s" % (name, a[name][0], b[name][0])); sys.exit(1)
    d = sum((x - y) ** 2 for x, y in zip(a[name][1], b[name][1]))
    w = sum(y * y for y in b[name][1])
    num += d; den += w
    rel = math.sqrt(d / w) if w > 0 else math.sqrt(d)
    if at is None or rel > worst: worst, at = rel, name
total = math.sqrt(num / den)
print("  %d tensors, shapes equal; ||a - b|| / ||b|| = %.3g (largest per tensor %.3g, %s)" % (len(b), total, worst, at))
sys.exit(0 if total <= float(sys.argv[3]) else 1)
PY
    echo "ok: $1"
  else
    echo "FAIL: $1"; FAILURES=$((FAILURES+1))
  fi
}

# same_digest NAME WRITER WORLD DIR [ARGS...]: WRITER's step-20 checkpoint resumed in DIR (at
# steps = 20: nothing left to train) ends with WRITER's weights_sha256.
same_digest() {
  local name=$1 writer=$2 world=$3 dir=$4; shift 4
  run "$name" $M "$world" "$dir" "$@" --resume "$writer/checkpoints/step_00000020" || return
  local want got
  want=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["weights_sha256"])' "$writer/summary.json")
  got=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["weights_sha256"])' "$dir/summary.json")
  if [ -n "$want" ] && [ "$want" = "$got" ]; then
    echo "ok: $name: the same weights (sha256 ${want:0:16})"
  else
    echo "FAIL: $name: weights $got, the writer's $want"; FAILURES=$((FAILURES+1))
  fi
}

for M in llama gpt; do
  run "$M: T=1 x D=2 reference" $M 2 "$TMP/$M-ref" || continue
  run "$M: T=2 x D=2 ZeRO-2" $M 4 "$TMP/$M-t2" parallel.tensor=2 || continue
  same_losses "$M: T=2 x D=2 trains as T=1 x D=2" "$TMP/$M-ref" "$TMP/$M-t2" 1 20
  "$FDTRAIN" ckpt inspect "$TMP/$M-t2/checkpoints/step_00000010" > "$TMP/$M-inspect.txt" 2>&1
  if grep -q "tensor parallel: 2 ranks x 2 replicas" "$TMP/$M-inspect.txt" &&
     grep -q "rank_00003.h5  rank 3 (tp rank 1, replica 1)" "$TMP/$M-inspect.txt" &&
     grep -q "checksums ok" "$TMP/$M-inspect.txt"; then
    echo "ok: $M: ckpt inspect shows the tensor-parallel layout"
  else
    echo "FAIL: $M: ckpt inspect"; sed 's/^/    /' "$TMP/$M-inspect.txt"; FAILURES=$((FAILURES+1))
  fi

  # T=2 x D=2 -> T=1 x D=4 (saves 15) -> T=4 x D=1 or T=2 x D=1 ZeRO-3, to step 20.
  run "$M: resume T=2 at T=1 x D=4" $M 4 "$TMP/$M-t1d4" batch.micro=2 \
    --resume "$TMP/$M-t2/checkpoints/step_00000010" || continue
  same_losses "$M: T=2 x D=2 -> T=1 x D=4, steps 11-15" "$TMP/$M-ref" "$TMP/$M-t1d4" 11 15
  if [ $M = gpt ]; then
    run "$M: resume T=1 at T=4 x D=1" $M 4 "$TMP/$M-last" batch.micro=8 parallel.tensor=4 \
      --resume "$TMP/$M-t1d4/checkpoints/step_00000015" || continue
    same_losses "$M: T=1 x D=4 -> T=4 x D=1, steps 16-20" "$TMP/$M-ref" "$TMP/$M-last" 16 20
  else
    run "$M: resume T=1 at T=2 x D=1 ZeRO-3" $M 2 "$TMP/$M-last" batch.micro=8 parallel.tensor=2 \
      zero.stage=3 --resume "$TMP/$M-t1d4/checkpoints/step_00000015" || continue
    same_losses "$M: T=1 x D=4 -> T=2 x D=1 ZeRO-3, steps 16-20" "$TMP/$M-ref" "$TMP/$M-last" 16 20
  fi

  # The issue's round trip: T=2 x D=2 -> T=1 x D=4 (above, to step 15) -> P=2 x D=2 (saving
  # every step) -> S=2 x D=2 (Ulysses: the weights whole, ZeRO over the D x S ranks) from the
  # pipeline's step 17, each leg continuing the uninterrupted run's losses.
  if run "$M: resume T=1 x D=4 at P=2 x D=2" $M 4 "$TMP/$M-p2d2" parallel.pipeline=2 \
    batch.micro=2 batch.accumulation=2 checkpoint.every=1 --resume "$TMP/$M-t1d4/checkpoints/step_00000015"; then
    same_losses "$M: T=2 x D=2 -> T=1 x D=4 -> P=2 x D=2, steps 16-20" "$TMP/$M-ref" "$TMP/$M-p2d2" 16 20
    if run "$M: resume P=2 x D=2 at S=2 x D=2" $M 4 "$TMP/$M-s2" parallel.sequence=2 \
      --resume "$TMP/$M-p2d2/checkpoints/step_00000017"; then
      same_losses "$M: ... -> P=2 x D=2 -> S=2 x D=2, steps 18-20" "$TMP/$M-ref" "$TMP/$M-s2" 18 20
    fi
  fi

  # A T=1 checkpoint resumed at T=2.
  run "$M: resume T=1 at T=2 x D=2" $M 4 "$TMP/$M-up" parallel.tensor=2 \
    --resume "$TMP/$M-ref/checkpoints/step_00000010" || continue
  same_losses "$M: T=1 x D=2 -> T=2 x D=2, steps 11-20" "$TMP/$M-ref" "$TMP/$M-up" 11 20

  # Exactly the weights: a resume at another T of a last step's checkpoint trains nothing and
  # ends with the weights' digest (over the whole tensors), which is the writer's.
  same_digest "$M: the T=2 checkpoint loaded at T=1 x D=1" "$TMP/$M-t2" 1 "$TMP/$M-t2-at1" batch.micro=8
  same_digest "$M: the T=1 checkpoint loaded at T=2 x D=2" "$TMP/$M-ref" 4 "$TMP/$M-ref-at2" parallel.tensor=2
  if [ $M = gpt ]; then
    same_digest "$M: the T=2 checkpoint loaded at T=4 x D=1 ZeRO-3" "$TMP/$M-t2" 4 \
      "$TMP/$M-t2-at4" batch.micro=8 parallel.tensor=4 zero.stage=3
    # A pipeline's checkpoint (each stage's shards hold its segments) composes both ways.
    same_digest "$M: the T=2 checkpoint loaded at P=2 x D=2" "$TMP/$M-t2" 4 "$TMP/$M-t2-atp2" \
      parallel.pipeline=2
    if run "$M: P=2 x D=2" $M 4 "$TMP/$M-p2" parallel.pipeline=2; then
      same_digest "$M: the P=2 checkpoint loaded at T=2 x D=1" "$TMP/$M-p2" 2 "$TMP/$M-p2-at2" \
        batch.micro=8 parallel.tensor=2
      same_digest "$M: the P=2 checkpoint loaded at S=2 x D=2" "$TMP/$M-p2" 4 "$TMP/$M-p2-ats2" \
        parallel.sequence=2
    fi
  fi

  # The export of the T=2 checkpoint holds the T=1 run's tensors at the same step (to 1e-6:
  # the runs' sums differ in order, and Adam's steps amplify that a little).
  for k in t2 ref; do
    "$FDTRAIN" ckpt export "$TMP/$M-$k/checkpoints/step_00000005" --out "$TMP/$M-$k.safetensors" \
      > "$TMP/$M-$k-export.log" 2>&1 \
      || { echo "FAIL: $M: export of $k"; sed 's/^/    /' "$TMP/$M-$k-export.log"; FAILURES=$((FAILURES+1)); }
  done
  same_tensors "$M: the T=2 checkpoint's export holds the T=1 run's tensors" \
    "$TMP/$M-t2.safetensors" "$TMP/$M-ref.safetensors" 1e-6
  # --hf-dir too (the Llama's 259 rows: the uneven split assembled).
  for k in t2 ref; do
    "$FDTRAIN" ckpt export "$TMP/$M-$k/checkpoints/step_00000005" --hf-dir "$TMP/$M-$k-hf" \
      > "$TMP/$M-$k-hf.log" 2>&1 \
      || { echo "FAIL: $M: --hf-dir export of $k"; sed 's/^/    /' "$TMP/$M-$k-hf.log"; FAILURES=$((FAILURES+1)); }
  done
  same_tensors "$M: the T=2 checkpoint's --hf-dir holds the T=1 run's tensors" \
    "$TMP/$M-t2-hf/model.safetensors" "$TMP/$M-ref-hf/model.safetensors" 1e-6
  if "$FDTRAIN" eval "$TMP/$M-t2/checkpoints/step_00000010" --data /usr/share/games/fortunes/riddles \
       --seq-len 32 > "$TMP/$M-eval.log" 2>&1 && grep -q "loss" "$TMP/$M-eval.log"; then
    echo "ok: $M: eval reads the T=2 checkpoint"
  else
    echo "FAIL: $M: eval of the T=2 checkpoint"; sed 's/^/    /' "$TMP/$M-eval.log"; FAILURES=$((FAILURES+1))
  fi
done

# LoRA at T=2 (the adapters split as their base): the T=2 checkpoint loads at T=1 with the
# same weights, and its PEFT adapter holds the T=1 run's (to 1e-5: 20 steps of other sums).
M=gpt
if [ -f "$TMP/gpt-ref.safetensors" ]; then
  L=(model.init_from="$TMP/gpt-ref.safetensors" "lora={r: 4, alpha: 8, targets: [c_attn, c_proj, c_fc]}")
  if run "LoRA T=2 x D=1" gpt 2 "$TMP/lora-t2" "${L[@]}" batch.micro=8 parallel.tensor=2 &&
     run "LoRA T=1 x D=2" gpt 2 "$TMP/lora-t1" "${L[@]}"; then
    same_losses "LoRA: T=2 x D=1 trains as T=1 x D=2" "$TMP/lora-t1" "$TMP/lora-t2" 1 20
    same_digest "LoRA: the T=2 checkpoint loaded at T=1 x D=1" "$TMP/lora-t2" 1 "$TMP/lora-at1" \
      "${L[@]}" batch.micro=8
    for k in t1 t2; do
      "$FDTRAIN" ckpt export "$TMP/lora-$k" --lora-adapter "$TMP/adapter-$k" > "$TMP/adapter-$k.log" 2>&1 \
        || { echo "FAIL: --lora-adapter of $k"; sed 's/^/    /' "$TMP/adapter-$k.log"; FAILURES=$((FAILURES+1)); }
    done
    same_tensors "LoRA: the T=2 checkpoint's PEFT adapter holds the T=1 run's" \
      "$TMP/adapter-t2/adapter_model.safetensors" "$TMP/adapter-t1/adapter_model.safetensors" 1e-5
  fi
fi

# Damaged tensor-parallel checkpoints are refused with the file and what to do.
if [ -d "$TMP/gpt-t2/checkpoints/step_00000010" ]; then
  cp -r "$TMP/gpt-t2/checkpoints/step_00000010" "$TMP/missing"
  rm "$TMP/missing/rank_00001.h5"  # tp rank 1, replica 0
  expect_fail 2 "rank_00001.h5 is missing.*resume from another checkpoint" ckpt inspect "$TMP/missing"
  expect_fail 2 "rank_00001.h5 is missing" train "$TMP/gpt.yaml" batch.micro=8 \
    --resume "$TMP/missing" --run-dir "$TMP/missing-run" --no-progress
  cp -r "$TMP/gpt-t2/checkpoints/step_00000010" "$TMP/no-tp1"
  python3 - "$TMP/no-tp1/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
m["segments"] = [s for s in m["segments"] if s.get("tp", 0) != 1]
json.dump(m, open(sys.argv[1], "w"), indent=2)
PY
  expect_fail 2 "rank_00001.h5: segment 'embed' of tp rank 1 is not in the manifest.*resume from an earlier checkpoint" \
    ckpt export "$TMP/no-tp1" --out "$TMP/no-tp1.safetensors"
  cp -r "$TMP/gpt-t2/checkpoints/step_00000010" "$TMP/numel"
  python3 - "$TMP/numel/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
for s in m["segments"]:
    if s.get("tp") == 1 and s["name"] == "h.1": s["numel"] += 64
json.dump(m, open(sys.argv[1], "w"), indent=2)
PY
  expect_fail 2 "segment_numel of 'h.1' is .* but the manifest .* says" \
    train "$TMP/gpt.yaml" batch.micro=8 --resume "$TMP/numel" --run-dir "$TMP/numel-run" --no-progress
fi
finish
