# Helpers for the CLI tests: each test script sources this file, gets the
# fdtrain binary as $1, and calls `expect_fail CODE PATTERN -- ARGS...`.
set -u
FDTRAIN=$(realpath "$1")
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
FAILURES=0

# expect_fail CODE REGEX ARGS...: fdtrain ARGS must exit CODE and print a line matching REGEX.
expect_fail() {
  local code=$1 pattern=$2
  shift 2
  local out rc
  out=$("$FDTRAIN" "$@" 2>&1)
  rc=$?
  if [ "$rc" -ne "$code" ]; then
    echo "FAIL: fdtrain $* exited $rc, expected $code"; echo "$out" | sed 's/^/    /'
    FAILURES=$((FAILURES + 1)); return
  fi
  if ! grep -Eq -- "$pattern" <<<"$out"; then
    echo "FAIL: fdtrain $*: no line matches /$pattern/"; echo "$out" | sed 's/^/    /'
    FAILURES=$((FAILURES + 1)); return
  fi
  if grep -Eq "terminate called|Aborted|what\\(\\):|core dumped" <<<"$out"; then
    echo "FAIL: fdtrain $*: raw crash output"; echo "$out" | sed 's/^/    /'
    FAILURES=$((FAILURES + 1)); return
  fi
  echo "ok: exit $code, /$pattern/"
}

finish() {
  if [ "$FAILURES" -ne 0 ]; then echo "$FAILURES failure(s)"; exit 1; fi
  echo "all passed"
}

# A small valid recipe; callers append or sed lines.
write_recipe() {
  cat > "$1" <<'YAML'
model:
  n_layer: 1
  n_head: 2
  d_model: 16
  vocab_size: 256
  max_seq_len: 32
data:
  format: text
  train: [/usr/share/games/fortunes/fortunes]
  val_fraction: 0.0
  seq_len: 16
batch:
  micro: 2
optimizer:
  lr: 1.0e-3
steps: 3
logging:
  every: 1
  sample_tokens: 0
YAML
}

# tree_digest DIR: one line per file under DIR (path, type, size, mode and, for a
# regular file, sha256 of its content): compare two calls to show that a command
# changed nothing there ("no file outside the run's own outputs changes").
tree_digest() {
  (cd "$1" && find . -mindepth 1 -printf '%p %y %s %m\n' | LC_ALL=C sort &&
    find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum)
}

# expect_unchanged DIR BEFORE: fails unless tree_digest DIR equals BEFORE (a
# digest taken earlier); names what changed.
expect_unchanged() {
  local now
  now=$(tree_digest "$1")
  if [ "$now" != "$2" ]; then
    echo "FAIL: files under $1 changed:"; diff <(echo "$2") <(echo "$now") | sed 's/^/    /'
    FAILURES=$((FAILURES + 1)); return
  fi
  echo "ok: nothing under $1 changed"
}

# write_preference DIR: the preference tests' fixture (docs/OBJECTIVES.md): DIR/pairs.jsonl (16
# pairs, conversational and TRL's standard text shape), DIR/val.jsonl (4) and DIR/dpo.yaml, DPO
# under LoRA on a tiny Llama with the chatml-bytes tokenizer (run from the repository root).
write_preference() {
  cat > "$1/dpo.yaml" <<YAML
model: {arch: llama, n_layer: 2, n_head: 2, n_kv_head: 1, d_model: 32, d_ff: 64, vocab_size: 320,
        max_seq_len: 128}
lora: {r: 8, alpha: 16, targets: [all-linear]}
objective: {name: dpo, beta: 0.1}
data: {format: preference, train: [$1/pairs.jsonl], val: [$1/val.jsonl],
       tokenizer: $(pwd)/recipes/tokenizers/chatml-bytes, seq_len: 96}
batch: {micro: 8}
optimizer: {lr: 3.0e-2, weight_decay: 0.0}
steps: 3
seed: 3
checkpoint: {every: 2}
logging: {every: 1, eval_every: 2, eval_batches: 1, sample_tokens: 0}
YAML
  python3 - "$1" <<'PY'
import json, sys
tmp = sys.argv[1]
words = ["red", "blue", "green", "gold", "gray", "pink", "teal", "navy",
         "rust", "sand", "lime", "plum", "jade", "ruby", "onyx", "iris"]
with open(f"{tmp}/pairs.jsonl", "w") as f:
    for i, w in enumerate(words):
        if i % 4 == 3:  # TRL's standard (text) shape
            f.write(json.dumps({"prompt": f"Q: {w}?\nA:", "chosen": f" {w} is fine.",
                                "rejected": f" no {w}!"}) + "\n")
        else:
            f.write(json.dumps({"prompt": [{"role": "user", "content": f"Say {w}."}],
                                "chosen": [{"role": "assistant", "content": f"{w} is fine."}],
                                "rejected": [{"role": "assistant", "content": f"no {w}!"}]}) + "\n")
with open(f"{tmp}/val.jsonl", "w") as f:
    for w in ["amber", "coral", "mint", "sage"]:
        f.write(json.dumps({"prompt": [{"role": "user", "content": f"Say {w}."}],
                            "chosen": [{"role": "assistant", "content": f"{w} is fine."}],
                            "rejected": [{"role": "assistant", "content": f"no {w}!"}]}) + "\n")
PY
}
