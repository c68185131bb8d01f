#!/usr/bin/env bash
# fdtrain generate: from a run directory it reproduces the sample the trainer
# printed at the end of the run (same weights, prompt, temperature, top-k, seed
# and context), also from the run's export; a fixed seed gives the same text,
# another seed other text; --temperature 0 and a tiny --top-p are greedy;
# --tokens on a model without a byte vocabulary; errors.
source "$(dirname "$0")/common.bash"
R=$TMP/r.yaml
write_recipe "$R"
"$FDTRAIN" train "$R" steps=20 checkpoint.every=20 logging.sample_tokens=60 \
  'logging.sample_prompt="The "' logging.sample_temperature=0.9 logging.sample_top_k=20 seed=5 \
  --run-dir "$TMP/run" --no-progress > "$TMP/train.log" 2>&1 \
  || { echo "FAIL: training run"; tail -5 "$TMP/train.log"; exit 1; }
"$FDTRAIN" ckpt export "$TMP/run" --out "$TMP/model.safetensors" > /dev/null || { echo "FAIL: export"; exit 1; }

gen() { "$FDTRAIN" generate "$@" --json 2>/dev/null; }
# The trainer's context is data.seq_len (16); a checkpoint's default is the same, an export's
# is max_seq_len, so it is given.
for model in "$TMP/run" "$TMP/model.safetensors --context 16"; do
  # shellcheck disable=SC2086
  out=$(gen $model --prompt "The " --max-tokens 60 --temperature 0.9 --top-k 20 --seed 5)
  if python3 - "$TMP/run/summary.json" "$out" <<'PY'; then
import json, sys
sample = json.load(open(sys.argv[1]))["sample"]
ours = json.loads(sys.argv[2])
assert len(ours["tokens"]) == 60, ours
sys.exit(0 if "The " + ours["text"] == sample else 1)
PY
    echo "ok: generate from ${model%% *} reproduces the end-of-training sample"
  else
    echo "FAIL: generate from $model differs from the trainer's sample"; echo "$out" | head -5
    FAILURES=$((FAILURES + 1))
  fi
done

a=$("$FDTRAIN" generate "$TMP/run" --prompt "To be" --max-tokens 80 --seed 11 2>/dev/null)
b=$("$FDTRAIN" generate "$TMP/run" --prompt "To be" --max-tokens 80 --seed 11 2>/dev/null)
c=$("$FDTRAIN" generate "$TMP/run" --prompt "To be" --max-tokens 80 --seed 12 2>/dev/null)
if [ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" != "$c" ] && [ "${a:0:5}" = "To be" ]; then
  echo "ok: same seed, same text; another seed, other text"
else echo "FAIL: determinism: '$a' / '$b' / '$c'"; FAILURES=$((FAILURES + 1)); fi

# Past the context (16) the window slides; 200 tokens still come out.
n=$(gen "$TMP/run" --max-tokens 200 | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["tokens"]))')
[ "$n" = 200 ] && echo "ok: 200 tokens through a 16-token window" \
  || { echo "FAIL: long generation gave '$n' tokens"; FAILURES=$((FAILURES + 1)); }

# The golden model (vocabulary 67): no byte tokenizer, token ids in and out.
G="$(dirname "$0")/../golden/gpt_tiny.safetensors"
python3 - "$G" "$TMP/tiny.safetensors" <<'PY' || { echo "FAIL: writing the tiny model"; exit 1; }
import json, struct, sys
src = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", src[:8])[0]
header = json.loads(src[8:8 + n])
keep = {k: v for k, v in header.items() if k != "__metadata__" and k.split(".")[0] in
        ("wte", "wpe", "h", "ln_f")}
data, out, off = src[8 + n:], {}, 0
blobs = []
for k, v in keep.items():
    b, e = v["data_offsets"]
    blobs.append(data[b:e]); out[k] = dict(v, data_offsets=[off, off + e - b]); off += e - b
out["__metadata__"] = {"n_head": header["__metadata__"]["n_head"]}
h = json.dumps(out).encode()
open(sys.argv[2], "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PY
out=$("$FDTRAIN" generate "$TMP/tiny.safetensors" --tokens 1,2,3 --max-tokens 5 2>&1)
if grep -Eq "^[0-9]+(,[0-9]+){4}$" <<<"$out"; then echo "ok: --tokens in, 5 token ids out"
else echo "FAIL: --tokens output"; echo "$out" | sed 's/^/    /'; FAILURES=$((FAILURES + 1)); fi

expect_fail 2 "not a byte-level model.*--tokens" generate "$TMP/tiny.safetensors" --prompt "hi"
expect_fail 2 "token 67 is outside the model's vocabulary \[0, 67\)" \
  generate "$TMP/tiny.safetensors" --tokens 1,67
expect_fail 2 "'x' is not a token id" generate "$TMP/tiny.safetensors" --tokens 1,x
# --temperature 0 is greedy: the same text whatever the seed, as --top-k 1; a tiny --top-p keeps
# only the likeliest token, so it is greedy too.
g0=$("$FDTRAIN" generate "$TMP/run" --prompt "To be" --max-tokens 40 --temperature 0 --seed 1 2>/dev/null)
g1=$("$FDTRAIN" generate "$TMP/run" --prompt "To be" --max-tokens 40 --temperature 0 --seed 2 2>/dev/null)
g2=$("$FDTRAIN" generate "$TMP/run" --prompt "To be" --max-tokens 40 --top-k 1 --seed 3 2>/dev/null)
g3=$("$FDTRAIN" generate "$TMP/run" --prompt "To be" --max-tokens 40 --top-p 1e-6 --seed 4 2>/dev/null)
s1=$("$FDTRAIN" generate "$TMP/run" --prompt "To be" --max-tokens 40 --temperature 2 --top-k 0 --seed 1 2>/dev/null)
if [ -n "$g0" ] && [ "$g0" = "$g1" ] && [ "$g0" = "$g2" ] && [ "$g0" = "$g3" ] && [ "$g0" != "$s1" ]; then
  echo "ok: --temperature 0 is greedy (= --top-k 1 = --top-p 1e-6, any seed; sampling differs)"
else echo "FAIL: greedy: '$g0' / '$g1' / '$g2' / '$g3' / sampled '$s1'"; FAILURES=$((FAILURES + 1)); fi
top_p=$(gen "$TMP/run" --max-tokens 2 --top-p 0.9 | python3 -c 'import json,sys; print(json.load(sys.stdin)["top_p"])')
[ "$top_p" = 0.8999999761581421 ] || [ "$top_p" = 0.9 ] && echo "ok: --json records top_p" \
  || { echo "FAIL: --json top_p '$top_p'"; FAILURES=$((FAILURES + 1)); }
expect_fail 2 "--temperature must be >= 0" generate "$TMP/run" --temperature -1
expect_fail 2 "--top-p must be in \(0, 1\]" generate "$TMP/run" --top-p 0
expect_fail 2 "--top-p must be in \(0, 1\].*got 1.5" generate "$TMP/run" --top-p 1.5
expect_fail 2 "not both" generate "$TMP/run" --prompt a --tokens 1
expect_fail 2 "--context 40 is longer than the model's max_seq_len 32" generate "$TMP/run" --context 40
expect_fail 2 "nope does not exist" generate "$TMP/nope"
finish
