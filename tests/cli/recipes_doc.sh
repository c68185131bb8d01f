#!/usr/bin/env bash
# docs/RECIPES.md is exactly what `fdtrain schema --markdown` prints (regenerate
# it with scripts/gen_recipes_doc.sh or `make docs` after changing the schema).
source "$(dirname "$0")/common.bash"
DOC="$(dirname "$0")/../../docs/RECIPES.md"
"$FDTRAIN" schema --markdown > "$TMP/RECIPES.md" || { echo "FAIL: schema --markdown exited $?"; exit 1; }
if cmp -s "$TMP/RECIPES.md" "$DOC"; then
  echo "ok: docs/RECIPES.md is current ($(wc -l < "$DOC") lines)"
else
  echo "FAIL: docs/RECIPES.md is stale; run scripts/gen_recipes_doc.sh BUILD_DIR (or make docs):"
  diff -u "$DOC" "$TMP/RECIPES.md" | head -30 | sed 's/^/    /'
  FAILURES=$((FAILURES + 1))
fi
finish
