#!/usr/bin/env bash
# `fdtrain help [COMMAND [SUBCOMMAND]]` prints the help that `--help` prints,
# exit 0; an unknown command is a usage error naming the commands.
source "$(dirname "$0")/common.bash"

# expect_help PATTERN ARGS...: fdtrain ARGS exits 0 and prints a line matching PATTERN,
# the same text as fdtrain ARGS-without-"help" --help.
expect_help() {
  local pattern=$1; shift
  local out rc want
  out=$("$FDTRAIN" "$@" 2>&1); rc=$?
  want=$("$FDTRAIN" "${@:2}" --help 2>&1)
  if [ $rc -ne 0 ] || ! grep -Eq -- "$pattern" <<<"$out" || [ "$out" != "$want" ]; then
    echo "FAIL: fdtrain $*: exit $rc, expected 0, /$pattern/ and the --help text"
    echo "$out" | sed 's/^/    /'; FAILURES=$((FAILURES + 1))
  else
    echo "ok: fdtrain $* prints the help"
  fi
}

expect_help "validate" help
expect_help "--run-dir" help train
expect_help "report every error" help validate
expect_help "--world-size" help estimate
expect_help "--lora-adapter" help ckpt export
expect_help "--format" help eval

expect_fail 2 "help: no command 'trian' \(did you mean 'train'\?\); the commands are train, validate" help trian
expect_fail 2 "help: no command 'recipes/quickstart.yaml'" help recipes/quickstart.yaml

finish
