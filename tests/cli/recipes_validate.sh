#!/usr/bin/env bash
# Every shipped recipe (recipes/**/*.yaml) passes `fdtrain validate`. It runs
# from a scratch directory holding a placeholder for each model.init_from
# (a file another recipe's run produces, e.g. lora_zero2's base model): validate
# checks that the file exists, training reads it. A Hugging Face directory gets a
# config.json of configs/models/llama-chat-nano.yaml's shape (llama-nano's, what
# pretrain_llama exports, with the vocabulary of pretrain_chat_base's tokenizer): its
# config.json decides the model section, so validate reads it. Paths inside the repository
# (recipes/data, recipes/tokenizers) resolve from the scratch directory through a link.
source "$(dirname "$0")/common.bash"
RECIPES="$(cd "$(dirname "$0")/../../recipes" && pwd)"
ln -s "$RECIPES" "$TMP/recipes"
n=0
while IFS= read -r f; do
  n=$((n + 1))
  init=$(sed -n 's/^ *init_from: *\([^ #]*\).*/\1/p' "$f" | head -1)
  if [[ "$init" == *.safetensors || "$init" == *.h5 ]]; then
    mkdir -p "$TMP/$(dirname "$init")"; : > "$TMP/$init"
  elif [ -n "$init" ]; then  # a Hugging Face directory: validate reads its config.json
    mkdir -p "$TMP/$init"
    cat > "$TMP/$init/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
 "head_dim": 32, "hidden_act": "silu", "hidden_size": 128, "intermediate_size": 352,
 "max_position_embeddings": 512, "mlp_bias": false, "model_type": "llama",
 "num_attention_heads": 4, "num_hidden_layers": 4, "num_key_value_heads": 2,
 "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 10000.0,
 "tie_word_embeddings": false, "vocab_size": 320}
JSON
  fi
  out=$(cd "$TMP" && "$FDTRAIN" validate "$f" 2>&1)
  if [ $? -eq 0 ]; then echo "ok: ${f#"$RECIPES/"} validates"
  else echo "FAIL: ${f#"$RECIPES/"}"; echo "$out" | sed 's/^/    /'; FAILURES=$((FAILURES + 1)); fi
done < <(find "$RECIPES/" -name '*.yaml' | sort)
[ "$n" -ge 4 ] || { echo "FAIL: found only $n recipes in $RECIPES"; FAILURES=$((FAILURES + 1)); }

# So does the example at the top of docs/RECIPE.md (its includes found from the working
# directory, the repository root).
awk '/^```yaml$/ {n++; next} n == 1 && /^```$/ {exit} n == 1' \
  "$(dirname "$0")/../../docs/RECIPE.md" > "$TMP/recipe_md_example.yaml"
if [ -s "$TMP/recipe_md_example.yaml" ] && out=$("$FDTRAIN" validate "$TMP/recipe_md_example.yaml" 2>&1); then
  echo "ok: the example in docs/RECIPE.md validates"
else
  echo "FAIL: the example in docs/RECIPE.md"; echo "$out" | sed 's/^/    /'; FAILURES=$((FAILURES + 1))
fi
finish
