#!/usr/bin/env bash
# lr_sweep: a grid of learning rate x ZeRO stage on the quickstart recipe (short
# runs), each in its own run directory under one sweep directory, then one
# table of all of them (`fdtrain runs`) and their loss curves (`fdtrain plot`).
# About a minute on 2 cores with the defaults (9 runs of 30 steps, 2 ranks each).
#
#   recipes/sweeps/lr_sweep.sh [SWEEP_DIR] [fdtrain train options, e.g. --overwrite]
#
# SWEEP_DIR defaults to runs/lr_sweep. A run whose directory already holds a
# finished run (summary.json) is skipped, so re-running the script after an
# interruption only does what is missing; pass --overwrite to redo them all.
# Settings from the environment (defaults in brackets):
#   FDTRAIN  the binary            [build/bin/fdtrain]
#   NP       ranks per run         [2]
#   MPIRUN   the launcher          [mpirun --oversubscribe --bind-to none]
#   LRS      learning rates        [0.001 0.003 0.01]
#   STAGES   ZeRO stages           [1 2 3]
#   STEPS    steps per run         [30]
# At a fixed world size ZeRO stages 0-3 train bitwise identical weights, so the
# losses of one learning rate agree across stages; what the stage changes is
# the peak memory per rank (and the communication).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SWEEP=${1:-runs/lr_sweep}
[ $# -gt 0 ] && shift
case $SWEEP in /*) ;; *) SWEEP=$PWD/$SWEEP ;; esac
FDTRAIN=${FDTRAIN:-$ROOT/build/bin/fdtrain}
case $FDTRAIN in /*) ;; *) FDTRAIN=$PWD/$FDTRAIN ;; esac
NP=${NP:-2}
MPIRUN=${MPIRUN:-mpirun --oversubscribe --bind-to none}
LRS=${LRS:-0.001 0.003 0.01}
STAGES=${STAGES:-1 2 3}
STEPS=${STEPS:-30}
# mpirun refuses root unless told (containers, CI).
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1}
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}

[ -x "$FDTRAIN" ] || { echo "lr_sweep: $FDTRAIN not found; build first (make) or set FDTRAIN" >&2; exit 2; }
redo=0
for a in "$@"; do [ "$a" = --overwrite ] && redo=1; done

# The same short schedule for every run; the grid adds optimizer.lr and zero.stage.
common=(steps="$STEPS" batch.micro=8 schedule.warmup_steps=5 logging.every=5
        logging.eval_every=10 logging.eval_batches=4 logging.sample_tokens=0)

cd "$ROOT"  # the recipe names its data and fragments relative to the repository
mkdir -p "$SWEEP"
total=$(( $(wc -w <<<"$LRS") * $(wc -w <<<"$STAGES") ))
n=0 failed=0
for lr in $LRS; do
  for stage in $STAGES; do
    n=$((n + 1))
    name="lr${lr}_z${stage}"
    dir=$SWEEP/$name
    if [ $redo -eq 0 ] && [ -f "$dir/summary.json" ]; then
      echo "[$n/$total] $name: finished earlier, skipped (--overwrite redoes it)"
      continue
    fi
    start=$SECONDS
    # shellcheck disable=SC2086  # MPIRUN is a command line
    if $MPIRUN -n "$NP" "$FDTRAIN" train recipes/quickstart.yaml "${common[@]}" \
         optimizer.lr="$lr" zero.stage="$stage" --run-dir "$dir" --no-progress "$@" \
         > "$SWEEP/$name.out" 2>&1; then
      echo "[$n/$total] $name: done in $((SECONDS - start)) s"
      rm -f "$SWEEP/$name.out"
    else
      echo "[$n/$total] $name: FAILED (exit $?); last lines of $SWEEP/$name.out:"
      tail -n 5 "$SWEEP/$name.out" | sed 's/^/    /'
      failed=$((failed + 1))
    fi
  done
done

echo
"$FDTRAIN" runs "$SWEEP"
"$FDTRAIN" plot "$SWEEP" --out "$SWEEP/loss.svg" --title "quickstart: lr x ZeRO stage, $STEPS steps"
[ $failed -eq 0 ] || { echo "lr_sweep: $failed of $total runs failed" >&2; exit 1; }
