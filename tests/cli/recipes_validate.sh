#!/usr/bin/env bash
# Every shipped recipe (recipes/**/*.yaml) passes `fdtrain validate`. It runs
# from a scratch directory holding a placeholder for each model.init_from
# (a file another recipe's run produces, e.g. lora_zero2's base model): validate
# checks that the file exists, training reads it.
source "$(dirname "$0")/common.bash"
RECIPES="$(cd "$(dirname "$0")/../../recipes" && pwd)"
n=0
while IFS= read -r f; do
  n=$((n + 1))
  init=$(sed -n 's/^ *init_from: *//p' "$f" | head -1)
  if [ -n "$init" ]; then mkdir -p "$TMP/$(dirname "$init")"; : > "$TMP/$init"; fi
  out=$(cd "$TMP" && "$FDTRAIN" validate "$f" 2>&1)
  if [ $? -eq 0 ]; then echo "ok: ${f#"$RECIPES/"} validates"
  else echo "FAIL: ${f#"$RECIPES/"}"; echo "$out" | sed 's/^/    /'; FAILURES=$((FAILURES + 1)); fi
done < <(find "$RECIPES" -name '*.yaml' | sort)
[ "$n" -ge 4 ] || { echo "FAIL: found only $n recipes in $RECIPES"; FAILURES=$((FAILURES + 1)); }
finish
