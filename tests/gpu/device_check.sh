#!/usr/bin/env bash
# device_check.sh [OUT_DIR]: fdtrain's GPU check, run from a `make gpu-bundle`
# folder on a machine with an NVIDIA GPU, its driver and the CUDA libraries
# (no Debian packages needed). About 5-8 minutes on an H200:
#
#   1. GPU op parity: every op of lib/ops forward and backward against the CPU
#      backend on fresh random inputs (gpu_tests; PARITY lines, bounds fp32
#      1e-5, bf16 1e-2).
#   2. Training: config M (L6 C512 H8, byte vocabulary) on the GPU for 200
#      steps in bf16; the loss must fall.
#   3. Benchmark: GPT-2 124M, bf16, T = 1024: tokens/s and MFU =
#      tokens/s x (6N + 6 L C T) / 790e12 (the H200's measured dense bf16 rate).
#   4. Checkpoints: a GPU run resumed from its step-20 checkpoint ends with the
#      uninterrupted run's weights_sha256; the same checkpoint resumes on the CPU.
#   5. Offload: 20 steps with the optimizer state in host memory and in a file
#      give one weights_sha256 (and the op parity of step 1 checks the
#      in-GPU AdamW against them bitwise).
#
# Everything it prints is also written to OUT_DIR (default ./device_check_out):
# parity.txt, train_m/, bench_124m/ and report.txt (the lines for bench/RESULTS.md).
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${1:-$PWD/device_check_out}
mkdir -p "$OUT"
REPORT="$OUT/report.txt"
: > "$REPORT"
say() { echo "$*" | tee -a "$REPORT"; }
status=0

# --- the CUDA libraries we do not bundle: cuBLASLt and NCCL ----------------
cuda_dirs=()
for lib in libcublasLt.so.13 libnccl.so.2; do
  found=""
  if p=$(ldconfig -p 2>/dev/null | awk -v l="$lib" '$1 == l {print $NF; exit}') && [[ -n "$p" ]]; then
    found=$(dirname "$p")
  fi
  if [[ -z "$found" ]]; then
    for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda-13*/lib64 \
             /usr/lib/x86_64-linux-gnu; do
      [[ -e "$d/$lib" ]] && { found=$d; break; }
    done
  fi
  if [[ -z "$found" ]]; then  # the nvidia-* Python wheels (cu13 layout, or per-package)
    for site in $(python3 -c 'import site, sys; print(" ".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null) \
                /usr/local/lib/python3*/dist-packages /usr/lib/python3/dist-packages; do
      p=$(find "$site/nvidia" -name "$lib" 2>/dev/null | head -1)
      [[ -n "$p" ]] && { found=$(dirname "$p"); break; }
    done
  fi
  [[ -n "$found" ]] || { say "device_check: $lib not found (install the CUDA 13 libraries)"; exit 1; }
  cuda_dirs+=("$found")
done
CUDA_LIBS=$(printf '%s:' "${cuda_dirs[@]}")
export LD_LIBRARY_PATH="${CUDA_LIBS}${LD_LIBRARY_PATH:-}"

# --- OpenBLAS travels compressed (scripts/gpu_bundle.sh) -------------------
if [[ -f "$HERE/lib/libopenblas.so.0.xz" && ! -f "$HERE/lib/libopenblas.so.0" ]]; then
  xz -dk "$HERE/lib/libopenblas.so.0.xz" 2>/dev/null ||
    python3 -c 'import lzma, sys; open(sys.argv[2], "wb").write(lzma.open(sys.argv[1]).read())' \
      "$HERE/lib/libopenblas.so.0.xz" "$HERE/lib/libopenblas.so.0" ||
    { say "device_check: cannot unpack lib/libopenblas.so.0.xz (needs xz or python3)"; exit 1; }
fi

# --- how to start our binaries: directly, or through the bundled glibc ------
run_bin() { "$HERE/bin/$1" "${@:2}"; }
if ! "$HERE/bin/fdtrain" --version >/dev/null 2>&1; then
  if OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Haswell} "$HERE/glibc/ld-linux-x86-64.so.2" \
       --library-path "$HERE/glibc:$HERE/lib:$LD_LIBRARY_PATH" "$HERE/bin/fdtrain" --help \
       >/dev/null 2>&1; then
    # fdtrain re-executes itself to pick OpenBLAS's kernels unless
    # OPENBLAS_CORETYPE is set, which would bypass the loader: set it.
    export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Haswell}
    run_bin() {
      "$HERE/glibc/ld-linux-x86-64.so.2" --library-path "$HERE/glibc:$HERE/lib:$LD_LIBRARY_PATH" \
        "$HERE/bin/$1" "${@:2}"
    }
    say "device_check: this system's glibc is older than the build's; using the bundled one"
  else
    say "device_check: fdtrain does not start:"
    "$HERE/bin/fdtrain" --version 2>&1 | tee -a "$REPORT"
    exit 1
  fi
fi
say "device_check: $(run_bin fdtrain --version 2>&1 | head -1); $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
cd "$HERE"

# --- 1. op parity -----------------------------------------------------------
say "== 1. GPU ops vs CPU (||gpu - cpu|| / ||cpu||)"
run_bin gpu_tests --gtest_color=no > "$OUT/parity.txt" 2>&1
rc=$?
grep PARITY "$OUT/parity.txt" | tee -a "$REPORT"
grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$OUT/parity.txt" | tee -a "$REPORT"
(( rc == 0 )) || { say "op parity: FAILED (exit $rc; see parity.txt)"; status=1; }

# --- 2. a short training run of config M ------------------------------------
say "== 2. config M on the GPU (bf16, 200 steps)"
rm -rf "$OUT/train_m"
run_bin fdtrain train bench/recipes/m_fortunes.yaml device=cuda precision=bf16 steps=200 \
  "data.train=[data/fortunes.txt]" batch.micro=16 zero.stage=2 logging.every=20 \
  logging.eval_every=0 logging.sample_tokens=0 checkpoint.every=0 \
  --run-dir "$OUT/train_m" --no-progress > "$OUT/train_m.log" 2>&1
rc=$?
if [[ -f "$OUT/train_m/metrics.jsonl" ]]; then
  python3 - "$OUT/train_m/metrics.jsonl" <<'PY' | tee -a "$REPORT"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
rows = [r for r in rows if "loss" in r]
print("loss by step: " + ", ".join(f"{r['step']}: {r['loss']:.3f}" for r in rows))
if rows: print(f"first {rows[0]['loss']:.3f} -> last {rows[-1]['loss']:.3f}; falling: {rows[-1]['loss'] < rows[0]['loss'] - 1.0}")
PY
fi
(( rc == 0 )) || { say "training run: FAILED (exit $rc):"; tail -20 "$OUT/train_m.log" | tee -a "$REPORT"; status=1; }

# --- 3. GPT-2 124M bf16 benchmark -------------------------------------------
say "== 3. GPT-2 124M, bf16, T=1024: tokens/s and MFU"
rm -rf "$OUT/bench_124m"
run_bin fdtrain train bench/recipes/m_fortunes.yaml model=configs/models/gpt2-124m.yaml \
  device=cuda precision=bf16 steps=40 "data.train=[data/fortunes.txt]" data.seq_len=1024 \
  batch.micro=16 zero.stage=1 logging.every=10 logging.eval_every=0 logging.sample_tokens=0 \
  checkpoint.every=0 --profile --run-dir "$OUT/bench_124m" --no-progress > "$OUT/bench_124m.log" 2>&1
rc=$?
if [[ -f "$OUT/bench_124m/summary.json" ]]; then
  python3 - "$OUT/bench_124m/summary.json" <<'PY' | tee -a "$REPORT"
import json, sys
s = json.load(open(sys.argv[1]))
L, C, T, V = 12, 768, 1024, 50257
N = s.get("num_params") or (V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C)
tps = s["tokens_per_s"]
flops = 6 * N + 6 * L * C * T
mfu = tps * flops / 790e12
print(f"124M bf16: {tps:,.0f} tokens/s, {N/1e6:.1f}M params, {flops/1e9:.3f} GFLOP/token, "
      f"MFU {100*mfu:.1f}% of 790 TFLOP/s; profile: {json.dumps(s.get('profile'))}")
PY
fi
(( rc == 0 )) || { say "benchmark: FAILED (exit $rc):"; tail -20 "$OUT/bench_124m.log" | tee -a "$REPORT"; status=1; }

# --- 4. checkpoints: GPU resume is bitwise; a GPU checkpoint resumes on the CPU ---
say "== 4. resume: GPU -> GPU (bitwise) and GPU -> CPU"
common=(bench/recipes/m_fortunes.yaml device=cuda "data.train=[data/fortunes.txt]" zero.stage=2
        precision=bf16 logging.every=10 logging.eval_every=0 logging.sample_tokens=0
        checkpoint.every=20 --no-progress)
rm -rf "$OUT/resume_full" "$OUT/resume_half" "$OUT/resume_cpu"
run_bin fdtrain train "${common[@]}" steps=40 --run-dir "$OUT/resume_full" > "$OUT/resume.log" 2>&1 &&
  run_bin fdtrain train "${common[@]}" steps=20 --run-dir "$OUT/resume_half" >> "$OUT/resume.log" 2>&1 &&
  run_bin fdtrain train "${common[@]}" steps=40 --run-dir "$OUT/resume_half" --resume auto \
    >> "$OUT/resume.log" 2>&1 &&
  run_bin fdtrain train "${common[@]}" device=cpu steps=21 --run-dir "$OUT/resume_cpu" \
    --resume "$OUT/resume_half/checkpoints/step_00000020" >> "$OUT/resume.log" 2>&1
rc=$?
if (( rc == 0 )); then
  python3 - "$OUT" <<'PY' | tee -a "$REPORT"
import json, sys
out = sys.argv[1]
s = {k: json.load(open(f"{out}/resume_{k}/summary.json")) for k in ("full", "half", "cpu")}
same = s["full"]["weights_sha256"] == s["half"]["weights_sha256"]
m = {k: [json.loads(l) for l in open(f"{out}/resume_{k}/metrics.jsonl")] for k in ("full", "cpu")}
g21 = next(r["loss"] for r in m["full"] if r["step"] == 21) if any(r["step"] == 21 for r in m["full"]) else None
c21 = m["cpu"][-1]["loss"]
print(f"GPU resume at step 20 -> same weights_sha256 as the uninterrupted run: {same}")
print(f"GPU checkpoint resumed on the CPU: step-21 loss {c21:.5f} (GPU run's step 21: {g21})")
sys.exit(0 if same else 1)
PY
  rc=$?
fi
(( rc == 0 )) || { say "resume: FAILED (exit $rc):"; tail -20 "$OUT/resume.log" | tee -a "$REPORT"; status=1; }

# --- 5. ZeRO-Offload: the optimizer state in host memory, AdamW on the CPU ----
say "== 5. offload: zero.offload_optimizer host and nvme give the in-GPU weights_sha256"
mkdir -p "$OUT/offload_state"
rm -rf "$OUT/offload_none" "$OUT/offload_host" "$OUT/offload_host3" "$OUT/offload_nvme"
run_bin fdtrain train "${common[@]}" steps=20 --run-dir "$OUT/offload_none" > "$OUT/offload.log" 2>&1 &&
  run_bin fdtrain train "${common[@]}" steps=20 zero.offload_optimizer.device=host \
    --run-dir "$OUT/offload_host" >> "$OUT/offload.log" 2>&1 &&
  run_bin fdtrain train "${common[@]}" steps=20 zero.stage=3 zero.offload_optimizer.device=host \
    --run-dir "$OUT/offload_host3" >> "$OUT/offload.log" 2>&1 &&
  run_bin fdtrain train "${common[@]}" steps=20 zero.offload_optimizer.device=nvme \
    "zero.offload_optimizer.path=$OUT/offload_state" --run-dir "$OUT/offload_nvme" \
    >> "$OUT/offload.log" 2>&1
rc=$?
if (( rc == 0 )); then
  python3 - "$OUT" <<'PY' | tee -a "$REPORT"
import json, sys
out = sys.argv[1]
s = {k: json.load(open(f"{out}/offload_{k}/summary.json")) for k in ("none", "host", "host3", "nvme")}
sha = {k: v["weights_sha256"] for k, v in s.items()}
same = len(set(sha.values())) == 1
pinned = {k: s[k]["offload"]["optimizer_pinned_bytes"] for k in ("host", "host3", "nvme")}
print(f"offload none / host / host at stage 3 / nvme (20 steps, bf16, stage 2 unless said): one "
      f"weights_sha256: {same}; pinned transfer buffers {pinned}; ms/step "
      + ", ".join(f"{k} {v['ms_per_step']:.1f}" for k, v in s.items()))
sys.exit(0 if same and all(v > 0 for v in pinned.values()) else 1)
PY
  rc=$?
fi
(( rc == 0 )) || { say "offload: FAILED (exit $rc):"; tail -20 "$OUT/offload.log" | tee -a "$REPORT"; status=1; }

say "device_check: $([[ $status == 0 ]] && echo PASSED || echo FAILED)"
exit $status
