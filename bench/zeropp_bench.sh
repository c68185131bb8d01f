#!/usr/bin/env bash
# Across hosts (issue 40): hierarchical collectives and ZeRO++ on 2 simulated hosts of 2 ranks
# (tests/multihost/hosts.bash: network namespaces on a bridge), each host's link shaped by a tc
# token bucket (default 1 Gbit/s each way). Prints only; writes nothing outside a temporary
# directory. Needs root and network namespaces, else says why and exits 0.
#  1. collectives (bench/collective_bench), 64 MiB of fp32, flat against hierarchical
#     (dist.hierarchical): all-reduce, reduce-scatter, all-gather, and the reduce-scatter as
#     ZeRO++'s quantized all-to-all (int8, int4): median time, and the bytes that crossed the
#     hosts' links as the links' own counters saw them (both hosts' veths, both directions, the
#     whole mpirun) next to what fdtrain counts (the busiest rank, ring model);
#  2. training: a GPT of ~100M parameters (byte vocabulary, L14 C768 H12, T 64, bf16), ZeRO-3
#     against ZeRO++ (qwZ + hpZ + qgZ int4, with dist.hierarchical), ZPP_BENCH_STEPS steps each
#     (default 300, micro batch 1 per rank): ms per step, bytes per step across hosts as counted
#     and as `fdtrain estimate --nodes 2` counts them, the links' counters, the eval loss at the
#     end (the same validation batches).
#
#   bench/zeropp_bench.sh [BUILD_DIR]
#   ZPP_BENCH_RATE (default 1gbit), ZPP_BENCH_STEPS (default 300), ZPP_BENCH_PARTS (default
#   "collectives training").
set -uo pipefail
BUILD_DIR=${1:-build}
RATE=${ZPP_BENCH_RATE:-1gbit}
STEPS=${ZPP_BENCH_STEPS:-300}
PARTS=${ZPP_BENCH_PARTS:-collectives training}
BIN=$(realpath "$BUILD_DIR/bin")
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../tests/multihost/hosts.bash"
if ! why=$(hosts_supported); then
  echo "zeropp_bench: SKIPPED: simulated hosts need root and network namespaces: $why"
  exit 0
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
hosts_up 2 "$RATE" || { echo "zeropp_bench: could not make the hosts"; exit 1; }
W=$HOSTS_DIR/work
mkdir -p "$W"
echo "zeropp_bench: 2 hosts x 2 ranks, each host's link $RATE each way (tc tbf); $(lscpu | sed -n 's/^Model name: *//p'), $(getconf _NPROCESSORS_ONLN) cores"

if [[ " $PARTS " == *" collectives "* ]]; then
  echo
  echo "1. collectives, 64 MiB of fp32 over 4 ranks; 'link' = bytes through both hosts' links (one"
  echo "   direction's worth: the bridge counts each byte on the sender's and the receiver's veth),"
  echo "   per op, the whole mpirun (6 ops, start-up included) divided by 6"
  for spec in "all_reduce flat" "all_reduce hierarchical" "reduce_scatter flat" \
              "reduce_scatter hierarchical" "reduce_scatter int8" "reduce_scatter int4" \
              "all_gather flat" "all_gather hierarchical"; do
    before=$(hosts_link_bytes)
    line=$(timeout 600 mpirun "${MPIRUN_HOSTS[@]}" -n 4 "$BIN/collective_bench" $spec --mib 64 --iters 5 2>&1 | tail -1)
    after=$(hosts_link_bytes)
    printf '   %s; link %.1f MB per op\n' "$line" "$(python3 -c "print(($after - $before) / 2 / 6 / 1e6)")"
  done
fi

if [[ " $PARTS " == *" training "* ]]; then
  R=$W/zpp.yaml
  cat >"$R" <<YAML
model: {n_layer: 14, n_head: 12, d_model: 768, vocab_size: 256, max_seq_len: 64}
data:
  format: text
  train: [/usr/share/games/fortunes/fortunes, /usr/share/games/fortunes/literature,
          /usr/share/games/fortunes/people, /usr/share/games/fortunes/science]
  val_fraction: 0.02
  seq_len: 64
batch: {micro: 1, accumulation: 1}
optimizer: {lr: 6.0e-4, betas: [0.9, 0.95], weight_decay: 0.1, grad_clip: 1.0}
schedule: {name: cosine, warmup_steps: 30, min_lr: 6.0e-5}
precision: bf16
zero: {stage: 3}
dist: {timeout_s: 900}
threads: 1
seed: 1
steps: $STEPS
logging: {every: 10, eval_every: 0, eval_batches: 16, sample_tokens: 0}
checkpoint: {at_end: false}
YAML
  ZPP="zero.quantized_weights=true zero.hierarchical_partition=true zero.quantized_gradients=int4 dist.hierarchical=true"
  echo
  echo "2. training: $("$BIN/fdtrain" estimate "$R" --world-size 4 2>/dev/null | sed -n 's/^Ψ = \([0-9,]*\) parameters.*/\1 parameters/p'), bf16, ZeRO-3, $STEPS steps of 4 x 64 tokens"
  for name in zero3 zeropp; do
    set=""
    [ "$name" = zeropp ] && set=$ZPP
    before=$(hosts_link_bytes)
    t0=$(date +%s)
    timeout 7200 mpirun "${MPIRUN_HOSTS[@]}" -n 4 "$BIN/fdtrain" train "$R" $set --run-dir "$W/$name" \
      --no-progress >"$W/$name.log" 2>&1 || { echo "   $name: exit $?"; tail -5 "$W/$name.log"; }
    after=$(hosts_link_bytes)
    "$BIN/fdtrain" estimate "$R" $set --world-size 4 --nodes 2 --json >"$W/$name.est.json"
    python3 - "$W/$name/summary.json" "$W/$name.est.json" "$name" "$((after - before))" "$(($(date +%s) - t0))" <<'PY'
import json, sys
s, e = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
name, link, wall = sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
st = next(x for x in e["stages"] if x["stage"] == 3)
n = s["network"]
print(f"   {name}: {s['ms_per_step']:.0f} ms/step, eval loss {s['eval_loss']:.4f} (final train loss "
      f"{s['final_loss']:.4f}); per step the busiest rank sends {n['bytes_per_step'] / 1e6:.1f} MB, "
      f"{n['inter_node_bytes_per_step'] / 1e6:.1f} MB across hosts (estimate --nodes 2: "
      f"{st['network_bytes_per_step'] / 1e6:.1f} MB, {st['inter_node_bytes_per_step'] / 1e6:.1f} MB"
      f"{', equal' if (st['network_bytes_per_step'], st['inter_node_bytes_per_step']) == (n['bytes_per_step'], n['inter_node_bytes_per_step']) else ', DIFFERENT'}); "
      f"links {link / 2 / s['steps'] / 1e6:.1f} MB per step (whole run / steps); {wall} s in all; "
      f"memory params {s['memory']['params'] / 2**20:.0f} MiB per rank")
json.dump({"ms": s["ms_per_step"], "eval": s["eval_loss"], "across": n["inter_node_bytes_per_step"]},
          open(sys.argv[1] + ".bench", "w"))
PY
  done
  python3 - "$W/zero3/summary.json.bench" "$W/zeropp/summary.json.bench" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
print(f"   ZeRO++ against ZeRO-3: {a['across'] / b['across']:.2f}x fewer bytes across hosts, "
      f"{a['ms'] / b['ms']:.2f}x the speed, eval loss {100 * (b['eval'] - a['eval']) / a['eval']:+.2f}%")
PY
fi
hosts_down
