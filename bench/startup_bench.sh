#!/usr/bin/env bash
# make bench: what a CUDA build costs a CPU job at start-up (issue 42). `fdtrain
# validate recipes/quickstart.yaml` (start, read the recipe, check it, exit) and
# `fdtrain --version`, wall time, in a CUDA build against a CPU-only build of
# the same tree, alternating process by process, the median of N each. Goal: the
# CUDA build's median within 50 ms of the CPU build's. Also printed: the CUDA
# libraries each binary maps at start (none: cuBLASLt and NCCL are dlopen()ed
# on first GPU use, the CUDA runtime is static) and its size.
#
#   bench/startup_bench.sh CUDA_BUILD_DIR CPU_BUILD_DIR [N]
#   N  default 20
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
CUDA_BUILD=${1:?usage: startup_bench.sh CUDA_BUILD_DIR CPU_BUILD_DIR [N]}
CPU_BUILD=${2:?usage: startup_bench.sh CUDA_BUILD_DIR CPU_BUILD_DIR [N]}
N=${3:-20}
for b in "$CUDA_BUILD" "$CPU_BUILD"; do
  [ -x "$b/bin/fdtrain" ] || { echo "startup_bench.sh: $b/bin/fdtrain not built" >&2; exit 2; }
done
grep -qaF libcublasLt.so "$CUDA_BUILD/bin/fdtrain" ||
  { echo "startup_bench.sh: $CUDA_BUILD/bin/fdtrain has no CUDA backend" >&2; exit 2; }
! grep -qaF libcublasLt.so "$CPU_BUILD/bin/fdtrain" ||
  { echo "startup_bench.sh: $CPU_BUILD/bin/fdtrain has the CUDA backend" >&2; exit 2; }

echo "fdtrain start-up: a CUDA build against a CPU-only build (issue 42)"
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc --all) cores"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for b in "$CUDA_BUILD" "$CPU_BUILD"; do
  # Libraries the process opens before exiting (strace when present, else ldd's list).
  if command -v strace >/dev/null; then
    opened=$(strace -f -e trace=openat "$b/bin/fdtrain" validate recipes/quickstart.yaml 2>&1 >/dev/null |
      grep -oE '"[^"]*lib(cuda|cudart|cublas|cublasLt|nccl)[^"]*"' | sort -u | tr '\n' ' ' || true)
  else
    opened=$(ldd "$b/bin/fdtrain" | grep -oE 'lib(cuda|cudart|cublas|cublasLt|nccl)[^ ]*' | tr '\n' ' ' || true)
  fi
  printf "%-28s %6.1f MiB binary; CUDA libraries opened by validate: %s\n" "$b/bin/fdtrain" \
    "$(awk -v s="$(stat -c %s "$b/bin/fdtrain")" 'BEGIN { print s / 1048576 }')" "${opened:-none}"
done

# ms COMMAND...: one run's wall time in milliseconds.
ms() {
  local t0 t1
  t0=$(date +%s%N)
  "$@" >/dev/null 2>&1 || true
  t1=$(date +%s%N)
  echo $(((t1 - t0) / 1000))
}
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
worst=""
for what in "validate recipes/quickstart.yaml" "--version"; do
  read -ra args <<<"$what"
  cuda=() cpu=()
  "$CUDA_BUILD/bin/fdtrain" "${args[@]}" >/dev/null 2>&1 || true  # page cache warm
  "$CPU_BUILD/bin/fdtrain" "${args[@]}" >/dev/null 2>&1 || true
  for _ in $(seq 1 "$N"); do
    cuda+=("$(ms "$CUDA_BUILD/bin/fdtrain" "${args[@]}")")
    cpu+=("$(ms "$CPU_BUILD/bin/fdtrain" "${args[@]}")")
  done
  mc=$(printf "%s\n" "${cuda[@]}" | median)
  mp=$(printf "%s\n" "${cpu[@]}" | median)
  diff_ms=$(awk -v a="$mc" -v b="$mp" 'BEGIN { printf "%.1f", (a - b) / 1000 }')
  printf "fdtrain %-34s median of %d: CUDA build %7.1f ms, CPU build %7.1f ms, difference %s ms\n" \
    "$what" "$N" "$(awk -v a="$mc" 'BEGIN { print a / 1000 }')" "$(awk -v a="$mp" 'BEGIN { print a / 1000 }')" "$diff_ms"
  if [ -z "$worst" ] || awk -v a="$diff_ms" -v b="$worst" 'BEGIN { exit !(a > b) }'; then worst=$diff_ms; fi
done
awk -v w="$worst" 'BEGIN { printf "goal: a CUDA build within 50 ms of a CPU build at start-up: largest difference %.1f ms  %s\n", w, (w <= 50 ? "met" : "NOT met") }'
