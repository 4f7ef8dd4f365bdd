#!/usr/bin/env bash
# tests/cluster/test_sge.sh - jobs/starcluster/sparse_scaling.sge under a real Grid Engine.
#
# Starts a single-host Grid Engine (tests/cluster/local-sge.sh, root, Debian 12) unless
# one answers already, submits `qsub -sync y -pe orte 2 jobs/starcluster/sparse_scaling.sge`
# on a small grid, checks the CSVs, and stops the Grid Engine daemons it started (trap).
#   bash tests/cluster/test_sge.sh            (KEEP_SGE=1 leaves it running)
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
TIMEOUT=${TIMEOUT:-600}
export SGE_ROOT=${SGE_ROOT:-/var/lib/gridengine} SGE_CELL=${SGE_CELL:-default}
WORK=$(mktemp -d /tmp/aepar-test-sge.XXXXXX)
STARTED=0 RESULT=1

say() { echo "[test_sge] $*"; }
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
  say "Grid Engine already up: using it, leaving it up"
else
  STARTED=1
  say "starting Grid Engine (log: $WORK/start.log)"
  bash "$HERE/local-sge.sh" >"$WORK/start.log" 2>&1 || { tail -20 "$WORK/start.log"; fail "start failed"; }
fi

cd "$REPO" || fail "no $REPO"
# -V in the script passes these on; 4 processes are skipped (2 slots)
PROCS="1 2 4" SAMPLES="2000 4000" ITERS=20 OUT="$WORK/run" timeout "$TIMEOUT" \
  qsub -sync y -pe orte 2 -o "$WORK/job.out" jobs/starcluster/sparse_scaling.sge >"$WORK/qsub.txt" 2>&1
QRC=$?
cat "$WORK/qsub.txt"
sed 's/^/    /' "$WORK/job.out" 2>/dev/null
[ "$QRC" = 0 ] || fail "qsub -sync y returned $QRC"
grep -q "Grid Engine job" "$WORK/job.out" || fail "the job did not see Grid Engine (no PE_HOSTFILE?)"
grep -q "skip 4 processes" "$WORK/job.out" || fail "the 4-process points were not reported as skipped"
"$PYTHON" "$HERE/check_csvs.py" "$WORK/run" --strong 1:2000,1:4000,2:2000,2:4000 \
  --weak 1:2000,2:4000 --nodes-for-2 1 || fail "CSV check failed"
RESULT=0
