#!/usr/bin/env bash
# Preference training end to end (docs/OBJECTIVES.md), on a tiny Llama with the chatml-bytes
# tokenizer and pairs made here (conversational and standard rows):
#   - DPO under LoRA: the reference is the base with the adapters off, so step 1's policy equals
#     it: loss ln 2 and every reward 0; metrics.jsonl and summary.json carry TRL's metrics; the
#     reference log-probs are kept in RUN/cache/ and a resume reads them instead of computing;
#   - learning: a run on 16 pairs ends with rewards/accuracies above 0.9 on them;
#   - the step-1 loss and metrics equal across splits of the same step, to 1e-5 relative:
#     (micro 8, acc 1, n 1), (micro 1, acc 8, n 1), (micro 2, acc 2, n 2, ZeRO-2), a pipeline of
#     2 stages, for DPO and ORPO (whose NLL term is normalised over the step's chosen tokens);
#   - full fine-tuning with objective.reference: a directory of other weights (built before the
#     training model and freed), every objective and DPO loss type running;
#   - the estimate: under LoRA the reference costs no parameter memory (frozen = the base only,
#     measured equal);
#   - hostile: a chosen answer equal to the rejected one (reported, finite), an empty answer, a
#     prompt longer than the limit (dropped, counted), a reference of another vocabulary or
#     family (refused by name), an objective without preference data and the reverse, a
#     preference file given to format chat, keys an objective does not use, device cuda.
source "$(dirname "$0")/common.bash"
MPI=(timeout 300 mpirun --oversubscribe --bind-to none)
TOK=$(pwd)/recipes/tokenizers/chatml-bytes

write_preference "$TMP"
R=$TMP/dpo.yaml

metric() {  # metric RUN STEP KEY: the value of KEY in RUN's metrics line of STEP
  python3 -c "import json,sys
for l in open(sys.argv[1] + '/metrics.jsonl'):
    j = json.loads(l)
    if j['step'] == int(sys.argv[2]): print(j[sys.argv[3]]); break" "$@"
}
check() {  # check LABEL PYTHON-CONDITION: the condition (over nothing but literals) holds
  if python3 -c "import sys, math; sys.exit(0 if ($2) else 1)"; then echo "ok: $1"; else
    echo "FAIL: $1 ($2)"; FAILURES=$((FAILURES + 1)); fi
}

# --- DPO under LoRA: step 1's policy is the reference --------------------------------------
"$FDTRAIN" train "$R" --run-dir "$TMP/lora" --no-progress > "$TMP/lora.log" 2>&1 ||
  { echo "FAIL: DPO LoRA run"; tail -20 "$TMP/lora.log"; exit 1; }
check "step 1 loss is ln 2" "abs($(metric "$TMP/lora" 1 loss) - math.log(2)) < 1e-6"
for k in rewards/chosen rewards/rejected rewards/margins; do
  check "step 1 $k is 0" "abs($(metric "$TMP/lora" 1 $k)) < 1e-9"
done
check "step 1 rewards/accuracies is 0 (ties count 0)" "$(metric "$TMP/lora" 1 rewards/accuracies) == 0"
check "later steps move the rewards" "abs($(metric "$TMP/lora" 3 rewards/margins)) > 0"
check "eval metrics at step 2" "$(metric "$TMP/lora" 2 eval_rewards/accuracies) >= 0"
python3 - "$TMP/lora/summary.json" <<'PY' && echo "ok: summary.json objective" || { echo "FAIL: summary.json objective"; FAILURES=$((FAILURES + 1)); }
import json, sys
s = json.load(open(sys.argv[1]))
o = s["objective"]
assert o["name"] == "dpo" and o["loss_type"] == "sigmoid", o
assert set(o["train"]) >= {"rewards/chosen", "rewards/rejected", "rewards/accuracies",
                           "rewards/margins", "logps/chosen", "logps/rejected"}, o
assert o["eval"] is not None and o["reference"]["computed"] is True, o
assert s["data"]["pairs"]["train"] == 16, s["data"]
PY
ls "$TMP"/lora/cache/reference_logps-*.bin > /dev/null 2>&1 && echo "ok: reference cache kept" ||
  { echo "FAIL: no reference cache in RUN/cache"; FAILURES=$((FAILURES + 1)); }
grep -q "reference log-probs of 16 + 4 pairs computed" "$TMP/lora.log" && echo "ok: computed once" ||
  { echo "FAIL: no 'computed' line"; FAILURES=$((FAILURES + 1)); }
"$FDTRAIN" train "$R" steps=4 --run-dir "$TMP/lora" --resume auto --no-progress > "$TMP/resume.log" 2>&1 ||
  { echo "FAIL: resume"; tail -5 "$TMP/resume.log"; FAILURES=$((FAILURES + 1)); }
grep -q "reference log-probs of 16 + 4 pairs read from" "$TMP/resume.log" && echo "ok: resume reads the cache" ||
  { echo "FAIL: the resume did not read the cache"; grep -i reference "$TMP/resume.log"; FAILURES=$((FAILURES + 1)); }
python3 -c "import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))['objective']['reference']['computed'] is False else 1)" \
  "$TMP/lora/summary.json" && echo "ok: summary says read" || { echo "FAIL: summary reference.computed"; FAILURES=$((FAILURES + 1)); }

# --- learning: 16 pairs, every step all of them ----------------------------------------------
"$FDTRAIN" train "$R" steps=40 batch.micro=16 checkpoint.every=0 checkpoint.at_end=false \
  logging.eval_every=0 --run-dir "$TMP/learn" --no-progress > "$TMP/learn.log" 2>&1 ||
  { echo "FAIL: learning run"; tail -5 "$TMP/learn.log"; exit 1; }
check "rewards/accuracies at step 40 above 0.9" "$(metric "$TMP/learn" 40 rewards/accuracies) > 0.9"
check "margins grew" "$(metric "$TMP/learn" 40 rewards/margins) > 0.5"

# --- split invariance of step 1 (fp32), DPO and ORPO ----------------------------------------
split() {  # split NAME N ARGS...: one step, its metrics line
  local name=$1 n=$2; shift 2
  "${MPI[@]}" -n "$n" "$FDTRAIN" train "$R" steps=1 checkpoint.every=0 checkpoint.at_end=false \
    logging.eval_every=0 "$@" --run-dir "$TMP/$name" --no-progress > "$TMP/$name.log" 2>&1 ||
    { echo "FAIL: split $name"; tail -5 "$TMP/$name.log"; FAILURES=$((FAILURES + 1)); }
}
same_step1() {  # same_step1 A B LABEL: every number of step 1 of A and B within 1e-5 relative
  python3 - "$TMP/$1/metrics.jsonl" "$TMP/$2/metrics.jsonl" "$3" <<'PY' && echo "ok: $3" || FAILURES=$((FAILURES + 1))
import json, sys
a, b = (json.loads(open(p).readline()) for p in sys.argv[1:3])
# Training metrics only: an evaluation reads logging.eval_batches micro-batches, so its pairs
# depend on batch.micro.
keys = [k for k in a if not k.startswith("eval_") and
        (k == "loss" or "/" in k or k in ("nll_loss", "log_odds_ratio", "log_odds_chosen"))]
worst = 0.0
for k in keys:
    d = abs(a[k] - b[k]) / max(abs(b[k]), 1e-12) if a[k] != b[k] else 0.0
    worst = max(worst, d)
    if d > 1e-5:
        print(f"FAIL: {sys.argv[3]}: {k} {a[k]!r} vs {b[k]!r} ({d:.1e})"); sys.exit(1)
print(f"    {sys.argv[3]}: {len(keys)} values, worst relative difference {worst:.1e}")
PY
}
# A reference directory: the tiny model pre-trained 3 steps on text, exported.
cat > "$TMP/pre.yaml" <<YAML
model: {arch: llama, n_layer: 2, n_head: 2, n_kv_head: 1, d_model: 32, d_ff: 64, vocab_size: 320,
        max_seq_len: 128}
data: {format: text, train: [/usr/share/games/fortunes/fortunes], val_fraction: 0.0, tokenizer: $TOK,
       seq_len: 32}
optimizer: {lr: 1.0e-2}
steps: 3
logging: {every: 1, sample_tokens: 0}
YAML
"$FDTRAIN" train "$TMP/pre.yaml" --run-dir "$TMP/pre" --no-progress > "$TMP/pre.log" 2>&1 &&
  "$FDTRAIN" ckpt export "$TMP/pre" --hf-dir "$TMP/ref" >> "$TMP/pre.log" 2>&1 ||
  { echo "FAIL: making the reference directory"; tail -5 "$TMP/pre.log"; exit 1; }

# Full fine-tuning from a random init against that reference (DPO), and ORPO (no reference).
for obj in "objective.reference=$TMP/ref" "objective.name=orpo"; do
  case $obj in *orpo) tag=orpo ;; *) tag=dpo ;; esac
  split "$tag-a" 1 "$obj" lora=null batch.micro=8 batch.accumulation=1
  split "$tag-b" 1 "$obj" lora=null batch.micro=1 batch.accumulation=8
  split "$tag-c" 2 "$obj" lora=null batch.micro=2 batch.accumulation=2 zero.stage=2
  split "$tag-d" 2 "$obj" lora=null batch.micro=2 batch.accumulation=4 parallel.pipeline=2
  same_step1 "$tag-b" "$tag-a" "$tag: micro 1 x acc 8 = micro 8"
  same_step1 "$tag-c" "$tag-a" "$tag: micro 2 x acc 2 x n 2, ZeRO-2 = micro 8"
  same_step1 "$tag-d" "$tag-a" "$tag: pipeline of 2 stages = micro 8"
done
check "dpo against another reference: step 1 is not ln 2" "abs($(metric "$TMP/dpo-a" 1 loss) - math.log(2)) > 1e-4"
grep -q "computed with objective.reference" "$TMP/dpo-a.log" && echo "ok: reference from the directory" ||
  { echo "FAIL: the log does not name the reference directory"; FAILURES=$((FAILURES + 1)); }

# Every DPO loss type and SimPO run and report finite numbers.
for o in "objective.loss_type=ipo" "objective.loss_type=hinge" \
         "objective.loss_type=robust objective.label_smoothing=0.1" \
         "objective.name=simpo objective.gamma=0.5" \
         "objective.name=simpo objective.cpo_alpha=0.5 objective.label_smoothing=0.1 objective.beta=2"; do
  i=$((${i:-0} + 1))
  # shellcheck disable=SC2086
  split "obj-$i" 1 $o batch.micro=4
  check "$o: finite loss" "math.isfinite($(metric "$TMP/obj-$i" 1 loss))"
done
check "simpo with cpo_alpha reports nll_loss" "$(metric "$TMP/obj-5" 1 nll_loss) > 0"

# --- fdtrain runs shows the reward accuracy --------------------------------------------------
runs=$("$FDTRAIN" runs "$TMP/lora" "$TMP/learn" 2>&1)
grep -q "reward acc" <<<"$runs" && echo "ok: runs has a reward accuracy column" ||
  { echo "FAIL: fdtrain runs"; echo "$runs"; FAILURES=$((FAILURES + 1)); }
"$FDTRAIN" runs "$TMP/learn" --json | python3 -c "import json,sys; r=json.load(sys.stdin)[0]
sys.exit(0 if r['rewards_accuracies'] > 0.9 else 1)" && echo "ok: runs --json rewards_accuracies" ||
  { echo "FAIL: runs --json rewards_accuracies"; FAILURES=$((FAILURES + 1)); }

# --- the rest of a recipe works unchanged: QLoRA, ZeRO-3, checkpointing, bf16, offload -------
mkdir -p "$TMP/nvme"
split "qlora" 2 model.quantize.type=nf4 zero.stage=3 precision=bf16 \
  activation_checkpointing.layers=all zero.offload_optimizer.device=nvme \
  zero.offload_optimizer.path=$TMP/nvme batch.micro=2 batch.accumulation=2
check "QLoRA + ZeRO-3 + checkpointing + bf16 + NVMe offload: ln 2 at step 1" \
  "abs($(metric "$TMP/qlora" 1 loss) - math.log(2)) < 1e-6"
split "dpo-z3" 2 "objective.reference=$TMP/ref" lora=null zero.stage=3 batch.micro=4
same_step1 "dpo-z3" "dpo-a" "dpo: ZeRO-3 over 2 ranks (the reference built partitioned) = micro 8"

# --- the reference cache and resume keep the reference right ---------------------------------
# A changed model setting (not in the shape) is another key: under LoRA step 1 is still ln 2.
"$FDTRAIN" train "$R" steps=1 model.norm_eps=0.5 --run-dir "$TMP/lora" --overwrite --no-progress \
  > "$TMP/eps.log" 2>&1 || { echo "FAIL: norm_eps run"; tail -3 "$TMP/eps.log"; FAILURES=$((FAILURES + 1)); }
check "a changed norm_eps recomputes the reference (step 1 ln 2)" \
  "abs($(metric "$TMP/lora" 1 loss) - math.log(2)) < 1e-6"
# Full fine-tuning against its initial weights: a resume with another seed is refused.
"$FDTRAIN" train "$R" lora=null steps=1 checkpoint.every=1 --run-dir "$TMP/ft" --no-progress > "$TMP/ft.log" 2>&1 ||
  { echo "FAIL: full fine-tuning run"; tail -3 "$TMP/ft.log"; FAILURES=$((FAILURES + 1)); }
expect_fail 2 "initial weights the run started from \(a random init with seed 3\), but the recipe now says a random init with seed 4" \
  train "$R" lora=null steps=2 seed=4 --run-dir "$TMP/ft" --resume auto
# A relative objective.reference is recorded absolute.
(cd "$TMP" && "$FDTRAIN" train "$R" lora=null steps=1 objective.reference=ref --run-dir "$TMP/rel" \
  --no-progress > "$TMP/rel.log" 2>&1) || { echo "FAIL: relative reference"; tail -3 "$TMP/rel.log"; FAILURES=$((FAILURES + 1)); }
grep -q "reference: \"\?$TMP/ref" "$TMP/rel/config.yaml" && echo "ok: objective.reference recorded absolute" ||
  { echo "FAIL: config.yaml's objective.reference"; grep reference: "$TMP/rel/config.yaml"; FAILURES=$((FAILURES + 1)); }
# A reference whose norm or RoPE settings differ from the policy's is refused by name.
cp -r "$TMP/ref" "$TMP/ref_eps"
python3 -c "import json,sys; p=sys.argv[1]; d=json.load(open(p)); d['rms_norm_eps']=0.5; json.dump(d, open(p,'w'))" "$TMP/ref_eps/config.json"
expect_fail 2 "objective.reference.*norm_eps 0.5" train "$R" lora=null objective.reference=$TMP/ref_eps --run-dir "$TMP/h13"
# IPO's loss starts at (1 / (2 beta))^2: no max_loss default stops it.
split "ipo-small-beta" 1 objective.loss_type=ipo objective.beta=0.01 batch.micro=4
check "IPO with beta 0.01 trains (loss 2500 at step 1)" "abs($(metric "$TMP/ipo-small-beta" 1 loss) - 2500) < 1"
# RUN/cache that is a file: the run goes on, says the values were not kept, summary null.
mkdir -p "$TMP/nocache" && echo x > "$TMP/nocache/cache"
"$FDTRAIN" train "$R" steps=1 --run-dir "$TMP/nocache" --no-progress > "$TMP/nocache.log" 2>&1 ||
  { echo "FAIL: run with RUN/cache a file"; tail -3 "$TMP/nocache.log"; FAILURES=$((FAILURES + 1)); }
grep -q "were not kept (cannot create" "$TMP/nocache.log" && echo "ok: cache not kept, said so" ||
  { echo "FAIL: no warning"; FAILURES=$((FAILURES + 1)); }
python3 -c "import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))['objective']['reference']['cache'] is None else 1)" \
  "$TMP/nocache/summary.json" && echo "ok: summary cache null" || { echo "FAIL: summary cache"; FAILURES=$((FAILURES + 1)); }

# --- the estimate: under LoRA the reference costs nothing ------------------------------------
est=$("$FDTRAIN" estimate "$R" --json 2>&1) || { echo "FAIL: estimate"; echo "$est"; FAILURES=$((FAILURES + 1)); }
python3 - "$TMP/lora/summary.json" <<PY && echo "ok: estimate = measured, reference 0 bytes" || FAILURES=$((FAILURES + 1))
import json, sys
e = json.loads("""$est""")
s = json.load(open(sys.argv[1]))
st = e["stages"][e["recipe_stage"]]
assert e["objective"]["reference_param_bytes"] == 0 and "adapters off" in e["objective"]["reference"], e["objective"]
for k in ("params", "grads", "master", "optimizer", "frozen", "activations"):
    if st[k] != s["memory"][k]:
        print(f"FAIL: estimate {k} {st[k]} vs measured {s['memory'][k]}"); sys.exit(1)
base = sum(1 for _ in [0])
print(f"    frozen {st['frozen']} bytes (the base alone), activations {st['activations']}")
PY

# --- hostile ---------------------------------------------------------------------------------
python3 - "$TMP" <<'PY'
import json, sys
tmp = sys.argv[1]
def conv(p, c, r):
    return {"prompt": [{"role": "user", "content": p}], "chosen": [{"role": "assistant", "content": c}],
            "rejected": [{"role": "assistant", "content": r}]}
with open(f"{tmp}/odd.jsonl", "w") as f:
    f.write(json.dumps(conv("Say red.", "red is fine.", "red is fine.")) + "\n")  # identical
    f.write(json.dumps(conv("Say blue.", "", "no blue!")) + "\n")                 # empty answer
    f.write(json.dumps({"prompt": "", "chosen": "x", "rejected": ""}) + "\n")    # empty standard
    f.write(json.dumps(conv("long " * 40, "ok", "no")) + "\n")                     # prompt too long
    for w in ["gold", "gray", "pink", "teal"]:
        f.write(json.dumps(conv(f"Say {w}.", f"{w} is fine.", f"no {w}!")) + "\n")
PY
expect_fail 2 "odd.jsonl:3: the prompt encodes to no tokens" train "$R" data.train="[$TMP/odd.jsonl]" \
  data.val=[] data.val_fraction=0 --run-dir "$TMP/odd"
"$FDTRAIN" train "$R" data.train="[$TMP/odd.jsonl]" data.val=[] data.val_fraction=0 steps=2 \
  data.on_bad_record=skip logging.eval_every=0 checkpoint.every=0 --run-dir "$TMP/odd" \
  --no-progress > "$TMP/odd.log" 2>&1 ||
  { echo "FAIL: odd pairs run"; tail -5 "$TMP/odd.log"; FAILURES=$((FAILURES + 1)); }
check "odd pairs: finite loss" "math.isfinite($(metric "$TMP/odd" 2 loss))"
python3 - "$TMP/odd/summary.json" <<'PY' && echo "ok: odd pairs counted in summary.json" || FAILURES=$((FAILURES + 1))
import json, sys
d = json.load(open(sys.argv[1]))["data"]
print("    data:", {k: d[k] for k in d if k not in ("skip_reasons",)})
assert d["skipped_records"] == 1, d
PY
grep -Eiq "identical|equal" "$TMP/odd.log" && echo "ok: identical pair reported" ||
  { echo "FAIL: the identical pair is not reported"; FAILURES=$((FAILURES + 1)); }
grep -Eiq "dropped|max_length" "$TMP/odd.log" && echo "ok: long prompt reported" ||
  { echo "FAIL: the dropped prompt is not reported"; FAILURES=$((FAILURES + 1)); }
expect_fail 2 "objective.reference.*vocab_size" train "$R" lora=null \
  objective.reference=tests/golden/llama/llama3 --run-dir "$TMP/h1"
expect_fail 2 "objective.reference.*(arch|vocab_size)" train "$R" lora=null \
  objective.reference=tests/golden/llama/qwen2 --run-dir "$TMP/h2"
expect_fail 2 "objective.reference.*not a directory" train "$R" objective.reference=$TMP/nope --run-dir "$TMP/h3"
expect_fail 2 "objective.*data.format: preference" train "$R" data.format=chat --run-dir "$TMP/h4"
expect_fail 2 "preference" train "$R" objective=null data.format=chat --run-dir "$TMP/h5"
expect_fail 2 "data.format.*objective" train "$R" objective=null --run-dir "$TMP/h6"
expect_fail 2 "objective.gamma.*not used by objective.name dpo" train "$R" objective.gamma=1 --run-dir "$TMP/h7"
expect_fail 2 "objective.label_smoothing.*robust" train "$R" objective.label_smoothing=0.1 --run-dir "$TMP/h8"
expect_fail 2 "objective.reference.*reference-free" train "$R" objective.name=orpo objective.reference=$TMP/ref --run-dir "$TMP/h9"
expect_fail 2 "objective.name.*one of dpo, simpo, orpo" train "$R" objective.name=kto --run-dir "$TMP/h10"
expect_fail 2 "device.*CPU" train "$R" device=cuda --run-dir "$TMP/h11"
expect_fail 2 "objective.beta" train "$R" objective.beta=0 --run-dir "$TMP/h12"

finish
