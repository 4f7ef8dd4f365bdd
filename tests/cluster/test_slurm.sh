#!/usr/bin/env bash
# tests/cluster/test_slurm.sh - jobs/sparse_scaling.sh under a real SLURM (`make test-cluster`).
#
# Brings up a private SLURM of its own (tests/cluster/local-slurm.sh with its own directory,
# ports and SLURM_CONF, /etc/slurm untouched) with NNODES emulated nodes of CPUS CPUs each,
# so a SLURM already running on this host is neither used nor changed; tears the private
# one down at the end, also when something failed. The jobs, each checked for how it ended
# and what it wrote:
#   A  `sbatch jobs/sparse_scaling.sh`, the README's command, on nodes smaller than its 16
#      tasks: accepted and spread; a 32-process point clipped and said so; srun probed at
#      the largest point (4 ranks on one node) and, where it fails, mpirun with the reason;
#      a line per point with the time left, small points first.
#   B  `sbatch -N 4 -n 4`: srun at 4 ranks over 4 nodes; then the same again into its OUT:
#      every point kept, none run.
#   C  `scancel --signal=USR1 --batch` while a point runs: no new point, the running one
#      told (SIGUSR1 through srun), the job exits 75.
#   D  LAUNCHER=srun with an --mpi plugin that cannot start this MPI: stops at once (exit 2)
#      with the reason.
#   E  an array of 8 tasks running `python -m aepar.sparse` without --out in one shared
#      working directory: 8 numbered run directories, each with its own complete results.
#   F  `sbatch -N 4 -n 4 jobs/train.sh greedy ...` requeued twice (`scontrol requeue`) while
#      it trains, each time after it saved a checkpoint since it last started: it resumes by
#      itself and its weights.h5 holds the same bits as the same job run through (R).
# Knobs: NNODES=4, CPUS=4, TIMEOUT=300 (seconds per job), KEEP_SLURM=1 (leave it up),
# JOBS="A B C D E F" (the jobs to run).
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
NNODES=${NNODES:-4}
CPUS=${CPUS:-4}
TIMEOUT=${TIMEOUT:-300}
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
WORK=$(mktemp -d /tmp/aepar-tslurm.XXXXXX)
export LOCAL_SLURM_DIR=$WORK/s
export SLURM_CONF=$LOCAL_SLURM_DIR/etc/slurm.conf
unset SLURM_JOB_ID SLURM_JOBID
JOB="" STARTED=0 RESULT=1 T0=$(date +%s)
JOBS=" ${JOBS:-A B C D E F} "
want() { [[ $JOBS == *" $1 "* ]]; }

say() { echo "[test_slurm $(($(date +%s) - T0))s] $*"; }
fail() { say "FAIL: $*"; exit 1; }

cleanup() {
  local rc=$?
  if [ "$STARTED" = 1 ] && [ "${KEEP_SLURM:-0}" != 1 ]; then
    bash "$HERE/local-slurm-teardown.sh" --purge >"$WORK/teardown.log" 2>&1 && say "private SLURM torn down" ||
      say "teardown reported problems, see $WORK/teardown.log"
  elif [ "$STARTED" = 1 ]; then
    say "KEEP_SLURM=1: left up; SLURM_CONF=$SLURM_CONF; stop with LOCAL_SLURM_DIR=$LOCAL_SLURM_DIR bash $HERE/local-slurm-teardown.sh"
  fi
  [ "$RESULT" = 0 ] && say "PASS ($WORK)" || say "FAILED (rc $rc; logs in $WORK)"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[ "$(id -u)" = 0 ] || fail "needs root (it installs and starts SLURM on this host)"
[ -x "$PYTHON" ] || fail "no $PYTHON: run 'make venv' first"

# ports nothing listens on: the private slurmctld/slurmd/... and the emulated nodes' slurmds
busy() { ss -Hltn 2>/dev/null | awk '{print $4}' | sed 's/.*://' | grep -qxE "$1"; }
for PORT_BASE in 16817 26817 36817 46817; do
  busy "$(seq -s'|' $PORT_BASE $((PORT_BASE + 3)))|$(seq -s'|' $((PORT_BASE + 10184)) $((PORT_BASE + 10184 + NNODES)))" || break
done
export PORT_BASE
if pgrep -x slurmctld >/dev/null; then say "a SLURM is running here already: leaving it alone"; fi

# 1. the private cluster
STARTED=1
say "bringing up a private SLURM: $NNODES nodes x $CPUS CPUs, ports from $PORT_BASE (log: $WORK/bringup.log)"
NNODES=$NNODES CPUS=$CPUS LINK_ETC=0 SELFTEST=0 CLUSTER=aepartest bash "$HERE/local-slurm.sh" >"$WORK/bringup.log" 2>&1 ||
  { tail -20 "$WORK/bringup.log"; fail "bring-up failed"; }
sinfo -h -N -o '%N %c %T' | sed 's/^/    /'

cd "$REPO" || fail "no $REPO"
# submit NAME SBATCH-OPTIONS... (environment before; SCRIPT="jobs/train.sh ARGS" for another
# script than the sweep): sets JOB, waits, sets STATE, EXIT, LOG
submit() {
  local name=$1; shift
  # shellcheck disable=SC2086  # SCRIPT is the script and its arguments
  JOB=$(sbatch --parsable -t 00:15:00 -o "$WORK/$name-%j.out" "$@" ${SCRIPT:-jobs/sparse_scaling.sh} 2>"$WORK/$name.sbatch") ||
    fail "job $name: sbatch $* refused it: $(cat "$WORK/$name.sbatch")"
  JOB=${JOB%%;*}
  LOG=$WORK/$name-$JOB.out
  say "job $name ($JOB): sbatch $*"
  local t0
  t0=$(date +%s)
  while squeue -h -j "$JOB" 2>/dev/null | grep -q .; do
    [ $(($(date +%s) - t0)) -gt "$TIMEOUT" ] && { scancel "$JOB"; fail "job $name ($JOB) still running after ${TIMEOUT}s"; }
    [ -n "${ON_RUNNING:-}" ] && $ON_RUNNING
    sleep 1
  done
  STATE=$(scontrol show job "$JOB" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2)
  EXIT=$(scontrol show job "$JOB" 2>/dev/null | grep -o ' ExitCode=[0-9:]*' | cut -d= -f2)
  say "job $name ($JOB) ended $STATE, exit $EXIT, after $(($(date +%s) - t0))s; its output:"
  sed 's/^/    /' "$LOG"
}
need() { grep -qE -- "$1" "$LOG" || fail "job $JOB: no line matching '$1' in its output"; }

# 0. the README's commands are accepted on nodes of $CPUS CPUs (fewer than 16)
for shape in "" "-N 4 --ntasks-per-node=4" "-N 4 -n 4" "-n 2"; do
  # shellcheck disable=SC2086  # a list of options
  sbatch --test-only $shape jobs/sparse_scaling.sh >"$WORK/test-only.txt" 2>&1 ||
    fail "sbatch --test-only $shape jobs/sparse_scaling.sh: $(tail -1 "$WORK/test-only.txt")"
  say "sbatch $shape jobs/sparse_scaling.sh accepted: $(grep -o 'using .*' "$WORK/test-only.txt")"
done
sbatch --test-only jobs/train.sh greedy >"$WORK/test-only.txt" 2>&1 ||
  fail "sbatch --test-only jobs/train.sh greedy: $(tail -1 "$WORK/test-only.txt")"
say "sbatch jobs/train.sh greedy accepted: $(grep -o 'using .*' "$WORK/test-only.txt")"

# A. the README's command
if want A; then
PROCS="1 2 4 32" SAMPLES=2000 ITERS=10 OUT=$WORK/a REPORT=0 submit A
[ "$STATE" = COMPLETED ] || fail "job A ended $STATE"
need "16 tasks on n1 n2 n3 n4"
need "clipped to the allocation's 16 tasks: 2 point\(s\) with 32 processes are skipped"
need "\(the largest point\)"
if grep -q "srun cannot start 4 rank(s) on 1 node(s)" "$LOG"; then
  need "srun cannot start 4 rank\(s\) on 1 node\(s\) \(the largest point\): --mpi=pmix: .+"
  need "falling back to mpirun"
  LAUNCH_A=mpirun
else
  LAUNCH_A="srun --mpi=pmix"
fi
[ "$(grep -cE '\) ok: .*; about [0-9hms]+ left \(' "$LOG")" = 4 ] || fail "job A: not every point but the last said the time left"
order=$(grep -oE 'p[0-9]+_s[0-9]+ \([0-9]/5\) ok' "$LOG" | cut -d' ' -f1 | paste -sd' ')
[ "$order" = "p1_s2000 p2_s2000 p4_s2000 p2_s4000 p4_s8000" ] || fail "job A: points ran as $order"
"$PYTHON" "$HERE/check_csvs.py" "$WORK/a" --strong 1:2000,2:2000,4:2000 --weak 1:2000,2:4000,4:8000 \
  --launcher "$LAUNCH_A" || fail "job A: CSV check failed"
fi

# B. one rank per node: srun at 4 ranks over 4 nodes; then resubmitted into the same OUT
if want B; then
PROCS="1 2 4" SAMPLES=2000 ITERS=10 OUT=$WORK/b REPORT=0 submit B -N 4 -n 4
[ "$STATE" = COMPLETED ] || fail "job B ended $STATE"
need "srun --mpi=pmix starts 4 rank\(s\) on 4 node\(s\) \(the largest point\): launching with srun"
"$PYTHON" "$HERE/check_csvs.py" "$WORK/b" --strong 1:2000,2:2000,4:2000 --weak 1:2000,2:4000,4:8000 \
  --launcher "srun --mpi=pmix" --nodes 2:2,4:4 || fail "job B: CSV check failed"
PROCS="1 2 4" SAMPLES=2000 ITERS=10 OUT=$WORK/b REPORT=0 submit B2 -N 4 -n 4
[ "$STATE" = COMPLETED ] || fail "job B2 ended $STATE"
need "5 point run\(s\) already finished in run slurm-[0-9]+@[0-9-]+: kept"
need "ran 0 of 0 point run"
[ "$(ls "$WORK/b/points" | wc -l)" = 5 ] || fail "job B2 made point directories: $(ls "$WORK/b/points")"
fi

# C. SIGUSR1 to the batch shell (what --signal=B:USR1@120 sends before the time limit)
if want C; then
usr1() {
  [ -n "${SENT:-}" ] || [ ! -e "$WORK/c/logs/p1_s20000.log" ] && return
  sleep 2; scancel --signal=USR1 --batch "$JOB" && SENT=1 && say "sent SIGUSR1 to job $JOB's batch shell"
}
SENT="" ON_RUNNING=usr1
PROCS=1 SAMPLES="20000 40000" ITERS=3000 OUT=$WORK/c REPORT=0 submit C -n 1
ON_RUNNING=""
[ -n "$SENT" ] || fail "job C ended before its first point ran long enough to be signalled"
[ "$EXIT" = 75:0 ] || fail "job C: exit $EXIT, expected 75:0 (stopped by a signal)"
need "SIGUSR1: no new points; sending SIGUSR1 to the running point"
need "p1_s20000 \(1/2\) INTERRUPTED"
need "stopped by SIGUSR1: 2 point run\(s\) not finished; resubmit with OUT=$WORK/c"
grep -q '^p1_s40000,' "$WORK/c/sweep.csv" && fail "job C started a point after SIGUSR1"
fi

# D. a launcher that cannot work, asked for by name: stop at once, saying why
if want D; then
LAUNCHER=srun SRUN_MPI=pmi2 PROCS="1 2" SAMPLES=2000 ITERS=10 OUT=$WORK/d submit D -n 2
[ "$EXIT" = 2:0 ] || fail "job D: exit $EXIT, expected 2:0"
need "error: LAUNCHER=srun: srun cannot start 2 rank\(s\) on 1 node\(s\): --mpi=pmi2: .+"
[ -z "$(ls "$WORK/d/points")" ] || fail "job D ran points"
fi

# E. array tasks sharing a working directory: none may replace another's run directory
if want E; then
mkdir -p "$WORK/e"
JOB=$(sbatch --parsable -t 00:15:00 --array=1-8 -n 1 -D "$WORK/e" -o "$WORK/e/task-%a.out" \
  --wrap "AEPAR_THREADS=1 $PYTHON -m aepar.sparse --limit 512 --iterations 20 --seed \$SLURM_ARRAY_TASK_ID --quiet" \
  2>"$WORK/e.sbatch") || fail "job E: sbatch refused the array: $(cat "$WORK/e.sbatch")"
say "job E ($JOB): an array of 8 sparse runs in $WORK/e"
t0=$(date +%s)
while squeue -h -j "$JOB" 2>/dev/null | grep -q .; do
  [ $(($(date +%s) - t0)) -gt "$TIMEOUT" ] && { scancel "$JOB"; fail "job E ($JOB) still running after ${TIMEOUT}s"; }
  sleep 1
done
cat "$WORK"/e/task-*.out | sed 's/^/    /'
"$PYTHON" - "$WORK/e" <<'PY' || fail "job E: the array's run directories are not one complete run per task"
import json, pathlib, sys
base = pathlib.Path(sys.argv[1]) / "runs" / "sparse"
dirs = sorted(p.name for p in base.iterdir())
assert dirs == [f"{i:03d}" for i in range(1, 9)], dirs
seeds = []
for d in dirs:
    marker = json.loads((base / d / "run.json").read_text())
    assert marker["state"] == "complete", (d, marker["state"])
    assert sorted(p.name for p in (base / d).iterdir()) == sorted(marker["files"] + ["run.json"]), d
    seeds.append(int(marker["argv"][marker["argv"].index("--seed") + 1]))
assert sorted(seeds) == list(range(1, 9)), seeds
print("job E: 8 run directories, one per task:", " ".join(f"{d}<-seed {s}" for d, s in zip(dirs, seeds)))
PY
fi

# F. requeued twice while it trains: resumes by itself, the same bits as a job run through
if want F; then
  TRAIN="greedy --dataset mnist5k --limit 4000 --layers 784-500-100-16 --epochs 8 --finetune-epochs 2 --seed 5 --quiet --checkpoint-every 1"
  SCRIPT="jobs/train.sh $TRAIN --out $WORK/r" submit R -N 4 -n 4
  [ "$STATE" = COMPLETED ] && [ "$EXIT" = 0:0 ] || fail "job R ended $STATE, exit $EXIT"
  REQUEUES=0 SINCE=""
  requeue() { # when the run has saved a checkpoint of its own since it (re)started
    local ck=$WORK/f/checkpoint.h5 state
    state=$(squeue -h -j "$JOB" -o '%T %r' 2>/dev/null)
    # SLURM holds a requeued job for two minutes (its BeginTime): not worth waiting for here
    [ "$state" = "PENDING BeginTime" ] && scontrol update JobId="$JOB" StartTime=now && return 0
    [ "$REQUEUES" -lt 2 ] && [ "$state" = "RUNNING None" ] || return 0
    [ -n "$SINCE" ] || SINCE=$(date +%s)
    [ -f "$ck" ] && [ "$(stat -c %Y "$ck" 2>/dev/null || echo 0)" -gt "$SINCE" ] || return 0
    scontrol requeue "$JOB" || return 0
    REQUEUES=$((REQUEUES + 1)) SINCE=""
    say "scontrol requeue $JOB (${REQUEUES} of 2), its checkpoint: $(grep -o '"progress": "[^"]*"' "$WORK/f/run.json")"
  }
  ON_RUNNING=requeue SCRIPT="jobs/train.sh $TRAIN --out $WORK/f" submit F -N 4 -n 4
  ON_RUNNING=""
  [ "$REQUEUES" = 2 ] || fail "job F ended before it was requeued twice ($REQUEUES)"
  [ "$STATE" = COMPLETED ] && [ "$EXIT" = 0:0 ] || fail "job F ended $STATE, exit $EXIT"
  restarts=$(scontrol show job "$JOB" | grep -o 'Restarts=[0-9]*' | cut -d= -f2)
  [ "$restarts" = 2 ] || fail "job F: Restarts=$restarts, expected 2"
  need "SLURM job $JOB \(restart 2\)"
  "$PYTHON" - "$WORK/r" "$WORK/f" <<'PY' || fail "job F: its weights differ from job R's (run through)"
import json, pathlib, sys
import h5py, numpy as np
ref, got = (pathlib.Path(a) for a in sys.argv[1:])
def params(path):
    out = {}
    with h5py.File(path / "weights.h5", "r") as f:
        f.visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
    return out
a, b = params(ref), params(got)
assert a and sorted(a) == sorted(b), (sorted(a), sorted(b))
differ = [k for k in a if not np.array_equal(a[k], b[k])]
assert not differ, differ
marker = json.loads((got / "run.json").read_text())
assert marker["state"] == "complete" and marker["aepar"]["version"], marker["state"]
starts = sum(1 for h in marker["history"] if h["state"] == "running")
print(f"job F: {len(a)} arrays of weights.h5 the same bits as job R's; run.json: {starts} starts, "
      f"history {' -> '.join(h['state'] for h in marker['history'])}")
PY
fi

RESULT=0
