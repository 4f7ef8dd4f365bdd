#!/usr/bin/env bash
# tests/cluster/test_sge.sh - jobs/starcluster/sparse_scaling.sge under a real Grid Engine
# (`make test-cluster`, after test_slurm.sh).
#
# Uses the Grid Engine that answers already (as it is: it needs a parallel environment
# `orte` with 2 slots and changes nothing), else starts a single-host one
# (tests/cluster/local-sge.sh, root, Debian 12) and stops it at the end, also on failure.
# The jobs, each checked for how it ended and what it wrote:
#   S  `qsub -sync y -pe orte 2` on a small grid: 4 processes clipped and said so, mpirun
#      probed at the largest point, a line per point with the time left, the CSVs.
#   L  the same settings as plain bash into S's OUT: another scheduler's results are not
#      reused (a new run, every point again in a directory of its own).
#   T  `-l s_rt=0:0:10`: Grid Engine's SIGUSR1 at the soft time limit stops the sweep, the
#      running point is told, the job exits 75.
# Knobs: TIMEOUT=300 (seconds per job), KEEP_SGE=1 (leave a Grid Engine it started running).
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
TIMEOUT=${TIMEOUT:-300}
export SGE_ROOT=${SGE_ROOT:-/var/lib/gridengine} SGE_CELL=${SGE_CELL:-default}
WORK=$(mktemp -d /tmp/aepar-tsge.XXXXXX)
STARTED=0 RESULT=1 T0=$(date +%s)
unset SLURM_JOB_ID SLURM_JOBID PE_HOSTFILE

say() { echo "[test_sge $(($(date +%s) - T0))s] $*"; }
fail() { say "FAIL: $*"; exit 1; }
cleanup() {
  local rc=$?
  if [ "$STARTED" = 1 ] && [ "${KEEP_SGE:-0}" != 1 ]; then
    bash "$HERE/local-sge.sh" stop >"$WORK/stop.log" 2>&1 && say "Grid Engine stopped"
  fi
  [ "$RESULT" = 0 ] && say "PASS ($WORK)" || say "FAILED (rc $rc; logs in $WORK)"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[ "$(id -u)" = 0 ] || fail "needs root (it installs and starts Grid Engine on this host)"
[ -x "$PYTHON" ] || fail "no $PYTHON: run 'make venv' first"
if command -v qstat >/dev/null && qstat -f >/dev/null 2>&1; then
  say "Grid Engine already up: using it as it is, leaving it up"
  qconf -sp orte >/dev/null 2>&1 || fail "this Grid Engine has no parallel environment 'orte' (the script asks for it)"
else
  STARTED=1
  say "starting Grid Engine (log: $WORK/start.log)"
  SELFTEST=0 bash "$HERE/local-sge.sh" >"$WORK/start.log" 2>&1 || { tail -20 "$WORK/start.log"; fail "start failed"; }
fi

cd "$REPO" || fail "no $REPO"
# qsubmit NAME QSUB-OPTIONS... (environment before; -V passes it on): waits, sets QRC, LOG
qsubmit() {
  local name=$1 t0; shift
  LOG=$WORK/$name.out
  say "job $name: qsub -sync y $*"
  t0=$(date +%s)
  timeout "$TIMEOUT" qsub -sync y -o "$LOG" "$@" jobs/starcluster/sparse_scaling.sge >"$WORK/$name.qsub" 2>&1
  QRC=$?
  say "job $name: $(grep -m1 -E "exited|rror" "$WORK/$name.qsub" || tail -1 "$WORK/$name.qsub") ($(($(date +%s) - t0))s); its output:"
  sed 's/^/    /' "$LOG" 2>/dev/null
}
need() { grep -qE -- "$1" "$LOG" || fail "$LOG: no line matching '$1'"; }

# S. a small grid on 2 slots
PROCS="1 2 4" SAMPLES=2000 ITERS=10 OUT=$WORK/run REPORT=0 qsubmit S -pe orte 2
[ "$QRC" = 0 ] || fail "qsub -sync y returned $QRC"
need "Grid Engine job [0-9]+: 2 slots on"
need "clipped to the allocation's 2 tasks: 2 point\(s\) with 4 processes are skipped"
need "mpirun starts 2 rank\(s\) on 1 node\(s\) \(the largest point\)"
[ "$(grep -cE '\) ok: .*; about [0-9hms]+ left \(' "$LOG")" = 2 ] || fail "not every point but the last said the time left"
"$PYTHON" "$HERE/check_csvs.py" "$WORK/run" --strong 1:2000,2:2000 --weak 1:2000,2:4000 \
  --launcher mpirun --nodes 2:1 || fail "CSV check failed"

# L. plain bash into the same OUT with the same settings: not the same run
LOG=$WORK/L.out
say "job L: PROCS=\"1 2 4\" MAXPROCS=2 ... OUT=$WORK/run bash jobs/sparse_scaling.sh"
PROCS="1 2 4" MAXPROCS=2 SAMPLES=2000 ITERS=10 OUT=$WORK/run REPORT=0 bash jobs/sparse_scaling.sh >"$LOG" 2>&1 ||
  { cat "$LOG"; fail "the plain bash sweep failed"; }
need "OUT holds run sge-[0-9]+@[0-9-]+ with other settings \(where=sge:.* -> where=local:.*\): a new run there, nothing of it reused"
need "3 point run\(s\) to go"
for p in p1_s2000 p2_s2000 p2_s4000; do
  [ -s "$WORK/run/points/$p.2/summary.json" ] || fail "$p was not run again into points/$p.2"
done

# T. the soft time limit: SIGUSR1 from Grid Engine. The first point (80k patches) runs well
# past the 10 s, so the signal finds it running (with 20k first, one run's point ended just
# as the signal came, and no point was running to be told)
PROCS=1 SAMPLES="80000 160000" ITERS=3000 OUT=$WORK/t REPORT=0 qsubmit T -pe orte 1 -l s_rt=0:0:10
grep -q 'exit code 75' "$WORK/T.qsub" || fail "job T: $(tail -1 "$WORK/T.qsub"), expected exit code 75"
need "SIGUSR1: no new points; sending SIGUSR1 to the running point"
need "stopped by SIGUSR1: [0-9]+ point run\(s\) not finished; resubmit with OUT=$WORK/t"
grep -q '^p1_s160000,' "$WORK/t/sweep.csv" && fail "job T started a point after SIGUSR1"

RESULT=0
