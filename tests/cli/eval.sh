#!/usr/bin/env bash
# fdtrain eval: on a checkpoint and on its .safetensors/.h5 exports it reports
# the loss the training loop itself computed on the same windows. The run's
# validation file holds exactly one window (seq_len + 1 bytes), so the
# trainer's end-of-run eval loss (summary.json) is the loss of window 0, which
# `fdtrain eval --windows 1` must reproduce to 1e-6. Then the errors: missing
# files, --seq-len past the context, too few tokens for --windows.
source "$(dirname "$0")/common.bash"
R=$TMP/r.yaml
write_recipe "$R"
head -c 17 /usr/share/games/fortunes/literature > "$TMP/val.txt"    # seq_len 16 + 1
"$FDTRAIN" train "$R" "data.val=[$TMP/val.txt]" logging.eval_batches=1 checkpoint.every=3 \
  --run-dir "$TMP/run" --no-progress > "$TMP/train.log" 2>&1 \
  || { echo "FAIL: training run"; tail -5 "$TMP/train.log"; exit 1; }
for ext in safetensors h5; do
  "$FDTRAIN" ckpt export "$TMP/run" --out "$TMP/model.$ext" > /dev/null \
    || { echo "FAIL: export $ext"; exit 1; }
done

# check_loss MODEL [SUMMARY]: |eval loss of MODEL - the trainer's eval loss in SUMMARY| <= 1e-6
check_loss() {
  local model=$1 summary=${2:-$TMP/run/summary.json}
  local out
  # stdout is the JSON; stderr may name the checkpoint read.
  out=$("$FDTRAIN" eval "$model" --data "$TMP/val.txt" --seq-len 16 --windows 1 --json 2>"$TMP/eval.err") \
    || { echo "FAIL: eval $model"; sed 's/^/    /' "$TMP/eval.err"; FAILURES=$((FAILURES + 1)); return; }
  if python3 - "$summary" "$out" <<'PY'; then
import json, sys
trainer = json.load(open(sys.argv[1]))["eval_loss"]
ours = json.loads(sys.argv[2])
assert ours["windows"] == 1 and ours["seq_len"] == 16 and ours["targets"] == 16, ours
d = abs(ours["mean_loss"] - trainer)
print(f"    eval {ours['mean_loss']:.9f}, trainer {trainer:.9f}, |diff| {d:.1e}")
sys.exit(0 if d <= 1e-6 else 1)
PY
    echo "ok: eval of $(basename "$model") reproduces the trainer's eval loss"
  else
    echo "FAIL: eval of $model differs from the trainer's eval loss"; FAILURES=$((FAILURES + 1))
  fi
}
check_loss "$TMP/run"
check_loss "$TMP/model.safetensors"
check_loss "$TMP/model.h5"

# A LoRA run on top of the export: eval rebuilds base + adapters from the checkpoint.
"$FDTRAIN" train "$R" "data.val=[$TMP/val.txt]" logging.eval_batches=1 checkpoint.every=3 \
  model.init_from="$TMP/model.safetensors" 'lora={r: 2, targets: [c_attn, c_fc]}' optimizer.lr=1e-2 \
  --run-dir "$TMP/lora" --no-progress > "$TMP/lora.log" 2>&1 \
  || { echo "FAIL: LoRA run"; tail -5 "$TMP/lora.log"; exit 1; }
check_loss "$TMP/lora" "$TMP/lora/summary.json"

# A sanity check of the number itself: a wrong window (text shifted by one byte) gives another loss.
tail -c +2 "$TMP/val.txt" > "$TMP/shifted.txt"; printf 'x' >> "$TMP/shifted.txt"
a=$("$FDTRAIN" eval "$TMP/run" --data "$TMP/val.txt" --seq-len 16 --json | sed -n 's/.*"mean_loss": \(.*\),/\1/p')
b=$("$FDTRAIN" eval "$TMP/run" --data "$TMP/shifted.txt" --seq-len 16 --json | sed -n 's/.*"mean_loss": \(.*\),/\1/p')
if [ -n "$a" ] && [ "$a" != "$b" ]; then echo "ok: other windows, other loss ($a vs $b)"
else echo "FAIL: eval loss '$a' vs '$b'"; FAILURES=$((FAILURES + 1)); fi

# Text output; windows from the start of a longer file; default windows = all that fit.
head -c 60 /usr/share/games/fortunes/literature > "$TMP/three.txt"  # 3 windows of 17, 9 bytes left
out=$("$FDTRAIN" eval "$TMP/model.safetensors" --data "$TMP/three.txt" --seq-len 16 2>&1)
if grep -q "^windows     3 x 17 tokens" <<<"$out" && grep -q "^perplexity  " <<<"$out"; then
  echo "ok: text output, 3 windows fit 60 tokens"
else echo "FAIL: eval text output"; echo "$out" | sed 's/^/    /'; FAILURES=$((FAILURES + 1)); fi

# Progress on a terminal only: `script` gives fdtrain a TTY; the first window draws the line,
# the last clears it.
if command -v script > /dev/null; then
  out=$(script -qec "$FDTRAIN eval $TMP/model.safetensors --data $TMP/three.txt --seq-len 16 --batch 1" /dev/null)
  if grep -Eq $'eval: 1/3 windows \\| mean loss [0-9.]+' <<<"$out" && grep -q $'\r\e\\[2Kmodel ' <<<"$out"; then
    echo "ok: a progress line on a terminal, cleared before the result"
  else echo "FAIL: no progress line on a TTY"; echo "$out" | cat -v | sed 's/^/    /'; FAILURES=$((FAILURES + 1)); fi
else echo "skipped: no \`script\` for a TTY"; fi
err=$("$FDTRAIN" eval "$TMP/model.safetensors" --data "$TMP/three.txt" --seq-len 16 --batch 1 2>&1 >/dev/null)
if grep -q "windows |" <<<"$err" || grep -q $'\e' <<<"$err"; then
  echo "FAIL: progress drawn when stderr is not a terminal"; echo "$err" | cat -v; FAILURES=$((FAILURES + 1))
else echo "ok: no progress line when stderr is not a terminal"; fi

expect_fail 2 "nope.*does not exist" eval "$TMP/nope" --data "$TMP/val.txt"
expect_fail 2 "--data .*missing.txt: no such file" eval "$TMP/run" --data "$TMP/missing.txt"
expect_fail 2 "--data /dev/zero: is a character device, not a regular file" eval "$TMP/run" --data /dev/zero
expect_fail 2 "--data .*: is a directory, not a regular file" eval "$TMP/run" --data "$TMP"
expect_fail 2 "--seq-len 33 is longer than the model's context \(max_seq_len 32\)" \
  eval "$TMP/run" --data "$TMP/three.txt" --seq-len 33
expect_fail 2 "holds 60 tokens: room for 3 windows of seq_len \+ 1 = 17 tokens, not 4" \
  eval "$TMP/model.h5" --data "$TMP/three.txt" --seq-len 16 --windows 4
expect_fail 2 "fewer than one window" eval "$TMP/run" --data "$TMP/val.txt" --seq-len 20
expect_fail 2 "--windows must be >= 1" eval "$TMP/run" --data "$TMP/val.txt" --windows 0
finish
