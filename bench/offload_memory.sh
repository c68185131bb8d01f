#!/usr/bin/env bash
# The NVMe tier measured (issue 21), on a ~100M-parameter GPT (L14 C768 H12,
# byte vocabulary, T = 128) at world 2, ZeRO-3, bf16:
#  1. memory: peak RSS of each rank (/usr/bin/time) and summary.json's memory
#     without offload, with the optimizer state offloaded, and with the
#     parameters offloaded too, next to `fdtrain estimate`;
#  2. step time: ms per step with and without offload at micro 4, and at
#     micro 4 with accumulation 4 (4x the compute per optimizer step, the same
#     state traffic);
#  3. a memory limit: a cgroup (v1 memory.limit_in_bytes, or v2 memory.max)
#     below what the in-memory run needs: that run is killed by the kernel's
#     OOM killer, the offloaded run trains and its loss falls.
#
#   bench/offload_memory.sh [BUILD_DIR [OFFLOAD_DIR]]
# OFFLOAD_DIR defaults to a directory under /tmp (a fast local disk: the state
# files take ~0.6 GB per rank). Needs root for the cgroup (skipped otherwise).
set -uo pipefail
BUILD_DIR=${1:-build}
FDTRAIN=$(realpath "$BUILD_DIR/bin/fdtrain")
WORK=$(mktemp -d)
OFF=${2:-$WORK/offload}
mkdir -p "$OFF"
CG=""
cleanup() {
  [ -n "$CG" ] && rmdir "$CG" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
R=$WORK/m100.yaml
cat >"$R" <<'YAML'
model: {n_layer: 14, n_head: 12, d_model: 768, vocab_size: 256, max_seq_len: 128}
data:
  format: text
  train: [/usr/share/games/fortunes/fortunes, /usr/share/games/fortunes/literature]
  val_fraction: 0.0
  seq_len: 128
batch: {micro: 1}
optimizer: {lr: 6.0e-4, betas: [0.9, 0.95], weight_decay: 0.1}
schedule: {name: constant, warmup_steps: 3}
zero: {stage: 3}
precision: bf16
steps: 3
logging: {every: 1, sample_tokens: 0}
checkpoint: {at_end: false}
YAML
NVME=(zero.offload_optimizer.device=nvme "zero.offload_optimizer.path=$OFF")
PARAMS=(zero.offload_params.device=nvme)
json() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))
for k in sys.argv[2].split("."): d=d[int(k)] if isinstance(d,list) else d[k]
print(d)' "$1" "$2"; }
mib() { awk -v b="$1" 'BEGIN { printf "%.0f", b / 1048576 }'; }

# run NAME [overrides...]: 2 ranks; prints "rss0 rss1" (MiB) into $WORK/NAME.rss
run() {
  local name=$1
  shift
  timeout 1200 mpirun --oversubscribe --bind-to none -n 2 /usr/bin/time -f "peak_rss_kb %M" \
    "$FDTRAIN" train "$R" "$@" --run-dir "$WORK/$name" --no-progress >"$WORK/$name.log" 2>&1
  local rc=$?
  grep -o 'peak_rss_kb [0-9]*' "$WORK/$name.log" | awk '{printf "%.0f ", $2 / 1024}' >"$WORK/$name.rss"
  return $rc
}

echo "machine: $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(free -g | awk '/Mem:/ {print $2}') GiB"
echo "model: GPT L14 C768 H12 V256 T128, micro 1, world 2, ZeRO-3, bf16; offload directory $OFF ($(df -h "$OFF" | awk 'NR==2 {print $1}'))"
printf "\n%-22s %14s %12s %12s %12s %12s %12s %14s\n" "" "peak RSS/rank" "params" "grads" "master" "optimizer" "activations" "state file"
for mode in none optimizer optimizer+params; do
  case $mode in
    none) extra=() ;;
    optimizer) extra=("${NVME[@]}") ;;
    *) extra=("${NVME[@]}" "${PARAMS[@]}") ;;
  esac
  run "$mode" "${extra[@]}" || { echo "run $mode failed:"; tail -5 "$WORK/$mode.log"; continue; }
  S=$WORK/$mode/summary.json
  "$FDTRAIN" estimate "$R" "${extra[@]}" --world-size 2 --json >"$WORK/$mode.est" 2>/dev/null
  E=$WORK/$mode.est
  printf "%-22s %14s %12s %12s %12s %12s %12s %14s\n" "$mode (measured)" "$(cat "$WORK/$mode.rss")MiB" \
    "$(mib "$(json "$S" memory.params)")" "$(mib "$(json "$S" memory.grads)")" \
    "$(mib "$(json "$S" memory.master)")" "$(mib "$(json "$S" memory.optimizer)")" \
    "$(mib "$(json "$S" memory.activations)")" "$(mib "$(json "$S" offload.optimizer_file_bytes)")"
  printf "%-22s %14s %12s %12s %12s %12s %12s %14s\n" "   (estimate, MiB)" "" \
    "$(mib "$(json "$E" stages.3.params)")" "$(mib "$(json "$E" stages.3.grads)")" \
    "$(mib "$(json "$E" stages.3.master)")" "$(mib "$(json "$E" stages.3.optimizer)")" \
    "$(mib "$(json "$E" stages.3.activations)")" "$(mib "$(json "$E" stages.3.offload_nvme)")"
  echo "$(json "$S" ms_per_step)" >"$WORK/$mode.ms"
done
echo "(MiB; peak RSS of rank 0 and rank 1 from /usr/bin/time; the categories are summary.json's"
echo " memory, the maximum over ranks, and the estimate's stage-3 column)"

echo
echo "step time (3 steps; ms per step from summary.json), in memory vs optimizer + parameters on NVMe:"
for setting in "batch.micro=4" "batch.micro=4 batch.accumulation=4"; do
  # shellcheck disable=SC2086
  run step_mem $setting || { echo "run failed"; tail -5 "$WORK/step_mem.log"; }
  # shellcheck disable=SC2086
  run step_off $setting "${NVME[@]}" "${PARAMS[@]}" || { echo "run failed"; tail -5 "$WORK/step_off.log"; }
  a=$(json "$WORK/step_mem/summary.json" ms_per_step); b=$(json "$WORK/step_off/summary.json" ms_per_step)
  awk -v s="$setting" -v a="$a" -v b="$b" \
    'BEGIN { printf "  %-36s %8.0f ms  %8.0f ms  offloaded / in memory = %.2fx\n", s, a, b, b / a }'
  rm -rf "$WORK/step_mem" "$WORK/step_off"
done

# A memory limit the in-memory run exceeds.
echo
if [ "$(id -u)" != 0 ]; then
  echo "memory limit: skipped (needs root for a cgroup)"
  exit 0
fi
in_mem=$(awk '{print $1 + $2}' "$WORK/none.rss")
offl=$(awk '{print $1 + $2}' "$WORK/optimizer+params.rss")
limit=$(( (in_mem + offl) / 2 ))
if [ -d /sys/fs/cgroup/memory ]; then
  CG=/sys/fs/cgroup/memory/fdtrain_offload_bench_$$
  mkdir "$CG" && echo $((limit * 1048576)) >"$CG/memory.limit_in_bytes"
  how="cgroup v1 memory.limit_in_bytes"
elif [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  CG=/sys/fs/cgroup/fdtrain_offload_bench_$$
  mkdir "$CG" && echo $((limit * 1048576)) >"$CG/memory.max"
  how="cgroup v2 memory.max"
else
  echo "memory limit: skipped (no cgroup memory controller)"
  exit 0
fi
echo "memory limit: $limit MiB for both ranks ($how); peak RSS in memory $in_mem MiB, offloaded $offl MiB"
limited() {
  local name=$1
  shift
  (echo $BASHPID >"$CG/cgroup.procs" && exec timeout 1200 mpirun --oversubscribe --bind-to none -n 2 \
    "$FDTRAIN" train "$R" "$@" --run-dir "$WORK/$name" --no-progress >"$WORK/$name.log" 2>&1)
}
limited limit_none steps=20
rc=$?
echo "  in memory: exit $rc ($(grep -c -i 'killed\|signal 9' "$WORK/limit_none.log") lines about a kill; status $(json "$WORK/limit_none/summary.json" status 2>/dev/null || echo none))"
limited limit_off steps=20 "${NVME[@]}" "${PARAMS[@]}"
rc=$?
losses=$(python3 -c 'import json,sys; l=[json.loads(x)["loss"] for x in open(sys.argv[1]) if "loss" in x]; print(" ".join("%.3f" % v for v in l[:3]), "...", " ".join("%.3f" % v for v in l[-3:]))' "$WORK/limit_off/metrics.jsonl" 2>/dev/null)
echo "  offloaded: exit $rc, status $(json "$WORK/limit_off/summary.json" status 2>/dev/null), losses $losses"
