#!/bin/bash
#SBATCH --job-name=aepar-sparse-scaling
#SBATCH --ntasks=16
#SBATCH --time=04:00:00
#SBATCH --signal=B:USR1@120
#SBATCH --output=sparse_scaling-%j.out
#
# Strong and weak scaling of the data-parallel sparse autoencoder (Lewis & Canann 2015,
# Fig. 2.1/2.2/3.1): every point of the grid runs inside this one allocation.
#
#   sbatch jobs/sparse_scaling.sh                          # the paper's grid, 1-16 ranks
#   sbatch -N 4 --ntasks-per-node=4 jobs/sparse_scaling.sh # across 4 nodes
#   sbatch -N 4 -n 4 jobs/sparse_scaling.sh                # one rank per node, as the paper
#   PROCS="1 2" SAMPLES="2000 4000" ITERS=20 sbatch -n 2 jobs/sparse_scaling.sh
#   GRID=quick bash jobs/sparse_scaling.sh                 # no SLURM: mpirun on this host
#
# 16 tasks and no node count: SLURM spreads them over as many nodes as it takes, whatever
# their size. A shape on the command line needs -n too (SLURM keeps this file's --ntasks
# over --ntasks-per-node, and refuses -N 4 --ntasks-per-node=1 alone). Points with more
# processes than the allocation has tasks are skipped, and the log says so up front.
#
# Under SLURM the points start with `srun --mpi=pmix|pmi2` when that starts the grid's
# largest point as one job, otherwise (the reason is logged) with mpirun on the allocation's
# hosts. Two minutes before the time limit SLURM sends SIGUSR1 (--signal above): the running
# point checkpoints, what finished is collected, and the job exits 75; resubmit with
# OUT=<its directory> and the same settings to run the rest. Results: OUT/strong.csv,
# OUT/weak.csv (+ speedup/efficiency PNGs and scaling.md), one directory per point under
# OUT/points/, a line per point in the job's output with the time left.
# All knobs (GRID, PROCS, SAMPLES, WEAK, ITERS, OUT, PYTHON, MPIRUN, LAUNCHER, THREADS, ...)
# are environment variables, documented in jobs/lib.sh; sbatch passes them on.
set -uo pipefail

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
REPO=$(aepar_find_repo) || { echo "sparse_scaling: error: cannot find the aepar checkout (set AEPAR_REPO=)" >&2; exit 2; }
# OUT is relative to where the job was submitted from, not to the checkout
[ -n "${OUT:-}" ] && [ "${OUT#/}" = "$OUT" ] && OUT=${SLURM_SUBMIT_DIR:-$PWD}/$OUT
# shellcheck source=jobs/lib.sh
. "$REPO/jobs/lib.sh"
aepar_sweep
