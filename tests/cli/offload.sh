#!/usr/bin/env bash
# ZeRO-Infinity's NVMe tier from the command line (issue 21): the optimizer
# state in one file per rank under zero.offload_optimizer.path.
#  - 2 ranks, fp32 and bf16, stage 2, stage 3 with checkpointed blocks and
#    stage 3 with the parameters offloaded too (zero.offload_params): the
#    weights_sha256 of a run with nvme offload is the in-memory run's; the
#    files are gone when the run ends; summary.json's offload block and memory
#    agree with `fdtrain estimate --json`;
#  - resume: an offloaded run stopped at step 7 resumes without offload (and
#    the other way round) to the uninterrupted run's weights_sha256;
#  - faults: the disk fills up during a step (injected ENOSPC) or during a save
#    (the run directory on a 2 MiB tmpfs): exit 1, one message, and the last
#    checkpoint resumes to the uninterrupted weights;
#  - hostile: a missing directory (exit 2), a disk too small for the state
#    (a 1 MiB tmpfs: exit 1, one message, no state file), a second job on the
#    same directory while the first runs (refused; the first completes).
source "$(dirname "$0")/common.bash"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPI=(timeout 300 mpirun --oversubscribe --bind-to none -n 2)
R=$TMP/r.yaml
write_recipe "$R"
# A model big enough that each block's state takes several chunks of 1 MiB buffers.
sed -i 's/^steps: 3/steps: 12/; s/^  n_layer: 1/  n_layer: 2/; s/^  d_model: 16/  d_model: 96/' "$R"
OFF=$TMP/offload
mkdir -p "$OFF"
NVME=(zero.offload_optimizer.device=nvme "zero.offload_optimizer.path=$OFF" zero.offload_optimizer.buffer_mib=1)
fail() { echo "FAIL: $*"; FAILURES=$((FAILURES + 1)); }
json() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))
for k in sys.argv[2].split("."): d=d[int(k)] if isinstance(d,list) else d[k]
print(d)' "$1" "$2"; }

for config in "precision=fp32 zero.stage=2" "precision=bf16 zero.stage=3 activation_checkpointing.layers=all" \
              "precision=bf16 zero.stage=3 zero.offload_params.device=nvme" \
              "precision=bf16 zero.stage=3 zero.offload_params.device=nvme lora.r=4"; do
  inmem=${config/ zero.offload_params.device=nvme/}
  # shellcheck disable=SC2086
  "${MPI[@]}" "$FDTRAIN" train "$R" $inmem --run-dir "$TMP/mem" --no-progress >"$TMP/mem.log" 2>&1 \
    || { fail "in-memory run ($config)"; tail -3 "$TMP/mem.log"; }
  # shellcheck disable=SC2086
  "${MPI[@]}" "$FDTRAIN" train "$R" $config "${NVME[@]}" --run-dir "$TMP/off" --no-progress \
    >"$TMP/off.log" 2>&1 || { fail "offloaded run ($config)"; tail -3 "$TMP/off.log"; }
  a=$(json "$TMP/mem/summary.json" weights_sha256); b=$(json "$TMP/off/summary.json" weights_sha256)
  if [ -n "$a" ] && [ "$a" = "$b" ]; then
    echo "ok: $config: nvme offload gives the in-memory weights_sha256 ${a:0:16}"
  else
    fail "$config: weights_sha256 in memory $a, offloaded $b"
  fi
  # The final checkpoints hold the same state, every dataset (master, moments, params) bitwise.
  same=1
  for shard in "$TMP"/mem/checkpoints/step_*/rank_*.h5; do
    other=$TMP/off/checkpoints/$(basename "$(dirname "$shard")")/$(basename "$shard")
    [ "$(h5dump -g /segments "$shard" | tail -n +2 | md5sum)" = "$(h5dump -g /segments "$other" 2>&1 | tail -n +2 | md5sum)" ] || same=0
  done
  [ $same = 1 ] && echo "ok: $config: the checkpoints' /segments are identical" \
    || fail "$config: the checkpoints' /segments differ"
  left=$(ls -A "$OFF")
  [ -z "$left" ] && echo "ok: $config: no state file left in the offload directory" \
    || fail "$config: left in $OFF: $left"
  # The summary's offload block and memory against the estimate, to the byte.
  # shellcheck disable=SC2086
  "$FDTRAIN" estimate "$R" $config "${NVME[@]}" --world-size 2 --json >"$TMP/est.json" 2>"$TMP/est.err" \
    || { fail "estimate ($config)"; cat "$TMP/est.err"; }
  stage=$(json "$TMP/off/summary.json" zero_stage)
  e_file=$(json "$TMP/est.json" "stages.$stage.offload_nvme")
  m_file=$(( $(json "$TMP/off/summary.json" offload.optimizer_file_bytes) + $(json "$TMP/off/summary.json" offload.frozen_file_bytes) ))
  e_opt=$(json "$TMP/est.json" "stages.$stage.optimizer"); m_opt=$(json "$TMP/off/summary.json" memory.optimizer)
  e_master=$(json "$TMP/est.json" "stages.$stage.master"); m_master=$(json "$TMP/off/summary.json" memory.master)
  m_buf=$(json "$TMP/off/summary.json" offload.optimizer_buffer_bytes)
  if [ "$e_file" = "$m_file" ] && [ "$e_opt" = "$m_opt" ] && [ "$m_opt" = "$m_buf" ] && [ "$e_master" = "$m_master" ] \
     && [ "$m_master" = 0 ] && [ "$m_opt" -le $((1 << 20)) ] && [ "$m_file" -gt 0 ]; then
    echo "ok: $config: state file $m_file bytes, resident optimizer state $m_opt bytes (the buffers), master 0: as estimated"
  else
    fail "$config: file estimated $e_file measured $m_file; optimizer estimated $e_opt measured $m_opt buffers $m_buf; master $e_master / $m_master"
  fi
  if [[ $config == *offload_params* ]]; then
    e_par=$(json "$TMP/est.json" stages.3.params); m_par=$(json "$TMP/off/summary.json" memory.params)
    m_stg=$(json "$TMP/off/summary.json" offload.params_staging_bytes)
    in_mem=$(json "$TMP/mem/summary.json" memory.params)
    if [ "$e_par" = "$m_par" ] && [ "$m_par" = "$m_stg" ] && [ "$m_par" -gt 0 ]; then
      echo "ok: $config: resident parameters $m_par bytes (two staging buffers; in memory: $in_mem), as estimated"
    else
      fail "$config: params estimated $e_par measured $m_par staging $m_stg"
    fi
    # LoRA: the frozen base is offloaded with the parameters (its own file and buffers).
    e_fro=$(json "$TMP/est.json" stages.3.frozen); m_fro=$(json "$TMP/off/summary.json" memory.frozen)
    f_est=$(json "$TMP/off/summary.json" frozen_bytes_estimate); in_fro=$(json "$TMP/mem/summary.json" memory.frozen)
    f_file=$(json "$TMP/off/summary.json" offload.frozen_file_bytes)
    if [ "$e_fro" = "$m_fro" ] && [ "$m_fro" = "$f_est" ] && { [[ $config != *lora* ]] || [ "$f_file" -gt 0 ]; }; then
      echo "ok: $config: resident frozen base $m_fro bytes (in memory: $in_fro; its file $f_file bytes), as estimated"
    else
      fail "$config: frozen estimated $e_fro measured $m_fro summary estimate $f_est file $f_file"
    fi
  fi
  rm -rf "$TMP/mem" "$TMP/off"
done

# Resume across the setting: stopped at step 7 (injected fault), resumed with
# the other placement; the weights are the uninterrupted run's.
C=(precision=bf16 zero.stage=2 checkpoint.every=5)
"${MPI[@]}" "$FDTRAIN" train "$R" "${C[@]}" --run-dir "$TMP/whole" --no-progress >/dev/null 2>&1
whole=$(json "$TMP/whole/summary.json" weights_sha256)
for first in nvme none; do
  if [ $first = nvme ]; then A=("${NVME[@]}"); B=(); else A=(); B=("${NVME[@]}"); fi
  FDTRAIN_FAULT=throw:rank=1:step=7 "${MPI[@]}" "$FDTRAIN" train "$R" "${C[@]}" "${A[@]}" \
    --run-dir "$TMP/cut" --no-progress >"$TMP/cut.log" 2>&1
  "${MPI[@]}" "$FDTRAIN" train "$R" "${C[@]}" "${B[@]}" --run-dir "$TMP/cut" --resume auto \
    --no-progress >"$TMP/resume.log" 2>&1 || { fail "resume after a $first run"; tail -3 "$TMP/resume.log"; }
  got=$(json "$TMP/cut/summary.json" weights_sha256)
  start=$(json "$TMP/cut/summary.json" start_step)
  if [ "$got" = "$whole" ] && [ "$start" = 5 ]; then
    echo "ok: a run with offload $first stopped at step 7 resumes from step 5 with the other placement to the same weights ${got:0:16}"
  else
    fail "resume after offload $first: weights $got (start $start), uninterrupted $whole"
  fi
  rm -rf "$TMP/cut"
  rm -f "$OFF"/*  # what the failed run's ranks left (they were killed, not ended)
done

# A disk that fills up during a step (FDTRAIN_IO_FAULT: writes to offload files fail with ENOSPC
# once 3.5 state files' worth were written: in step 3): one message, exit 1, summary "failed";
# the checkpoint of step 2 loads and the resumed run ends with the uninterrupted run's weights.
C1=(precision=bf16 checkpoint.every=2 "${NVME[@]}")
"$FDTRAIN" train "$R" "${C1[@]}" --run-dir "$TMP/ok1" --no-progress >/dev/null 2>&1
"$FDTRAIN" estimate "$R" "${C1[@]}" --json >"$TMP/est1.json" 2>/dev/null
fbytes=$(json "$TMP/est1.json" stages.0.offload_nvme)
out=$(FDTRAIN_IO_FAULT=enospc:after=$((fbytes * 7 / 2)) "$FDTRAIN" train "$R" "${C1[@]}" \
  --run-dir "$TMP/full1" --no-progress 2>&1); rc=$?
if [ $rc -eq 1 ] && grep -q "no space left on the device holding $OFF/optimizer_rank_00000.fdstate" <<<"$out" \
   && [ "$(json "$TMP/full1/summary.json" status)" = failed ] && [ "$(json "$TMP/full1/summary.json" steps)" = 2 ] \
   && ! grep -Eq "terminate called|Aborted|what\(\)" <<<"$out"; then
  echo "ok: a full disk in step 3 ends the run: exit 1, one message, status failed after 2 steps"
else
  fail "full disk during a step: exit $rc"; echo "$out" | tail -4 | sed 's/^/    /'
fi
if "$FDTRAIN" train "$R" "${C1[@]}" --run-dir "$TMP/full1" --resume auto --no-progress >"$TMP/full1.log" 2>&1 \
   && [ "$(json "$TMP/full1/summary.json" weights_sha256)" = "$(json "$TMP/ok1/summary.json" weights_sha256)" ]; then
  echo "ok: the checkpoint of step 2 loads; the resumed run ends with the uninterrupted run's weights"
else
  fail "resume after the full disk"; tail -3 "$TMP/full1.log"
fi
rm -f "$OFF"/*

# Hostile input.
expect_fail 2 "zero.offload_optimizer.path: $TMP/nope does not exist; create the directory" \
  train "$R" zero.offload_optimizer.device=nvme "zero.offload_optimizer.path=$TMP/nope" --run-dir "$TMP/x"
expect_fail 2 "zero.offload_optimizer.path: required with device: nvme" \
  train "$R" zero.offload_optimizer.device=nvme --run-dir "$TMP/x"

MNT=$TMP/small
mkdir -p "$MNT"
if mount -t tmpfs -o size=1m tmpfs "$MNT" 2>/dev/null; then
  sed 's/^  d_model: 96/  d_model: 256/' "$R" >"$TMP/big.yaml"  # ~2.4 MB of fp32 state per rank
  expect_fail 1 "no space left on the device holding $MNT/optimizer_rank_0000[01].fdstate" \
    train "$TMP/big.yaml" zero.offload_optimizer.device=nvme "zero.offload_optimizer.path=$MNT" \
    --run-dir "$TMP/full" --no-progress
  left=$(ls -A "$MNT")
  [ -z "$left" ] && echo "ok: nothing left on the full disk" || fail "left on the full disk: $left"
  umount "$MNT"
  # The run directory's disk fills up during a save (2 MiB: the second checkpoint does not fit;
  # the state streams from the offload file into the shard): exit 1, status failed, the
  # partial checkpoint removed; the first checkpoint, moved to a larger disk, resumes to the
  # uninterrupted run's weights.
  R2=$TMP/r2.yaml
  sed 's/^steps: 12/steps: 20/; s/^  d_model: 96/  d_model: 64/' "$R" >"$R2"
  C2=(checkpoint.every=5 checkpoint.keep_last=1 "${NVME[@]}")
  "$FDTRAIN" train "$R2" "${C2[@]}" --run-dir "$TMP/whole2" --no-progress >/dev/null 2>&1
  mount -t tmpfs -o size=2m tmpfs "$MNT"
  out=$("$FDTRAIN" train "$R2" "${C2[@]}" --run-dir "$MNT/run" --no-progress 2>&1); rc=$?
  if [ $rc -eq 1 ] && grep -Eiq "disk is full|no space left" <<<"$out" \
     && [ "$(json "$MNT/run/summary.json" status)" = failed ] && [ ! -e "$MNT/run/checkpoints/.step_00000010.tmp" ]; then
    echo "ok: a full disk during a save ends the run: exit 1, status failed, partial checkpoint removed"
  else
    fail "full disk during a save: exit $rc, status $(json "$MNT/run/summary.json" status 2>&1 | tail -1)"
    echo "$out" | tail -3 | sed 's/^/    /'
  fi
  cp -r "$MNT/run" "$TMP/moved"
  umount "$MNT"
  rm -f "$OFF"/*
  if "$FDTRAIN" train "$R2" "${C2[@]}" --run-dir "$TMP/moved" --resume auto --no-progress >"$TMP/moved.log" 2>&1 \
     && [ "$(json "$TMP/moved/summary.json" start_step)" = 5 ] \
     && [ "$(json "$TMP/moved/summary.json" weights_sha256)" = "$(json "$TMP/whole2/summary.json" weights_sha256)" ]; then
    echo "ok: its step-5 checkpoint resumes (on a larger disk) to the uninterrupted run's weights"
  else
    fail "resume after the full disk during a save"; tail -3 "$TMP/moved.log"
  fi
else
  echo "skip: cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN); the full-disk cases did not run"
fi

# Two jobs, one offload directory: the second is refused while the first runs;
# the first completes unharmed.
"$FDTRAIN" train "$R" steps=400 "${NVME[@]}" --run-dir "$TMP/first" --no-progress >"$TMP/first.log" 2>&1 &
first=$!
for _ in $(seq 100); do [ -e "$OFF/optimizer_rank_00000.fdstate" ] && break; sleep 0.1; done
expect_fail 1 "optimizer_rank_00000.fdstate is in use by another fdtrain job .*zero.offload_optimizer.path" \
  train "$R" "${NVME[@]}" --run-dir "$TMP/second" --no-progress
if wait $first && [ "$(json "$TMP/first/summary.json" status)" = completed ]; then
  echo "ok: the first job completed while the second was refused"
else
  fail "the first job did not complete"; tail -3 "$TMP/first.log"
fi
finish
