#!/usr/bin/env bash
# tests/gpu/device_check.sh's verdicts, without a GPU: the check runs from a
# fake bundle whose nvidia-smi, ldconfig, gpu_tests and fdtrain
# are scripts printing what the real ones print on a GPU machine (FAKE_*
# variables inject one fault each). A check that proves nothing must fail:
#   - everything right: PASSED, exit 0, one table with five passed stages;
#   - a driver too old for CUDA 13, or no GPU: stops in preflight, exit 1;
#   - op tests skipped, or a parity test failed: stage 1 FAILED, exit 1;
#   - the loss not falling: stage 2 FAILED, exit 1;
#   - the kernel timings failing, an MFU below the floor, or attention on the SIMT
#     kernels (summary.json's gpu.attention_launches): stage 3 FAILED, exit 1;
#   - a GPU resume that differs, or a CPU step-21 loss off by more than 1e-2,
#     or step 21 not logged: stage 4 FAILED, exit 1;
#   - offloaded runs that differ: stage 5 FAILED, exit 1.
source "$(dirname "$0")/common.bash"
ROOT=$(pwd)
B=$TMP/bundle
mkdir -p "$B/bin" "$B/lib" "$B/bench/recipes" "$B/configs/models" "$B/data" "$TMP/fakebin" "$TMP/cuda"
cp "$ROOT/tests/gpu/device_check.sh" "$B/"
touch "$B/bench/recipes/m_fortunes.yaml" "$B/configs/models/gpt2-124m.yaml" "$B/data/fortunes.txt"
touch "$TMP/cuda/libcublasLt.so.13" "$TMP/cuda/libnccl.so.2"

cat > "$TMP/fakebin/ldconfig" <<EOF
#!/usr/bin/env bash
echo "	libcublasLt.so.13 (libc6,x86-64) => $TMP/cuda/libcublasLt.so.13"
echo "	libnccl.so.2 (libc6,x86-64) => $TMP/cuda/libnccl.so.2"
EOF
cat > "$TMP/fakebin/nvidia-smi" <<'EOF'
#!/usr/bin/env bash
[[ -n ${FAKE_NO_GPU:-} ]] && { echo "No devices were found"; exit 6; }
if [[ $* == *--query-gpu* ]]; then echo "NVIDIA H200, 580.65.06, 143771 MiB, 9.0"; exit 0; fi
echo "| NVIDIA-SMI 580.65.06   Driver Version: 580.65.06   CUDA Version: ${FAKE_CUDA:-13.0}     |"
EOF
cat > "$B/bin/gpu_tests" <<'EOF'
#!/usr/bin/env bash
if [[ $* == *GpuOpBench* ]]; then
  [[ -n ${FAKE_NO_TIMINGS:-} ]] && { echo "[  FAILED  ] 1 test, listed below:"; exit 1; }
  echo "OPTIME attention B16 T1024 H12 hs64 forward: 1.000 ms, 100.0 TFLOP/s"; exit 0
fi
if [[ -n ${FAKE_SKIP:-} ]]; then
  echo "[  SKIPPED ] GpuParity.Matmul: no usable GPU: CUDA driver too old"
  echo "PARITY op=matmul dtype=f32 out=1.00e-07 (bound 1e-05)"
  echo "[  PASSED  ] 20 tests."; echo "[  SKIPPED ] 1 test, listed below:"; exit 0
fi
echo "PARITY op=matmul dtype=f32 out=1.00e-07 grad0=2.00e-07 (bound 1e-05)"
echo "PARITY op=attention_T1024_hs64 dtype=bf16 out=3.00e-03 grad0=4.00e-03 attention=tensor_cores (bound 1e-02)"
echo "PARITY op=attention_T1024_hs64_simt dtype=bf16 out=3.00e-03 grad0=4.00e-03 attention=simt (bound 1e-02)"
if [[ -n ${FAKE_PARITY_FAIL:-} ]]; then
  echo "[  PASSED  ] 20 tests."; echo "[  FAILED  ] 1 test, listed below:"; exit 1
fi
echo "[  PASSED  ] 21 tests."
EOF
# The fast-math reciprocal probe (stage 1b): its count per binade.
cat > "$B/bin/probe_fastmath_reciprocal" <<'EOF'
#!/usr/bin/env bash
[[ -n ${FAKE_PROBE_FAIL:-} ]] && { echo "cudaGetDeviceCount: no CUDA-capable device"; exit 2; }
for e in 0 -1 10; do echo "binade 2^$e: 0 of 8388608 reciprocals differ from round-to-nearest"; done
EOF
# The fake fdtrain: `train RECIPE k=v... --run-dir DIR [--resume X]` writes metrics.jsonl and
# summary.json as a real run would (the loss 5.5 - step/40; the weights digest of its steps).
cat > "$B/bin/fdtrain" <<'EOF'
#!/usr/bin/env bash
[[ $1 == --version || $1 == --help ]] && { echo "fdtrain 0.0 (fake)"; exit 0; }
steps=0 dir="" device=cuda every=1 resume="" offload=none
for a in "$@"; do
  case $a in
    steps=*) steps=${a#steps=} ;; device=*) device=${a#device=} ;; logging.every=*) every=${a#logging.every=} ;;
    zero.offload_optimizer.device=*) offload=${a#*=} ;;
  esac
done
while [[ $# -gt 0 ]]; do
  case $1 in --run-dir) dir=$2; shift ;; --resume) resume=$2; shift ;; esac; shift
done
mkdir -p "$dir"
first=1
[[ -n $resume && -f $dir/metrics.jsonl ]] && first=21
[[ -n $resume && ! -f $dir/metrics.jsonl ]] && first=21
for ((s = first; s <= steps; s++)); do
  (( s % every == 0 || s == first )) || continue
  loss=$(awk -v s="$s" -v flat="${FAKE_FLAT:-}" -v off="${FAKE_CPU_OFF:-}" -v dev="$device" \
    'BEGIN { printf "%.6f", 5.5 - (flat == "" ? s / 40 : 0) + (dev == "cpu" && off != "" ? 0.1 : 0) }')
  echo "{\"step\": $s, \"loss\": $loss}" >> "$dir/metrics.jsonl"
done
sha=sha$steps
[[ -n ${FAKE_RESUME_DIFF:-} && -n $resume ]] && sha=different
[[ -n ${FAKE_OFFLOAD_DIFF:-} && $offload == nvme ]] && sha=different
pinned=0; [[ $offload != none ]] && pinned=4096
tps=400000; [[ -n ${FAKE_SLOW:-} ]] && tps=150000
simt=0; [[ -n ${FAKE_SIMT:-} ]] && simt=12
cat > "$dir/summary.json" <<J
{"status": "completed", "weights_sha256": "$sha", "tokens_per_s": $tps, "num_params": 124475904,
 "ms_per_step": 10.0, "profile": null, "offload": {"optimizer_pinned_bytes": $pinned},
 "head_plan": {"rows": 16384, "vocab": 50257, "chunk_rows": 320, "chunks": 52, "kept": false},
 "gpu": {"device": "cuda:0 (fake)", "graph_capture": false,
         "attention_launches": {"forward_tensor_cores": 360, "forward_simt": $simt,
                                "backward_tensor_cores": 360, "backward_simt": $simt}}}
J
mkdir -p "$dir/checkpoints/step_00000020"
EOF
chmod +x "$B"/bin/* "$TMP"/fakebin/*

# check NAME WANT_RC PATTERN... with FAKE_* in the environment: the check's exit status and output.
check() {
  local name=$1 want=$2; shift 2
  local out rc
  out=$(cd "$B" && PATH="$TMP/fakebin:$PATH" bash ./device_check.sh "$TMP/out_$name" 2>&1); rc=$?
  local bad=0 p
  for p in "$@"; do grep -Eq -- "$p" <<<"$out" || { echo "FAIL: $name: no line matches /$p/"; bad=1; }; done
  if [[ $rc -ne $want ]]; then echo "FAIL: $name: exit $rc, expected $want"; bad=1; fi
  if (( bad )); then FAILURES=$((FAILURES + 1)); echo "$out" | tail -15 | sed 's/^/    /'
  else echo "ok: $name: exit $rc"; fi
}

check all_good 0 "^\| 1. op parity \| passed \| 21 tests.*attention cases: 1 on tensor cores, 1 SIMT, 0 mixed" "^\| 2. config M \| passed" \
  "^\| 3. GPT-2 124M \| passed \| 400,000 tokens/s.*% of 989 TFLOP/s .*% of 790 TFLOP/s.*attention: tensor cores 360 fwd / 360 bwd, SIMT 0 fwd / 0 bwd; head: 52 chunk\(s\) of 320 rows x 50257; graph capture: no.*attention B16" \
  "^\| 4. resume \| passed \| GPU resume bitwise: True; step 21 loss" "^\| 5. offload \| passed" \
  "^\| 1b. fast-math reciprocal \| passed \| mismatches per binade: 2\^0 0" "device_check: PASSED"
FAKE_CUDA=12.4 check old_driver 1 "driver supports CUDA 12.4, this build needs CUDA 13" "device_check: FAILED"
FAKE_NO_GPU=1 check no_gpu 1 "nvidia-smi finds no usable GPU" "device_check: FAILED"
FAKE_SKIP=1 check skipped 1 "^\| 1. op parity \| FAILED .*1 skipped" "device_check: FAILED"
FAKE_PARITY_FAIL=1 check parity_failed 1 "^\| 1. op parity \| FAILED .*1 failed" "device_check: FAILED"
FAKE_PROBE_FAIL=1 check probe_failed 1 "^\| 1b. fast-math reciprocal \| FAILED \| exit 2" "device_check: FAILED"
FAKE_FLAT=1 check loss_flat 1 "^\| 2. config M \| FAILED .*falls by > 1.0: False" "device_check: FAILED"
FAKE_NO_TIMINGS=1 check no_timings 1 "^\| 3. GPT-2 124M \| FAILED" "device_check: FAILED"
FAKE_SLOW=1 check mfu_below_floor 1 "^\| 3. GPT-2 124M \| FAILED .*FAILED: MFU 12.2% is below the floor of 20%" "device_check: FAILED"
FAKE_SIMT=1 check simt_attention 1 "^\| 3. GPT-2 124M \| FAILED .*SIMT 12 fwd / 12 bwd.*FAILED: attention ran on the SIMT kernels" "device_check: FAILED"
FAKE_RESUME_DIFF=1 check resume_differs 1 "^\| 4. resume \| FAILED .*bitwise: False" "device_check: FAILED"
FAKE_CPU_OFF=1 check cpu_loss_off 1 "^\| 4. resume \| FAILED .*relative .*bound 1e-2" "device_check: FAILED"
FAKE_OFFLOAD_DIFF=1 check offload_differs 1 "^\| 5. offload \| FAILED .*one weights_sha256 .*: False" "device_check: FAILED"
finish
