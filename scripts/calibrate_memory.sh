#!/usr/bin/env bash
# Measures the runtime part of fdtrain's memory on this host for this build at 1, 2 and 4 ranks
# (fdtrain calibrate; lib/engine/process_memory.h) into fdtrain.memory.json beside the binary.
# Run by the build after fdtrain is linked. A failure is reported and leaves `fdtrain estimate`
# without a peak-RSS prediction (it says how to calibrate); it does not fail the build.
#   scripts/calibrate_memory.sh BUILD_DIR/bin/fdtrain
set -u
FDTRAIN=$1
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1} OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
rm -f "$(dirname "$FDTRAIN")/fdtrain.memory.json"
ok=1
"$FDTRAIN" calibrate || ok=0
for n in 2 4; do
  timeout 300 mpirun --oversubscribe --bind-to none -n $n "$FDTRAIN" calibrate || ok=0
done
if [ $ok = 0 ]; then
  echo "calibrate_memory.sh: warning: the runtime calibration failed; fdtrain estimate will not predict peak RSS until \`fdtrain calibrate\` (and under mpirun -n 2, -n 4) succeeds" >&2
fi
exit 0
