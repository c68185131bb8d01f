#!/usr/bin/env bash
# Runs the ctest suite of a sanitizer build (make test-asan, make test-tsan):
#   tests/sanitizers/ctest.sh BUILD_DIR address|thread [ctest args...]
# Sets the sanitizers' options for every process the tests start (mpirun
# passes the environment on to its ranks) and points them at the suppression
# files here; each suppression there says why it is not a bug in fdtrain.
set -euo pipefail
BUILD=$(realpath "$1")
KIND=$2
shift 2
HERE=$(cd "$(dirname "$0")" && pwd)
case "$KIND" in
  address)
    # Leaks are findings (detect_leaks), apart from the libraries' own (lsan.supp).
    # verify_asan_link_order=0: capi.mlp's find_package check builds an uninstrumented C
    # program against the instrumented libfdtrain.so, which brings the ASan runtime in second.
    # fast_unwind_on_malloc=0: Open MPI's libraries have no frame pointers, so only the
    # slow unwinder gives the full allocation stacks that lsan.supp's entries match.
    export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:strict_string_checks=1:check_initialization_order=1:verify_asan_link_order=0:fast_unwind_on_malloc=0"
    export LSAN_OPTIONS="suppressions=$HERE/lsan.supp:print_suppressions=0"
    export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
    ;;
  thread)
    export TSAN_OPTIONS="suppressions=$HERE/tsan.supp:halt_on_error=1:second_deadlock_stack=1:print_suppressions=0"
    ;;
  *) echo "usage: $0 BUILD_DIR address|thread [ctest args...]" >&2; exit 2 ;;
esac
cd "$BUILD"
exec ctest --output-on-failure "$@"
