#!/usr/bin/env bash
# A rank stopped (SIGSTOP) inside MPI_Init or MPI_Finalize, where MPI itself
# has no timeout: its peers end the job within dist.timeout_s (lib/dist/init.cc's
# watchdog) with a message, and nothing is left running. A rank stopped just
# *after* MPI_Finalize, when its peers have exited 0 and no live peer is left
# to notice, is killed by its exit guard (the child lib/dist/init.cc forks)
# after dist.timeout_s, so mpirun ends the job non-zero. The stop is placed
# exactly by a small LD_PRELOAD shim around MPI_Init_thread / MPI_Finalize
# (compiled here with mpicc).
source "$(dirname "$0")/common.bash"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
command -v mpicc > /dev/null || { echo "skip: no mpicc"; exit 0; }
cat > "$TMP/shim.c" <<'C'
#include <mpi.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
static int chosen(const char* where) {
  const char* r = getenv("OMPI_COMM_WORLD_RANK");
  const char* w = getenv("SHIM_STOP_IN");
  return r && w && strcmp(r, "1") == 0 && strcmp(w, where) == 0;
}
int MPI_Init_thread(int* argc, char*** argv, int required, int* provided) {
  if (chosen("init")) raise(SIGSTOP);
  return PMPI_Init_thread(argc, argv, required, provided);
}
int MPI_Finalize(void) {
  if (chosen("finalize")) raise(SIGSTOP);
  int rc = PMPI_Finalize();
  if (chosen("after_finalize")) raise(SIGSTOP);
  return rc;
}
C
mpicc -shared -fPIC "$TMP/shim.c" -o "$TMP/shim.so" || { echo "FAIL: cannot build the shim"; exit 1; }
R=$TMP/r.yaml
write_recipe "$R"

# stop_case WHERE PATTERN
stop_case() {
  local where=$1 pattern=$2 start end secs rc out
  start=$(date +%s.%N)
  out=$(timeout 60 mpirun --oversubscribe --bind-to none -x LD_PRELOAD="$TMP/shim.so" -x SHIM_STOP_IN="$where" \
        -n 2 "$FDTRAIN" train "$R" dist.timeout_s=3 --run-dir "$TMP/$where" --no-progress 2>&1)
  rc=$?
  end=$(date +%s.%N)
  secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
  local left  # ranks, and their exit guards (forked, so the same command line)
  left=$(pgrep -f -- "--run-dir $TMP/$where" | tr '\n' ' ')
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || ! grep -Eq -- "$pattern" <<<"$out" || [ -n "$left" ]; then
    echo "FAIL: stopped in $where: exit $rc after ${secs}s, left running: '${left}'"
    echo "$out" | tail -8 | sed 's/^/    /'
    for p in $left; do kill -CONT "$p"; kill -KILL "$p"; done
    FAILURES=$((FAILURES + 1)); return
  fi
  echo "ok: stopped in $where: exit $rc after ${secs}s, /$pattern/"
}
stop_case init "rank 0 .*MPI initialisation did not complete within 3 s \(dist.timeout_s\)"
stop_case finalize "rank 0 .*MPI_Finalize did not complete within 3 s \(dist.timeout_s\)"
stop_case after_finalize "rank 1 .*stayed stopped for 3 s after it finished \(dist.timeout_s\)"
finish
