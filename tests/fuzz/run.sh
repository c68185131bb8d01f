#!/usr/bin/env bash
# Runs every libFuzzer target of a fuzz build for SECONDS each (make fuzz):
#   tests/fuzz/run.sh BUILD_DIR SECONDS [TARGET...]
# Each target starts from its committed seeds (tests/fuzz/corpus/<t>/) and
# the corpus it grew before (BUILD_DIR/corpus/<t>/, where new inputs go), with
# its dictionary if there is one (tests/fuzz/<t>.dict). Crashing, leaking or
# hanging inputs land in BUILD_DIR/artifacts/<t>/: replay one with
# BUILD_DIR/fuzz/<t>_fuzz FILE, fix, then commit it under
# tests/fuzz/regressions/<t>/ so that ctest's fuzz_regressions.<t> replays it.
# Prints one line per target (executions, exec/s, corpus, coverage as the
# last status line's cov: edges and ft: features, findings) and exits 1 if
# any target found something.
set -uo pipefail
BUILD=$(realpath "$1")
SECONDS_EACH=$2
shift 2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=(recipe token_file tokenizer jinja safetensors peft shard \
  hf_config hf_index sft_records tokenizer_config chat_messages)
cd "$ROOT"  # recipe includes (configs/...) resolve from the repository root
# Leaks are findings, except HDF5's and yaml-cpp's own caches (tests/sanitizers/lsan.supp).
export LSAN_OPTIONS="suppressions=$ROOT/tests/sanitizers/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
found=0
printf '%-16s %12s %8s %8s %16s %s\n' target executions exec/s corpus cov/ft findings
for t in "${TARGETS[@]}"; do
  bin=$BUILD/fuzz/${t}_fuzz
  [ -x "$bin" ] || { echo "$bin: not built (make fuzz builds it)"; exit 2; }
  mkdir -p "$BUILD/corpus/$t" "$BUILD/artifacts/$t"
  extra=()  # FDFUZZ_HDF5=1: the shard target also takes raw HDF5 (shard_fuzz.cc), seeded with real shards
  [ "$t" = shard ] && [ -n "${FDFUZZ_HDF5:-}" ] && extra=("tests/fuzz/corpus/shard_hdf5")
  dict=()
  [ -f "tests/fuzz/$t.dict" ] && dict=(-dict="tests/fuzz/$t.dict")
  # HDF5 has no frame pointers: the shard target needs the slow unwinder for
  # full allocation stacks (lsan.supp matches a frame of its shard writer).
  asan=""
  [ "$t" = shard ] && asan="fast_unwind_on_malloc=0"
  log=$BUILD/artifacts/$t.log
  before=$(find "$BUILD/artifacts/$t" -type f | wc -l)
  ASAN_OPTIONS="$asan" "$bin" "$BUILD/corpus/$t" "tests/fuzz/corpus/$t" "${extra[@]}" "${dict[@]}" \
    -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$BUILD/artifacts/$t/" > "$log" 2>&1
  rc=$?
  after=$(find "$BUILD/artifacts/$t" -type f | wc -l)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  corpus=$(find "$BUILD/corpus/$t" -type f | wc -l)
  cov=$(grep -E '^#[0-9]+.* cov: [0-9]+ ft: [0-9]+' "$log" | tail -1 | sed -E 's/.* cov: ([0-9]+) ft: ([0-9]+).*/\1\/\2/')
  new=$((after - before))
  status="none"
  if [ $rc -ne 0 ] || [ $new -ne 0 ]; then
    found=1
    status="$new new artifact(s), exit $rc: $(grep -m1 -E 'ERROR:|SUMMARY:|runtime error' "$log")"
  fi
  printf '%-16s %12s %8s %8s %16s %s\n' "$t" "${execs:-?}" "${speed:-?}" "$corpus" "${cov:-?}" "$status"
done
exit $found
