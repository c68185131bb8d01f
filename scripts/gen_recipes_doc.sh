#!/usr/bin/env bash
# Writes docs/RECIPES.md, the reference of every recipe key, from the schema
# (lib/config/reference.cc) as `fdtrain schema --markdown` prints it.
#
#   scripts/gen_recipes_doc.sh [BUILD_DIR]           (default BUILD_DIR: build)
#   scripts/gen_recipes_doc.sh --check [BUILD_DIR]   exit 1 if docs/RECIPES.md is stale
#
# `make docs` runs the first; the test cli.recipes_doc runs the check.
set -euo pipefail
cd "$(dirname "$0")/.."
check=0
if [ "${1:-}" = "--check" ]; then check=1; shift; fi
fdtrain="${1:-build}/bin/fdtrain"
[ -x "$fdtrain" ] || { echo "gen_recipes_doc: $fdtrain not found; build first (make build)" >&2; exit 2; }
new=$(mktemp)
trap 'rm -f "$new"' EXIT
"$fdtrain" schema --markdown > "$new"
if [ "$check" = 1 ]; then
  if ! cmp -s "$new" docs/RECIPES.md; then
    echo "docs/RECIPES.md is not what 'fdtrain schema --markdown' prints; regenerate it with" \
      "scripts/gen_recipes_doc.sh (or make docs):" >&2
    diff -u docs/RECIPES.md "$new" | head -40 >&2 || true
    exit 1
  fi
  echo "docs/RECIPES.md is current"
  exit 0
fi
cp "$new" docs/RECIPES.md
echo "wrote docs/RECIPES.md"
