#!/usr/bin/env bash
# tests/cluster/test_slurm.sh - `make test-cluster`: jobs/sparse_scaling.sh under a real SLURM.
#
# Brings up a single-host SLURM (tests/cluster/local-slurm.sh, root, Debian 12), submits
# `sbatch jobs/sparse_scaling.sh` on a small grid, waits (with a time-out), checks the job
# ended COMPLETED and that strong.csv / weak.csv have the expected rows, columns and
# positive times, then tears SLURM down again, also when something failed. A SLURM that
# was already up before the test is left running.
#
# Knobs: NNODES=4 (emulated nodes, one task on each), TIMEOUT=600 (seconds for the job),
#        KEEP_SLURM=1 (leave the cluster up), LOCAL_SLURM_DIR (as local-slurm.sh).
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
NNODES=${NNODES:-1}
TIMEOUT=${TIMEOUT:-600}
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
export LOCAL_SLURM_DIR=${LOCAL_SLURM_DIR:-/tmp/local-slurm}
WORK=$(mktemp -d /tmp/aepar-test-slurm.XXXXXX)
JOB="" STARTED=0 RESULT=1

say() { echo "[test_slurm] $*"; }
fail() { say "FAIL: $*"; exit 1; }

cleanup() {
  local rc=$?
  if [ -n "$JOB" ] && squeue -h -j "$JOB" 2>/dev/null | grep -q .; then
    say "cancelling job $JOB"; scancel "$JOB" 2>/dev/null
  fi
  if [ "$STARTED" = 1 ] && [ "${KEEP_SLURM:-0}" != 1 ]; then
    bash "$HERE/local-slurm-teardown.sh" >"$WORK/teardown.log" 2>&1 && say "SLURM torn down" ||
      say "teardown reported problems, see $WORK/teardown.log"
  fi
  [ "$RESULT" = 0 ] && say "PASS ($WORK)" || say "FAILED (rc $rc; logs in $WORK)"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[ "$(id -u)" = 0 ] || fail "needs root (it installs and starts SLURM on this host)"
[ -x "$PYTHON" ] || fail "no $PYTHON: run 'make venv' first"

# 1. bring up (or find up) a local SLURM with NNODES nodes
if scontrol ping >/dev/null 2>&1 && [ "$(sinfo -h -N -o %N 2>/dev/null | sort -u | wc -l)" = "$NNODES" ]; then
  say "SLURM already up with $NNODES node(s): using it, leaving it up"
else
  STARTED=1
  say "bringing up SLURM with $NNODES node(s) (log: $WORK/bringup.log)"
  NNODES=$NNODES bash "$HERE/local-slurm.sh" >"$WORK/bringup.log" 2>&1 || { tail -20 "$WORK/bringup.log"; fail "bring-up failed"; }
  grep 'self-test' "$WORK/bringup.log" | sed 's/^/    /'
fi

# 2. submit a small grid: 1 and 2 processes (4 is skipped: the job has 2 tasks)
if [ "$NNODES" -gt 1 ]; then ALLOC=(-N 2 -n 2 --ntasks-per-node=1); else ALLOC=(-n 2); fi
cd "$REPO" || fail "no $REPO"
JOB=$(PROCS="1 2 4" SAMPLES="2000 4000" ITERS=20 OUT="$WORK/run" \
  sbatch --parsable "${ALLOC[@]}" -t 00:15:00 -o "$WORK/job-%j.out" jobs/sparse_scaling.sh) ||
  fail "sbatch refused the job"
JOB=${JOB%%;*}
say "submitted job $JOB (${ALLOC[*]}), waiting up to ${TIMEOUT}s"
t0=$(date +%s)
while squeue -h -j "$JOB" 2>/dev/null | grep -q .; do
  [ $(($(date +%s) - t0)) -gt "$TIMEOUT" ] && fail "job $JOB still running after ${TIMEOUT}s"
  sleep 2
done
say "job $JOB left the queue after $(($(date +%s) - t0))s; its output:"
sed 's/^/    /' "$WORK/job-$JOB.out"

# 3. check how it ended and what it wrote
STATE=$(scontrol show job "$JOB" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2)
EXIT=$(scontrol show job "$JOB" 2>/dev/null | grep -o ' ExitCode=[0-9:]*' | cut -d= -f2)
[ -z "$STATE" ] && STATE=$(sacct -n -X -j "$JOB" -o State 2>/dev/null | tr -d ' ')
say "job state ${STATE:-unknown}, exit code ${EXIT:-unknown}"
[ "${STATE:-COMPLETED}" = COMPLETED ] || fail "job $JOB ended $STATE"
grep -q "skip 4 processes" "$WORK/job-$JOB.out" || fail "the 4-process points were not reported as skipped"

NODES2=1; [ "$NNODES" -gt 1 ] && NODES2=2
"$PYTHON" "$HERE/check_csvs.py" "$WORK/run" --strong 1:2000,1:4000,2:2000,2:4000 \
  --weak 1:2000,2:4000 --nodes-for-2 "$NODES2" || fail "CSV check failed"
RESULT=0
