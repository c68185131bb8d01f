#!/usr/bin/env bash
# fdtrain estimate: every ZeRO stage side by side, a --json form that parses,
# model states equal to what a real 4-rank run measures (summary.json
# 'memory': params + grads + master + optimizer) for stages 2 and 3, and a bad
# --world-size refused with exit 2. Needs no jq or python: grep and sed only.
source "$(dirname "$0")/common.bash"

Q="$(dirname "$0")/../../recipes/quickstart.yaml"
TINY="data.train=[/usr/share/games/fortunes/fortunes]"

check() {  # check DESCRIPTION CONDITION...: one ok/FAIL line
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; FAILURES=$((FAILURES + 1)); fi
}

# The human-readable table: four stages, the recipe's own (2) marked, every category.
out=$("$FDTRAIN" estimate "$Q" "$TINY" --world-size 4 2>&1); rc=$?
check "estimate exits 0" [ "$rc" -eq 0 ]
check "header names stages 0-3, the recipe's stage 2 marked" \
  grep -Eq '^ +stage 0 +stage 1 +\*stage 2 +stage 3$' <<<"$out"
for row in params grads master "optimizer \\(Adam m\\+v\\)" "= model states" activations \
  "comm buffers" total "comm per step"; do
  check "row '$row' has four values" grep -Eq "^$row( +[0-9.]+( [KMG]iB)?){4}$" <<<"$out"
done
check "paper formulas" grep -q '16Ψ  *8Ψ + 8Ψ/N  *4Ψ + 12Ψ/N  *16Ψ/N' <<<"$out"
check "Ψ and P are printed" grep -Eq '^Ψ = 858,880 parameters; P = 858,880 padded at N = 4' <<<"$out"
check "assumptions are stated" grep -q '^Assumptions:' <<<"$out"

# --json: one object; four stage objects; numbers extracted with sed.
json=$("$FDTRAIN" estimate "$Q" "$TINY" --world-size 4 --json 2>&1); rc=$?
flat=$(tr -d ' \n' <<<"$json")
check "--json exits 0" [ "$rc" -eq 0 ]
check "--json is one object" grep -Eq '^\{.*\}$' <<<"$flat"
check "--json has four stages" [ "$(grep -o '"stage":' <<<"$flat" | wc -l)" -eq 4 ]
check "--json world_size 4" grep -q '"world_size":4,' <<<"$flat"
stage_field() {  # stage_field STAGE KEY: an integer of one stage object
  sed -E "s/.*\\{\"stage\":$1,[^}]*\"$2\":([0-9]+).*/\\1/" <<<"$flat"
}
est_P=$(sed -E 's/.*"padded_params":([0-9]+).*/\1/' <<<"$flat")

# A real 4-rank run per stage; its measured model states must equal the estimate.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for stage in 2 3; do
  run="$TMP/run$stage"
  log=$(timeout 300 mpirun --oversubscribe --bind-to none -n 4 "$FDTRAIN" train "$Q" "$TINY" \
        steps=2 zero.stage=$stage logging.sample_tokens=0 logging.eval_batches=1 \
        --run-dir "$run" --no-progress 2>&1); rc=$?
  if [ $rc -ne 0 ] || [ ! -f "$run/summary.json" ]; then
    echo "FAIL: 4-rank run at stage $stage exited $rc"; echo "$log" | sed 's/^/    /'
    FAILURES=$((FAILURES + 1)); continue
  fi
  s=$(tr -d ' \n' < "$run/summary.json")
  mem=$(sed -E 's/.*"memory":\{([^}]*)\}.*/\1/' <<<"$s")
  field() { sed -E "s/.*\"$1\":([0-9]+).*/\\1/" <<<"$mem"; }
  measured=$(( $(field params) + $(field grads) + $(field master) + $(field optimizer) ))
  estimated=$(stage_field $stage model_states)
  run_P=$(sed -E 's/.*"padded_params":([0-9]+).*/\1/' <<<"$s")
  check "stage $stage at N = 4: measured model states $measured == estimate $estimated" \
    [ "$measured" = "$estimated" ]
  check "stage $stage at N = 4: padded params $run_P == estimate $est_P" [ "$run_P" = "$est_P" ]
  for k in params grads optimizer; do
    check "stage $stage: measured $k $(field $k) == estimate $(stage_field $stage $k)" \
      [ "$(field $k)" = "$(stage_field $stage $k)" ]
  done
  comm=$(sed -E 's/.*"comm_bytes_per_step":([0-9]+).*/\1/' <<<"$s")
  check "stage $stage: comm bytes per step $comm == estimate $(stage_field $stage comm_bytes_per_step)" \
    [ "$comm" = "$(stage_field $stage comm_bytes_per_step)" ]
done

# bf16, stage 3, every other block checkpointed, at N = 4: model states (c = 2,
# fp32 master), activations (16-bit, recomputed blocks), comm buffers (the
# full 16-bit parameters gathered for the weights digest) and comm bytes per
# step (2 bytes an element) equal the estimate to the byte.
B16=(precision=bf16 zero.stage=3 "activation_checkpointing.layers={every: 2}")
json=$("$FDTRAIN" estimate "$Q" "$TINY" "${B16[@]}" --world-size 4 --json 2>&1); rc=$?
flat=$(tr -d ' \n' <<<"$json")
check "bf16 --json exits 0" [ "$rc" -eq 0 ]
check "bf16 --json precision and checkpointed layers" \
  grep -q '"precision":"bf16","compute_bytes":2,"checkpointed_layers":\[0,2\]' <<<"$flat"
check "bf16 paper formulas" grep -q '"paper_formula":"2Ψ+14Ψ/N"' <<<"$flat"
run="$TMP/run_bf16"
log=$(timeout 300 mpirun --oversubscribe --bind-to none -n 4 "$FDTRAIN" train "$Q" "$TINY" \
      steps=2 "${B16[@]}" logging.sample_tokens=0 logging.eval_batches=1 \
      --run-dir "$run" --no-progress 2>&1); rc=$?
if [ $rc -ne 0 ] || [ ! -f "$run/summary.json" ]; then
  echo "FAIL: bf16 4-rank run at stage 3 exited $rc"; echo "$log" | sed 's/^/    /'
  FAILURES=$((FAILURES + 1))
else
  s=$(tr -d ' \n' < "$run/summary.json")
  mem=$(sed -E 's/.*"memory":\{([^}]*)\}.*/\1/' <<<"$s")
  field() { sed -E "s/.*\"$1\":([0-9]+).*/\\1/" <<<"$mem"; }
  for k in params grads master optimizer activations; do
    check "bf16 stage 3: measured $k $(field $k) == estimate $(stage_field 3 $k)" \
      [ "$(field $k)" = "$(stage_field 3 $k)" ]
  done
  check "bf16 stage 3: measured comm $(field comm) == estimate $(stage_field 3 comm_buffers)" \
    [ "$(field comm)" = "$(stage_field 3 comm_buffers)" ]
  comm=$(sed -E 's/.*"comm_bytes_per_step":([0-9]+).*/\1/' <<<"$s")
  check "bf16 stage 3: comm bytes per step $comm == estimate $(stage_field 3 comm_bytes_per_step)" \
    [ "$comm" = "$(stage_field 3 comm_bytes_per_step)" ]
fi
# The human-readable form names the precision, the checkpointed blocks and the paper's bf16 figures.
out=$("$FDTRAIN" estimate "$Q" "$TINY" "${B16[@]}" --world-size 4 2>&1)
check "bf16 table header" grep -q 'precision bf16; 2 of 4 blocks checkpointed' <<<"$out"
check "bf16 paper formulas in the table" grep -q '16Ψ  *4Ψ + 12Ψ/N  *2Ψ + 14Ψ/N  *16Ψ/N' <<<"$out"

# zero.reduce_dtype: bf16 (16-bit sums; on MPI every rank's bf16 chunk comes to
# its owner, which adds them in rank order), stage 2, 3 reductions in flight,
# at N = 4: the kept staging is every rank's bf16 chunk of the largest segment
# (2·N·S bytes) instead of fp32 copies of its input and output (4·(N+1)·S),
# and the measured comm buffers and bytes per step equal the estimate.
NAT=(precision=bf16 zero.stage=2 zero.reduce_dtype=bf16 zero.reductions_in_flight=3)
json=$("$FDTRAIN" estimate "$Q" "$TINY" "${NAT[@]}" --world-size 4 --json 2>&1); rc=$?
check "native bf16 reductions --json exits 0" [ "$rc" -eq 0 ]
nat_flat=$(tr -d ' \n' <<<"$json")
f32_flat=$(tr -d ' \n' <<<"$("$FDTRAIN" estimate "$Q" "$TINY" precision=bf16 zero.stage=2 \
  zero.reductions_in_flight=3 --world-size 4 --json 2>&1)")
nat_staging=$(sed -E 's/.*\{"stage":2,[^}]*"comm_staging":([0-9]+).*/\1/' <<<"$nat_flat")
f32_staging=$(sed -E 's/.*\{"stage":2,[^}]*"comm_staging":([0-9]+).*/\1/' <<<"$f32_flat")
check "native staging $nat_staging = 2·4·S, fp32 staging $f32_staging = 4·5·S" \
  [ "$nat_staging" -gt 0 -a $((nat_staging * 10)) -eq $((f32_staging * 4)) ]
run="$TMP/run_native"
log=$(timeout 300 mpirun --oversubscribe --bind-to none -n 4 "$FDTRAIN" train "$Q" "$TINY" \
      steps=2 "${NAT[@]}" logging.sample_tokens=0 logging.eval_batches=1 \
      --run-dir "$run" --no-progress 2>&1); rc=$?
if [ $rc -ne 0 ] || [ ! -f "$run/summary.json" ]; then
  echo "FAIL: native bf16 4-rank run at stage 2 exited $rc"; echo "$log" | sed 's/^/    /'
  FAILURES=$((FAILURES + 1))
else
  s=$(tr -d ' \n' < "$run/summary.json")
  mem=$(sed -E 's/.*"memory":\{([^}]*)\}.*/\1/' <<<"$s")
  field() { sed -E "s/.*\"$1\":([0-9]+).*/\\1/" <<<"$mem"; }
  nat_field() { sed -E "s/.*\\{\"stage\":2,[^}]*\"$1\":([0-9]+).*/\\1/" <<<"$nat_flat"; }
  for k in params grads master optimizer activations; do
    check "native stage 2: measured $k $(field $k) == estimate $(nat_field $k)" \
      [ "$(field $k)" = "$(nat_field $k)" ]
  done
  check "native stage 2: measured comm $(field comm) == estimate $(nat_field comm_buffers)" \
    [ "$(field comm)" = "$(nat_field comm_buffers)" ]
  comm=$(sed -E 's/.*"comm_bytes_per_step":([0-9]+).*/\1/' <<<"$s")
  check "native stage 2: comm bytes per step $comm == estimate $(nat_field comm_bytes_per_step)" \
    [ "$comm" = "$(nat_field comm_bytes_per_step)" ]
  check "native stage 2: config.yaml records reduce_dtype bf16" \
    grep -q '^  reduce_dtype: bf16$' "$run/config.yaml"
fi

# LoRA, stage 3, bf16, dropout 0.1, every block checkpointed, at N = 4: the
# trainable (adapter) states, the frozen base shard, activations (the adapter
# path), comm buffers (the frozen base gathered with each segment) and comm
# bytes per step (the frozen gathers included) equal the estimate.
LORA=("lora={r: 8, alpha: 16, targets: [c_attn, c_proj], dropout: 0.1}" zero.stage=3 precision=bf16
      activation_checkpointing.layers=all)
json=$("$FDTRAIN" estimate "$Q" "$TINY" "${LORA[@]}" --world-size 4 --json 2>&1); rc=$?
flat=$(tr -d ' \n' <<<"$json")
check "LoRA --json exits 0" [ "$rc" -eq 0 ]
check "LoRA --json lists the split" grep -q '"trainable_params":45056,.*"frozen_params":858880' <<<"$flat"
out=$("$FDTRAIN" estimate "$Q" "$TINY" "${LORA[@]}" --world-size 4 2>&1)
check "LoRA table prints the split" grep -Eq '^at stage 3: frozen base: .*; trainable \(adapters\) states: ' <<<"$out"
check "LoRA table has a frozen base row" grep -Eq '^frozen base( +[0-9.]+( [KMG]iB)?){4}$' <<<"$out"
run="$TMP/run_lora"
log=$(timeout 300 mpirun --oversubscribe --bind-to none -n 4 "$FDTRAIN" train "$Q" "$TINY" \
      steps=1 "${LORA[@]}" logging.sample_tokens=0 logging.eval_batches=1 \
      --run-dir "$run" --no-progress 2>&1); rc=$?
if [ $rc -ne 0 ] || [ ! -f "$run/summary.json" ]; then
  echo "FAIL: LoRA 4-rank run at stage 3 exited $rc"; echo "$log" | sed 's/^/    /'
  FAILURES=$((FAILURES + 1))
else
  s=$(tr -d ' \n' < "$run/summary.json")
  mem=$(sed -E 's/.*"memory":\{([^}]*)\}.*/\1/' <<<"$s")
  field() { sed -E "s/.*\"$1\":([0-9]+).*/\\1/" <<<"$mem"; }
  for k in params grads master optimizer frozen activations; do
    check "LoRA stage 3: measured $k $(field $k) == estimate $(stage_field 3 $k)" \
      [ "$(field $k)" = "$(stage_field 3 $k)" ]
  done
  check "LoRA stage 3: measured comm $(field comm) == estimate $(stage_field 3 comm_buffers)" \
    [ "$(field comm)" = "$(stage_field 3 comm_buffers)" ]
  comm=$(sed -E 's/.*"comm_bytes_per_step":([0-9]+).*/\1/' <<<"$s")
  check "LoRA stage 3: comm bytes per step $comm == estimate $(stage_field 3 comm_bytes_per_step)" \
    [ "$comm" = "$(stage_field 3 comm_bytes_per_step)" ]
fi

# QLoRA (model.quantize): the same LoRA at stage 3, N = 2, with the base's blocks in 4 bits: the
# table has the 4-bit base's row, --json its settings and bytes, and every measured category
# (the 4-bit segments' shard and scratch in `quantized`) equals the estimate.
QL=("${LORA[@]}" "model.quantize={type: nf4, block_size: 64, double_quant: true}")
json=$("$FDTRAIN" estimate "$Q" "$TINY" "${QL[@]}" --world-size 2 --json 2>&1); rc=$?
flat=$(tr -d ' \n' <<<"$json")
check "QLoRA --json exits 0" [ "$rc" -eq 0 ]
check "QLoRA --json gives the settings" grep -q '"quantize":{"type":"nf4","block_size":64,"double_quant":true,"quantized_bytes":[1-9]' <<<"$flat"
out=$("$FDTRAIN" estimate "$Q" "$TINY" "${QL[@]}" --world-size 2 2>&1)
check "QLoRA table has the 4-bit base's row" grep -Eq '^4-bit base \+ scratch( +[0-9.]+( [KMG]iB)?){4}$' <<<"$out"
run="$TMP/run_qlora"
log=$(timeout 300 mpirun --oversubscribe --bind-to none -n 2 "$FDTRAIN" train "$Q" "$TINY" \
      steps=1 "${QL[@]}" logging.sample_tokens=0 logging.eval_batches=1 \
      --run-dir "$run" --no-progress 2>&1); rc=$?
if [ $rc -ne 0 ] || [ ! -f "$run/summary.json" ]; then
  echo "FAIL: QLoRA 2-rank run at stage 3 exited $rc"; echo "$log" | sed 's/^/    /'
  FAILURES=$((FAILURES + 1))
else
  s=$(tr -d ' \n' < "$run/summary.json")
  mem=$(sed -E 's/.*"memory":\{([^}]*)\}.*/\1/' <<<"$s")
  field() { sed -E "s/.*\"$1\":([0-9]+).*/\\1/" <<<"$mem"; }
  for k in params grads master optimizer frozen quantized activations; do
    check "QLoRA stage 3: measured $k $(field $k) == estimate $(stage_field 3 $k)" \
      [ "$(field $k)" = "$(stage_field 3 $k)" ]
  done
  check "QLoRA stage 3: measured comm $(field comm) == estimate $(stage_field 3 comm_buffers)" \
    [ "$(field comm)" = "$(stage_field 3 comm_buffers)" ]
fi

# A model the estimator was never told about: 5 blocks, LoRA on c_fc of
# blocks 1 and 3 only, fp16, stage 2, at N = 2: every measured figure equals
# the estimate (the estimate runs the model; nothing describes it twice).
NEW=(model.n_layer=5 "lora={r: 4, alpha: 8, targets: [c_fc], layers: [1, 3]}" zero.stage=2
     precision=fp16 "activation_checkpointing.layers=[3]")
json=$("$FDTRAIN" estimate "$Q" "$TINY" "${NEW[@]}" --world-size 2 --json 2>&1); rc=$?
flat=$(tr -d ' \n' <<<"$json")
check "5-block c_fc LoRA --json exits 0" [ "$rc" -eq 0 ]
run="$TMP/run_new"
log=$(timeout 300 mpirun --oversubscribe --bind-to none -n 2 "$FDTRAIN" train "$Q" "$TINY" \
      steps=1 "${NEW[@]}" logging.sample_tokens=0 logging.eval_batches=1 \
      --run-dir "$run" --no-progress 2>&1); rc=$?
if [ $rc -ne 0 ] || [ ! -f "$run/summary.json" ]; then
  echo "FAIL: 5-block LoRA 2-rank run exited $rc"; echo "$log" | sed 's/^/    /'
  FAILURES=$((FAILURES + 1))
else
  s=$(tr -d ' \n' < "$run/summary.json")
  mem=$(sed -E 's/.*"memory":\{([^}]*)\}.*/\1/' <<<"$s")
  field() { sed -E "s/.*\"$1\":([0-9]+).*/\\1/" <<<"$mem"; }
  for k in params grads master optimizer frozen activations; do
    check "5-block LoRA stage 2: measured $k $(field $k) == estimate $(stage_field 2 $k)" \
      [ "$(field $k)" = "$(stage_field 2 $k)" ]
  done
  check "5-block LoRA stage 2: measured comm $(field comm) == estimate $(stage_field 2 comm_buffers)" \
    [ "$(field comm)" = "$(stage_field 2 comm_buffers)" ]
  comm=$(sed -E 's/.*"comm_bytes_per_step":([0-9]+).*/\1/' <<<"$s")
  check "5-block LoRA stage 2: comm bytes per step $comm == estimate $(stage_field 2 comm_bytes_per_step)" \
    [ "$comm" = "$(stage_field 2 comm_bytes_per_step)" ]
fi

# The head's plan (summary.json's head_plan is the same object): one chunk whose logits are
# kept for the backward, on the CPU (the softmax) and on the GPU alike (the logits in the
# compute dtype, turned into the gradient in place): the same plan for device: cuda.
cpu=$("$FDTRAIN" estimate "$Q" "$TINY" --world-size 4 --json 2>&1 | tr -d ' \n')
gpu=$("$FDTRAIN" estimate "$Q" "$TINY" device=cuda --world-size 4 --json 2>&1 | tr -d ' \n')
head_cpu=$(sed -E 's/.*"head_plan":\{([^}]*)\}.*/\1/' <<<"$cpu")
head_gpu=$(sed -E 's/.*"head_plan":\{([^}]*)\}.*/\1/' <<<"$gpu")
check "--json head_plan: one chunk, kept ($head_cpu)" grep -q '"chunks":1,.*"kept":true' <<<"$head_cpu"
check "--json head_plan with device: cuda: the same plan ($head_gpu)" [ "$head_gpu" = "$head_cpu" ]
out=$("$FDTRAIN" estimate "$Q" "$TINY" device=cuda --world-size 4 2>&1 | tr '\n' ' ' | tr -s ' ')
check "device: cuda: the head keeps its logits in the compute dtype" \
  grep -q 'kept in the compute dtype and turned into the gradient in place' <<<"$out"

# A world size below 1, or one the recipe's global batch does not fit, is refused.
expect_fail 2 "--world-size must be >= 1, got 0" estimate "$Q" --world-size 0
expect_fail 2 "--world-size must be >= 1, got -3" estimate "$Q" --world-size -3
expect_fail 2 "world-size" estimate "$Q" --world-size two
expect_fail 2 "batch.global: 32 sequences per step do not fit 4 rank" estimate "$Q" batch.global=32 --world-size 4

finish
