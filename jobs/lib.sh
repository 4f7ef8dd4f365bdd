# jobs/lib.sh - the scaling sweep shared by every job script (source it, do not run it).
#
#   jobs/sparse_scaling.sh               SLURM batch script, or plain `bash` on this host
#   jobs/starcluster/sparse_scaling.sge  Grid Engine (StarCluster) script
#   bench/run.py                         `make bench` runs jobs/sparse_scaling.sh as plain bash
#
# The grid is data (bench/grid.json, expanded by `python -m bench.scaling points`); this file
# only finds out where it runs, launches each point and collects the CSVs. Knobs (environment):
#   GRID=full|quick|tiny        grid in bench/grid.json             (default full)
#   PROCS="1 2 4 8 16"          processes (overrides the grid)
#   SAMPLES="10000 ... 160000"  sample sizes for strong scaling      (overrides the grid)
#   WEAK=10000                  weak scaling: samples per process     (default: grid's, or min SAMPLES)
#   ITERS=400                   L-BFGS iterations per run
#   OUT=DIR                     results (default runs/sparse_scaling/<job id or date>)
#   PYTHON, MPIRUN              interpreter and mpirun (default: the checkout's .venv)
#   LAUNCHER=auto|srun|mpirun   auto: srun if it starts this MPI's ranks, else mpirun
#   SRUN_MPI="pmix pmi2"        srun --mpi plugins to try, in order
#   MPI_BIND=none, MPI_ARGS=""  mpirun --bind-to value and extra mpirun options
#   THREADS=1|N|auto            BLAS threads per rank (default 1; auto: node cores / its ranks)
#   MAXPROCS=N                  plain bash only: skip points with more ranks (default: none)
#   REPEATS=1                   runs per point (the fastest is kept)
#   RESUME=1                    keep points already in OUT (re-submit after a time-out)
#   SCHEME=aepar.sparse         module run per point; ARGS="--dtype float32 ..." extra options
#   SEED=0                      --seed for every point (same data and initial weights)

aepar_log() { echo "[sparse_scaling $(date +%H:%M:%S)] $*"; }
aepar_die() { echo "sparse_scaling: error: $*" >&2; exit 2; }

# aepar_seconds NANOSECONDS -> seconds with 3 decimals (no bc on minimal nodes)
aepar_seconds() { printf '%d.%03d' $(($1 / 1000000000)) $(($1 / 1000000 % 1000)); }

# aepar_expand_counts "2(x3),1" -> "2 2 2 1" (SLURM_TASKS_PER_NODE syntax)
aepar_expand_counts() {
  local item n k out=() IFS=,
  for item in $1; do
    if [[ $item =~ ^([0-9]+)\(x([0-9]+)\)$ ]]; then
      for ((k = 0; k < BASH_REMATCH[2]; k++)); do out+=("${BASH_REMATCH[1]}"); done
    elif [[ $item =~ ^[0-9]+$ ]]; then out+=("$item"); fi
  done
  IFS=' '
  echo "${out[*]}"
}

# aepar_setup: set REPO-relative tools and find out where we are.
#   WHERE       slurm | sge | local
#   ALLOC       tasks (slots) this job may start at once; 0 = no limit (plain bash)
#   HOSTS/SLOTS arrays: hosts of the allocation and the tasks (slots) on each
#   CORES       real cores a node gives this job (ranks x threads must stay within it)
aepar_setup() {
  cd "$REPO" || aepar_die "cannot cd to $REPO"
  if [ -z "${PYTHON:-}" ]; then
    if [ -x "$REPO/.venv/bin/python" ]; then PYTHON=$REPO/.venv/bin/python
    else PYTHON=$(command -v python3) || aepar_die "no python3 (set PYTHON=)"; fi
  fi
  # MPIRUN may carry options: the Makefile exports ".venv/bin/mpirun --oversubscribe".
  if [ -z "${MPIRUN:-}" ]; then
    if [ -x "$REPO/.venv/bin/mpirun" ]; then MPIRUN=$REPO/.venv/bin/mpirun
    else MPIRUN=$(command -v mpirun || command -v mpiexec || true); fi
  fi
  "$PYTHON" -c 'import aepar, mpi4py' 2>/dev/null ||
    aepar_die "$PYTHON cannot import aepar and mpi4py (run 'make venv' in $REPO, or set PYTHON=)"
  # Open MPI refuses to run as root unless told (jobs run as root in containers)
  [ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  CORES=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN)
  HOSTS=() SLOTS=()
  if [ -n "${SLURM_JOB_ID:-}" ]; then
    WHERE=slurm
    ALLOC=${SLURM_NTASKS:-${SLURM_NPROCS:-1}}
    read -r -a HOSTS <<<"$(scontrol show hostnames "${SLURM_JOB_NODELIST:-$(hostname)}" | tr '\n' ' ')"
    read -r -a SLOTS <<<"$(aepar_expand_counts "${SLURM_TASKS_PER_NODE:-$ALLOC}")"
    # SLURM may declare more CPUs than the node has (oversubscribed test clusters)
    [ -n "${SLURM_CPUS_ON_NODE:-}" ] && [ "$SLURM_CPUS_ON_NODE" -lt "$CORES" ] && CORES=$SLURM_CPUS_ON_NODE
  elif [ -n "${PE_HOSTFILE:-}" ] && [ -r "${PE_HOSTFILE:-}" ]; then
    WHERE=sge
    ALLOC=${NSLOTS:-1}
    local host slots _
    while read -r host slots _; do HOSTS+=("${host%%.*}"); SLOTS+=("$slots"); done <"$PE_HOSTFILE"
  else
    WHERE=local
    ALLOC=${MAXPROCS:-0}
    HOSTS=("$(hostname)") SLOTS=("${MAXPROCS:-0}")
  fi
  [ -n "$MPIRUN" ] || [ "$WHERE" = slurm ] || aepar_die "no mpirun (set MPIRUN=)"
}

# aepar_srun_mpi: print the first srun --mpi plugin that starts ranks of this MPI as one job.
aepar_srun_mpi() {
  local m n=2 got shape=(-N 1)
  [ "$ALLOC" -lt 2 ] && n=1
  # across two nodes when the job has several: a plugin may work within a node only
  [ "${#HOSTS[@]}" -gt 1 ] && [ "$n" = 2 ] && shape=(-N 2 --ntasks-per-node=1)
  for m in ${SRUN_MPI:-pmix pmi2}; do
    # ranks that did not find each other each report size 1
    got=$(timeout 120 srun -n "$n" "${shape[@]}" --mpi="$m" "$PYTHON" -c \
      'from mpi4py import MPI; print(MPI.COMM_WORLD.Get_size())' 2>/dev/null | sort -u | tr -d '\n')
    [ "$got" = "$n" ] && { echo "$m"; return 0; }
  done
  return 1
}

aepar_choose_launcher() {
  local want=${LAUNCHER:-auto}
  SRUN_PLUGIN=""
  if [ "$WHERE" = slurm ] && [ "$want" != mpirun ]; then
    # Slurm's PMIx server offers munge and native security; the pip Open MPI's PMIx only
    # has native, and complains on every rank unless told.
    export PMIX_MCA_psec=${PMIX_MCA_psec:-native}
    if SRUN_PLUGIN=$(aepar_srun_mpi); then LAUNCH=srun; return; fi
    [ "$want" = srun ] && aepar_die "srun --mpi=${SRUN_MPI:-pmix pmi2} cannot start $PYTHON's MPI as one job"
    aepar_log "srun cannot start this MPI's ranks (tried --mpi ${SRUN_MPI:-pmix pmi2}): using mpirun"
  elif [ "$want" = srun ]; then
    aepar_die "LAUNCHER=srun needs a SLURM job"
  fi
  [ -n "$MPIRUN" ] || aepar_die "no mpirun (set MPIRUN=)"
  LAUNCH=mpirun
  HOSTFILE=""
  if [ "$WHERE" != local ]; then # the allocation's hosts, slots = its tasks there
    HOSTFILE=$OUT/hostfile
    local i
    : >"$HOSTFILE"
    for i in "${!HOSTS[@]}"; do echo "${HOSTS[$i]} slots=${SLOTS[$i]:-1}" >>"$HOSTFILE"; done
  fi
}

# aepar_place P -> sets NODES_USED, RANKS_NODE (most ranks on one node), THREADS_P, OVERSUB
aepar_place() {
  local p=$1 left=$1 i s
  NODES_USED=0 RANKS_NODE=0
  if [ "$WHERE" = local ]; then
    NODES_USED=1 RANKS_NODE=$p
  else # ranks fill the hosts in order, as mpirun's by-slot mapping and srun's block layout do
    for i in "${!SLOTS[@]}"; do
      [ "$left" -le 0 ] && break
      s=${SLOTS[$i]}; [ "$s" -gt "$left" ] && s=$left
      left=$((left - s)); NODES_USED=$((NODES_USED + 1))
      [ "$s" -gt "$RANKS_NODE" ] && RANKS_NODE=$s
    done
  fi
  # one core per rank by default (the paper's unit: one process per t2.micro core);
  # THREADS=auto gives each rank its share of the node's cores as BLAS threads
  THREADS_P=${THREADS:-1}
  [ "$THREADS_P" = auto ] && THREADS_P=$((CORES / RANKS_NODE))
  [ "$THREADS_P" -ge 1 ] || THREADS_P=1
  OVERSUB=0
  [ $((RANKS_NODE * THREADS_P)) -gt "$CORES" ] && OVERSUB=1
  return 0
}

# aepar_launch P LOGFILE cmd... : start P ranks of cmd with the chosen launcher
aepar_launch() {
  local p=$1 log=$2; shift 2
  local vars="AEPAR_THREADS OMP_NUM_THREADS OPENBLAS_NUM_THREADS MKL_NUM_THREADS NUMBA_NUM_THREADS"
  local v
  for v in $vars; do export "$v=$THREADS_P"; done
  if [ "$LAUNCH" = srun ]; then
    srun -n "$p" -N "$NODES_USED" --mpi="$SRUN_PLUGIN" --kill-on-bad-exit=1 "$@" </dev/null >"$log" 2>&1
  else
    # shellcheck disable=SC2206  # MPI_ARGS is a list of options
    local opts=(-np "$p" --bind-to "${MPI_BIND:-none}" ${MPI_ARGS:-})
    for v in $vars PYTHONPATH; do opts+=(-x "$v"); done
    if [ -n "$HOSTFILE" ]; then opts+=(--hostfile "$HOSTFILE")
    elif [ "$p" -gt "$CORES" ]; then opts+=(--oversubscribe); fi # plain bash, more ranks than cores
    # shellcheck disable=SC2086  # MPIRUN may be "mpirun --option"
    $MPIRUN "${opts[@]}" "$@" </dev/null >"$log" 2>&1
  fi
}

# aepar_sweep: run every point of the grid inside this allocation, then write the CSVs.
aepar_sweep() {
  aepar_setup
  local stamp=${SLURM_JOB_ID:-${JOB_ID:-$(date +%Y%m%d-%H%M%S)}}
  OUT=${OUT:-runs/sparse_scaling/$stamp}
  mkdir -p "$OUT/points" "$OUT/logs" || aepar_die "cannot create $OUT"
  OUT=$(cd "$OUT" && pwd -P)
  local scheme=${SCHEME:-aepar.sparse} repeats=${REPEATS:-1}
  local points
  points=$("$PYTHON" -m bench.scaling points --grid "${GRID:-full}" --procs "${PROCS:-}" \
    --samples "${SAMPLES:-}" --iterations "${ITERS:-}" --weak "${WEAK:-}" --write "$OUT/grid.json") ||
    aepar_die "bad grid (GRID=${GRID:-full} PROCS=${PROCS:-} SAMPLES=${SAMPLES:-} ITERS=${ITERS:-})"
  aepar_choose_launcher
  case $WHERE in
    slurm) aepar_log "SLURM job $SLURM_JOB_ID: $ALLOC tasks on ${HOSTS[*]} (tasks per node ${SLOTS[*]})" ;;
    sge) aepar_log "Grid Engine job ${JOB_ID:-?}: $ALLOC slots on ${HOSTS[*]} (slots ${SLOTS[*]})" ;;
    *) aepar_log "no scheduler: mpirun on $(hostname)${MAXPROCS:+, at most $MAXPROCS ranks}" ;;
  esac
  aepar_log "repo $REPO; python $PYTHON; launcher $LAUNCH${SRUN_PLUGIN:+ --mpi=$SRUN_PLUGIN}${HOSTFILE:+ --hostfile $HOSTFILE}"
  aepar_log "$CORES cores per node; grid ${GRID:-full}${PROCS:+ PROCS=\"$PROCS\"}${SAMPLES:+ SAMPLES=\"$SAMPLES\"}${ITERS:+ ITERS=$ITERS}${WEAK:+ WEAK=$WEAK}: $(echo "$points" | wc -l) points -> $OUT"
  local sweep=$OUT/sweep.csv
  [ -s "$sweep" ] || echo "name,scheme,processes,samples,iterations,repeat,threads,launcher,nodes,oversubscribed,status,wall_seconds" >"$sweep"
  local p s it r name dir t0 t1 wall rc status failed=0 ran=0 skipped=0
  # shellcheck disable=SC2206  # ARGS is a list of options
  local extra=(${ARGS:-})
  while read -r p s it; do
    [ -n "$p" ] || continue
    if [ "$ALLOC" -gt 0 ] && [ "$p" -gt "$ALLOC" ]; then
      aepar_log "skip $p processes x $s samples: the allocation has $ALLOC tasks"
      echo "p${p}_s${s},$scheme,$p,$s,$it,,,,,,skipped: $ALLOC tasks," >>"$sweep"
      skipped=$((skipped + 1)); continue
    fi
    aepar_place "$p"
    for ((r = 1; r <= repeats; r++)); do
      name=p${p}_s${s}; [ "$repeats" -gt 1 ] && name=${name}_r$r
      dir=$OUT/points/$name
      if [ "${RESUME:-1}" = 1 ] && [ -s "$dir/summary.json" ] && grep -q "^$name,.*,ok," "$sweep"; then
        aepar_log "keep $name (already in $OUT)"; continue
      fi
      [ "$OVERSUB" = 1 ] && aepar_log "note: $RANKS_NODE ranks x $THREADS_P threads on $CORES cores: oversubscribed"
      t0=$(date +%s%N)
      aepar_launch "$p" "$OUT/logs/$name.log" "$PYTHON" -m "$scheme" --samples "$s" --iterations "$it" \
        --seed "${SEED:-0}" --out "$dir" --quiet "${extra[@]}"
      rc=$?
      t1=$(date +%s%N)
      wall=$(aepar_seconds $((t1 - t0)))
      status=ok
      [ "$rc" = 0 ] && [ -s "$dir/summary.json" ] || { status="failed rc=$rc"; failed=$((failed + 1)); }
      ran=$((ran + 1))
      echo "$name,$scheme,$p,$s,$it,$r,$THREADS_P,${LAUNCH}${SRUN_PLUGIN:+ --mpi=$SRUN_PLUGIN},$NODES_USED,$OVERSUB,$status,$wall" >>"$sweep"
      if [ "$status" = ok ]; then
        aepar_log "$name: $p ranks x $THREADS_P threads on $NODES_USED node(s), ${wall}s wall"
      else
        aepar_log "$name FAILED ($status); last lines of $OUT/logs/$name.log:"
        tail -5 "$OUT/logs/$name.log" | sed 's/^/    /'
      fi
    done
  done <<<"$points"
  aepar_log "ran $ran point runs ($failed failed, $skipped skipped); collecting"
  "$PYTHON" -m bench.scaling collect "$OUT" || { aepar_log "no results to collect"; return 1; }
  if [ "${REPORT:-1}" = 1 ]; then
    "$PYTHON" -m bench.scaling report "$OUT" >/dev/null 2>"$OUT/logs/report.log" &&
      aepar_log "plots and scaling.md in $OUT" ||
      aepar_log "no plots (see $OUT/logs/report.log); the CSVs are complete"
  fi
  aepar_log "done: $OUT/strong.csv $OUT/weak.csv"
  [ "$failed" = 0 ]
}
