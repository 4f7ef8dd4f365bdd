#!/bin/bash
#SBATCH --job-name=aepar-train
#SBATCH --ntasks=4
#SBATCH --cpus-per-task=1
#SBATCH --mem=4G
#SBATCH --time=04:00:00
#SBATCH --requeue
#SBATCH --signal=B:USR1@120
#SBATCH --open-mode=append
#SBATCH --output=train-%j.out
#
# One training run of any aepar program or scheme, that survives time limits and
# preemption: the same command starts the run or continues it from its checkpoint.
#
#   sbatch jobs/train.sh greedy --dataset fashion --out runs/fashion-greedy
#   sbatch -n 8 jobs/train.sh pretrain --scheme hybrid --out runs/hybrid
#   sbatch -N 4 -n 4 jobs/train.sh sync --preset quick          # OUT: runs/sync/slurm-<job id>
#   sbatch -n 16 jobs/train.sh sparse --limit 160000
#   NP=2 bash jobs/train.sh eager --preset small --out runs/eager  # no SLURM: mpirun on this host
#
# SCHEME is a program (pretrain greedy sync sparse eager finetune classify: python -m
# aepar.SCHEME) or a scheme of pretrain (data model hybrid auto: aepar.pretrain --scheme
# SCHEME); the options after it go to the program as they are. Relative paths in them are
# taken from the directory the job was submitted from. Without --out the run directory is
# runs/SCHEME/slurm-<job id> (sge-<job id>; local-<date> under plain bash), which a requeued
# job finds again.
#
# The program gets --resume-or-start: it starts the run when its directory does not exist,
# continues it from its checkpoint when the directory holds this run unfinished, and exits
# 0 at once when it is complete (aepar.rundir). Add --checkpoint-every N or
# --checkpoint-minutes T so that a job killed without warning loses little.
#
# Signals. SLURM sends SIGUSR1 to this batch shell (B:) 120 s before the time limit; the
# launcher runs in the background and the shell passes the signal on to it (srun and mpirun
# forward SIGUSR1 to the ranks), because without B: SLURM would signal only the job steps,
# which mpirun's ranks are not. The ranks save a checkpoint and exit 75; the script then
# requeues its own job (`scontrol requeue $SLURM_JOB_ID`: --requeue alone brings a job back
# only after a node failure or a preemption, not after a time limit) and the requeued job
# resumes. `scontrol requeue` and preemption send SIGTERM to the whole job: the ranks
# checkpoint and exit 75 and SLURM (--requeue) starts the job again. scancel sends SIGTERM
# too: the run checkpoints and the job ends, not requeued. MAX_REQUEUES=N (default 20)
# stops the self-requeueing after N restarts.
#
# Exit status: the program's: 0 done (or found complete), 1 internal error, 2 bad input or
# options, 3 diverged, 74 a write failed, 75 checkpoint saved after a signal (requeued
# under SLURM after the time-limit signal; resume with the same command otherwise), 124 a
# rank stalled.
#
# Knobs (environment; sbatch passes them on): NP ranks under plain bash (default 1);
# THREADS per rank (default: --cpus-per-task, else cores / ranks); PYTHON, MPIRUN,
# LAUNCHER=auto|srun|mpirun, SRUN_MPI, MPI_BIND, MPI_ARGS as in jobs/lib.sh.
set -uo pipefail
AEPAR_JOB=train

# Find the checkout: SLURM runs a copy of this script from its spool directory, so try
# $AEPAR_REPO, the path sbatch was given, this file's own place, then the submit dir.
aepar_find_repo() {
  local d cmd=""
  [ -n "${SLURM_JOB_ID:-}" ] &&
    cmd=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null | sed -n 's/^ *Command=\([^ ]*\).*/\1/p')
  for d in "${AEPAR_REPO:-}" "${cmd:+$(dirname "$cmd")/..}" "$(dirname "${BASH_SOURCE[0]}")/.." \
    "${SLURM_SUBMIT_DIR:-}" "${SLURM_SUBMIT_DIR:+$SLURM_SUBMIT_DIR/..}" "$PWD"; do
    [ -n "$d" ] && [ -f "$d/jobs/lib.sh" ] && [ -f "$d/aepar/__init__.py" ] && { (cd "$d" && pwd -P); return 0; }
  done
  return 1
}
REPO=$(aepar_find_repo) || { echo "train: error: cannot find the aepar checkout (set AEPAR_REPO=)" >&2; exit 2; }
WORKDIR=${SLURM_SUBMIT_DIR:-$PWD}
# shellcheck source=jobs/lib.sh
. "$REPO/jobs/lib.sh"
aepar_train "$@"
