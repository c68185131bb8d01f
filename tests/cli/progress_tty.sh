#!/usr/bin/env bash
# The progress line on a terminal (issue 16, item 10): log lines (a
# checkpoint saved, a warning) are printed on lines of their own above it,
# never glued onto it ("... ETA 2sfdtrain: checkpoint ..."), and the final
# state stays on screen. The terminal is a pseudo-terminal from script(1).
source "$(dirname "$0")/common.bash"
if ! command -v script > /dev/null; then
  echo "skip: script(1) (util-linux) is not installed; the terminal test did not run"; exit 0
fi
R=$TMP/r.yaml
write_recipe "$R"
sed -i 's/^steps: 3/steps: 60/' "$R"
script -qec "'$FDTRAIN' train '$R' checkpoint.every=10 --run-dir '$TMP/run'" "$TMP/tty.log" > /dev/null 2>&1 \
  || { echo "FAIL: the run under a pseudo-terminal failed"; tail -5 "$TMP/tty.log"; exit 1; }
# Split what the terminal received at carriage returns and newlines: every
# piece that holds "fdtrain:" must start with it.
glued=$(tr '\r' '\n' < "$TMP/tty.log" | sed 's/\x1b\[2K//g' | grep -n '.fdtrain:' | head -3)
if [ -n "$glued" ]; then
  echo "FAIL: a log line is glued onto the progress line:"; echo "$glued" | sed 's/^/    /'; FAILURES=$((FAILURES + 1))
else
  echo "ok: every log line starts a line of its own"
fi
saves=$(tr '\r' '\n' < "$TMP/tty.log" | sed 's/\x1b\[2K//g' | grep -c '^fdtrain: checkpoint of step [0-9]* saved')
[ "$saves" -eq 6 ] && echo "ok: the 6 checkpoint lines are on screen" || { echo "FAIL: $saves checkpoint lines, expected 6"; FAILURES=$((FAILURES + 1)); }
grep -q 'step 60/60 | loss [0-9.]* | [0-9]* tok/s | ETA 0s' "$TMP/tty.log" \
  && echo "ok: the final progress state stays" || { echo "FAIL: no final progress line"; FAILURES=$((FAILURES + 1)); }
finish
