#!/usr/bin/env bash
# The base of a LoRA checkpoint, outside training. The checkpoint holds only
# the adapters and the SHA-256 of the base file (model.init_from) they were
# trained on; every command that combines the two (ckpt export --merge-lora,
# eval, generate) must refuse another file at that path rather than silently
# merge into it. A run records model.init_from as an absolute path (given
# relative, it is taken from the directory the run was started in), so every
# command works from any directory; exporting the adapter alone needs no base
# at all. (A relative path in an older checkpoint gets a message saying where
# it is resolved from: tests/ckpt/lora_base_test.cc.)
source "$(dirname "$0")/common.bash"
R=$TMP/r.yaml
write_recipe "$R"
mkdir -p "$TMP/work" "$TMP/elsewhere"
"$FDTRAIN" train "$R" checkpoint.every=3 --run-dir "$TMP/base" --no-progress > /dev/null 2>&1 \
  || { echo "FAIL: base run"; exit 1; }
"$FDTRAIN" ckpt export "$TMP/base" --out "$TMP/work/base.safetensors" > /dev/null \
  || { echo "FAIL: base export"; exit 1; }
head -c 60 /usr/share/games/fortunes/literature > "$TMP/val.txt"
# The LoRA run names its base relatively, from $TMP/work.
(cd "$TMP/work" && "$FDTRAIN" train "$R" model.init_from=base.safetensors \
  'lora={r: 2, targets: [c_attn, c_fc]}' optimizer.lr=1e-2 steps=4 checkpoint.every=4 \
  --run-dir "$TMP/lora" --no-progress > "$TMP/lora.log" 2>&1) \
  || { echo "FAIL: LoRA run"; tail -5 "$TMP/lora.log"; exit 1; }

# ok_in DIR WHAT ARGS...: fdtrain ARGS, run in DIR, must exit 0.
ok_in() {
  local dir=$1 what=$2
  shift 2
  local out
  if out=$(cd "$dir" && "$FDTRAIN" "$@" 2>&1); then echo "ok: $what"
  else echo "FAIL: $what: fdtrain $*"; echo "$out" | tail -5 | sed 's/^/    /'; FAILURES=$((FAILURES + 1)); fi
}
# fail_in DIR CODE PATTERN ARGS...: expect_fail, run in DIR.
fail_in() {
  local dir=$1
  shift
  pushd "$dir" > /dev/null || exit 1
  expect_fail "$@"
  popd > /dev/null || exit 1
}

# From the run's directory, with the right base, everything works.
ok_in "$TMP/work" "merged export from the run's directory" \
  ckpt export "$TMP/lora" --merge-lora --out "$TMP/merged.safetensors"
ok_in "$TMP/work" "eval from the run's directory" eval "$TMP/lora" --data "$TMP/val.txt"
ok_in "$TMP/work" "generate from the run's directory" generate "$TMP/lora" --max-tokens 3

# From elsewhere: the base path was recorded absolute, so the merging commands find it.
ok_in "$TMP/elsewhere" "adapter export from another directory" \
  ckpt export "$TMP/lora" --lora-adapter "$TMP/adapter"
[ -f "$TMP/adapter/adapter_config.json" ] && echo "ok: the adapter was written" \
  || { echo "FAIL: no adapter_config.json"; FAILURES=$((FAILURES + 1)); }
ok_in "$TMP/elsewhere" "merged export from another directory" \
  ckpt export "$TMP/lora" --merge-lora --out "$TMP/m2.safetensors"
ok_in "$TMP/elsewhere" "eval from another directory" eval "$TMP/lora" --data "$TMP/val.txt"
ok_in "$TMP/elsewhere" "generate from another directory" generate "$TMP/lora" --max-tokens 3
# The adapter export does not need the base at all.
mv "$TMP/work/base.safetensors" "$TMP/work/base.away"
ok_in "$TMP/elsewhere" "adapter export without the base file" \
  ckpt export "$TMP/lora" --lora-adapter "$TMP/adapter3"
mv "$TMP/work/base.away" "$TMP/work/base.safetensors"

# Another file at the base's path (one byte of its last tensor changed): refused by every
# command that merges, with the two digests, and no output file is left behind.
printf '\x01' | dd of="$TMP/work/base.safetensors" bs=1 \
  seek=$(( $(stat -c %s "$TMP/work/base.safetensors") - 3 )) conv=notrunc status=none
SHA="trained on a base with SHA-256 [0-9a-f]{64}, but model.init_from \(.*/work/base.safetensors\) has [0-9a-f]{64}"
fail_in "$TMP/work" 2 "$SHA" ckpt export "$TMP/lora" --merge-lora --out "$TMP/wrong.safetensors"
[ ! -e "$TMP/wrong.safetensors" ] && echo "ok: the refused merge wrote nothing" \
  || { echo "FAIL: the refused merge wrote $TMP/wrong.safetensors"; FAILURES=$((FAILURES + 1)); }
fail_in "$TMP/work" 2 "$SHA" eval "$TMP/lora" --data "$TMP/val.txt"
fail_in "$TMP/work" 2 "$SHA" generate "$TMP/lora" --max-tokens 3
# The adapter export still works: it does not combine the adapters with any base.
ok_in "$TMP/work" "adapter export with a changed base" \
  ckpt export "$TMP/lora" --lora-adapter "$TMP/adapter2"
finish
