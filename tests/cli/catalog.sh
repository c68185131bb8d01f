#!/usr/bin/env bash
# fdtrain ls / cp / schema: every shipped recipe is listed with its one-line
# description; cp copies one byte for byte, refuses to overwrite without
# --overwrite and names the known recipes for an unknown one; FDTRAIN_RECIPES
# overrides where recipes are found; schema prints every key.
source "$(dirname "$0")/common.bash"
RECIPES="$(cd "$(dirname "$0")/../../recipes" && pwd)"

out=$("$FDTRAIN" ls 2>&1) || { echo "FAIL: ls exited $?"; echo "$out"; exit 1; }
n=0
while IFS= read -r f; do
  name=${f#"$RECIPES/"}; name=${name%.yaml}
  desc=$(head -1 "$f" | sed "s/^# *$(basename "$name"): *//")
  n=$((n + 1))
  if [ "${desc:0:1}" != "#" ] && grep -Fq -- "$name  " <<<"$out" && grep -Fq -- "$desc" <<<"$out"; then
    echo "ok: ls lists $name: $desc"
  else
    echo "FAIL: ls does not list $name with a description from its first line"; FAILURES=$((FAILURES + 1))
  fi
done < <(find "$RECIPES" -name '*.yaml' | sort)
grep -q "(no description)" <<<"$out" && { echo "FAIL: a recipe has no description line"; FAILURES=$((FAILURES + 1)); }
grep -q "^$n recipes in $RECIPES" <<<"$out" || grep -q "$n recipes in $RECIPES" <<<"$out" \
  || { echo "FAIL: ls footer"; echo "$out" | tail -2; FAILURES=$((FAILURES + 1)); }

"$FDTRAIN" cp quickstart "$TMP/q.yaml" > /dev/null 2>&1 && cmp -s "$TMP/q.yaml" "$RECIPES/quickstart.yaml" \
  && echo "ok: cp copies the recipe unchanged" || { echo "FAIL: cp quickstart"; FAILURES=$((FAILURES + 1)); }
mkdir "$TMP/dir"
"$FDTRAIN" cp pretrain_zero3.yaml "$TMP/dir" > /dev/null 2>&1 && cmp -s "$TMP/dir/pretrain_zero3.yaml" "$RECIPES/pretrain_zero3.yaml" \
  && echo "ok: cp NAME.yaml DIR writes DIR/NAME.yaml" || { echo "FAIL: cp into a directory"; FAILURES=$((FAILURES + 1)); }
expect_fail 2 "q.yaml already exists; pass --overwrite" cp quickstart "$TMP/q.yaml"
echo "edited" > "$TMP/q.yaml"
"$FDTRAIN" cp quickstart "$TMP/q.yaml" --overwrite > /dev/null 2>&1 && cmp -s "$TMP/q.yaml" "$RECIPES/quickstart.yaml" \
  && echo "ok: cp --overwrite replaces DEST" || { echo "FAIL: cp --overwrite"; FAILURES=$((FAILURES + 1)); }
expect_fail 2 "unknown recipe 'quickstrt' \(did you mean 'quickstart'\?\); the shipped recipes are: .*pretrain_zero3.*quickstart" \
  cp quickstrt "$TMP/x.yaml"
expect_fail 2 "directory .*/no/such does not exist" cp quickstart "$TMP/no/such/x.yaml"
# A copy outside the source tree cannot find configs/...: cp says so (and still copies).
out=$(cd "$TMP" && "$FDTRAIN" cp quickstart "$TMP/elsewhere.yaml" 2>&1)
grep -q "relative includes" <<<"$out" && echo "ok: cp warns when the copy's includes are not found" \
  || { echo "FAIL: no include warning"; echo "$out" | sed 's/^/    /'; FAILURES=$((FAILURES + 1)); }

# FDTRAIN_RECIPES: another catalogue, including a subdirectory; a bad value is an error.
mkdir -p "$TMP/cat/sub"
printf '# mine: my own recipe\nsteps: 1\n' > "$TMP/cat/mine.yaml"
printf 'steps: 1\n' > "$TMP/cat/sub/bare.yaml"
out=$(FDTRAIN_RECIPES="$TMP/cat" "$FDTRAIN" ls 2>&1)
if grep -Eq "^mine +my own recipe$" <<<"$out" && grep -Eq "^sub/bare +\(no description\)$" <<<"$out" \
   && ! grep -q quickstart <<<"$out"; then
  echo "ok: FDTRAIN_RECIPES replaces the catalogue"
else echo "FAIL: FDTRAIN_RECIPES"; echo "$out" | sed 's/^/    /'; FAILURES=$((FAILURES + 1)); fi
FDTRAIN_RECIPES="$TMP/cat" "$FDTRAIN" cp sub/bare "$TMP/bare.yaml" > /dev/null 2>&1 \
  && echo "ok: cp of a recipe in a subdirectory" || { echo "FAIL: cp sub/bare"; FAILURES=$((FAILURES + 1)); }
FDTRAIN_RECIPES="$TMP/none" expect_fail 2 "FDTRAIN_RECIPES=.*/none is not a directory" ls

out=$("$FDTRAIN" schema 2>&1)
for key in model.n_layer data.train optimizer.betas lora.targets activation_checkpointing.layers steps; do
  grep -q "^  $key: " <<<"$out" || { echo "FAIL: schema lacks $key"; FAILURES=$((FAILURES + 1)); }
done
grep -q "^  optimizer.lr: number = 3e-4  (> 0)$" <<<"$out" && echo "ok: schema prints every key" \
  || { echo "FAIL: schema optimizer.lr line"; FAILURES=$((FAILURES + 1)); }
finish
