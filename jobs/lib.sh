# jobs/lib.sh - what every job script shares (source it, do not run it): finding out where
# it runs (SLURM, Grid Engine, plain bash), choosing srun or mpirun with a probe, launching
# ranks in the background so that a signal to the script reaches them; and the scaling sweep.
#
#   jobs/sparse_scaling.sh               the sweep: SLURM batch script, or plain `bash` here
#   jobs/starcluster/sparse_scaling.sge  the sweep under Grid Engine (StarCluster)
#   jobs/train.sh                        one run of any program or scheme (SLURM, or plain bash)
#   jobs/starcluster/train.sge           the same under Grid Engine
#   bench/run.py                         `make bench` runs jobs/sparse_scaling.sh as plain bash
#
# Shared: aepar_setup, aepar_place, aepar_choose_launcher, aepar_launch, aepar_on_signal,
# aepar_why. The job's name in log lines is AEPAR_JOB (default sparse_scaling); probe logs
# and the hostfile go to AEPAR_SCRATCH (default OUT/logs and OUT).
#
# The sweep's grid is data (bench/grid.json, expanded by `python -m bench.scaling points`); this file
# only finds out where it runs, launches each point and collects the CSVs. Knobs (environment):
#   GRID=full|quick|tiny        grid in bench/grid.json             (default full)
#   PROCS="1 2 4 8 16"          processes (overrides the grid)
#   SAMPLES="10000 ... 160000"  sample sizes for strong scaling      (overrides the grid)
#   WEAK=10000                  weak scaling: samples per process     (default: grid's, or min SAMPLES)
#   ITERS=400                   L-BFGS iterations per run
#   OUT=DIR                     results (default runs/sparse_scaling/<slurm|sge|local>-<job id or date>)
#   PYTHON, MPIRUN              interpreter and mpirun (default: the checkout's .venv)
#   LAUNCHER=auto|srun|mpirun   auto: srun if it starts the grid's largest point, else mpirun
#   SRUN_MPI="pmix pmi2"        srun --mpi plugins to try, in order
#   MPI_BIND=none, MPI_ARGS=""  mpirun --bind-to value and extra mpirun options
#   THREADS=1|N|auto            BLAS threads per rank (default 1; auto: node cores / its ranks)
#   MAXPROCS=N                  plain bash only: skip points with more ranks (default: none)
#   REPEATS=1                   runs per point, the grid once per round (the fastest is kept)
#   RESUME=1                    OUT names a sweep with the same settings: keep its finished points
#   SCHEME=aepar.sparse         module run per point; ARGS="--dtype float64 ..." extra options
#   SEED=0                      --seed for every point (same data and initial weights)
#   REPORT=1                    plots and scaling.md after the CSVs
#
# A sweep directory holds one run: run.key lists the settings every point's result depends
# on (where, scheme, ARGS, SEED, iterations, THREADS, PYTHON) and run.id names the run. A
# finished point is kept only when OUT is given again with the same settings (a resubmission
# after a time-out, a requeued job); anything else starts a new run in OUT and reuses
# nothing. Every attempt at a point runs in a directory that did not exist before
# (points/NAME, else points/NAME.2, ...): the sweep never deletes or overwrites a result.
#
# Signals: SIGUSR1 or SIGUSR2 (SLURM --signal=B:USR1@120, Grid Engine s_rt or -notify) or
# SIGINT: no new points; the running one is sent SIGUSR1 (mpirun and srun pass it to the
# ranks, which checkpoint and exit 75); what finished is collected and the sweep exits 75.
# Resubmit with OUT=<that directory> and the same settings to run the rest.
# Exit status: 0 every point ok, 1 a point failed, 2 bad settings, 75 stopped by a signal.

aepar_log() { echo "[${AEPAR_JOB:-sparse_scaling} $(date +%H:%M:%S)] $*"; }
aepar_die() { echo "${AEPAR_JOB:-sparse_scaling}: error: $*" >&2; exit 2; }

# aepar_seconds NANOSECONDS -> seconds with 3 decimals (no bc on minimal nodes)
aepar_seconds() { printf '%d.%03d' $(($1 / 1000000000)) $(($1 / 1000000 % 1000)); }

# aepar_duration SECONDS -> 42s, 3m05s, 1h02m
aepar_duration() {
  local s=$1
  if [ "$s" -ge 3600 ]; then printf '%dh%02dm' $((s / 3600)) $((s % 3600 / 60))
  elif [ "$s" -ge 60 ]; then printf '%dm%02ds' $((s / 60)) $((s % 60))
  else printf '%ds' "$s"; fi
}

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
#   WHERE       slurm | sge | local;  PLACE  where with its cluster (part of run.key)
#   JOBTAG      slurm-<job id> | sge-<job id> | local-<date> (the default OUT's name)
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
    WHERE=slurm JOBTAG=slurm-$SLURM_JOB_ID PLACE=slurm:${SLURM_CLUSTER_NAME:-?}
    ALLOC=${SLURM_NTASKS:-${SLURM_NPROCS:-1}}
    read -r -a HOSTS <<<"$(scontrol show hostnames "${SLURM_JOB_NODELIST:-$(hostname)}" | tr '\n' ' ')"
    read -r -a SLOTS <<<"$(aepar_expand_counts "${SLURM_TASKS_PER_NODE:-$ALLOC}")"
    # SLURM may declare more CPUs than the node has (oversubscribed test clusters)
    [ -n "${SLURM_CPUS_ON_NODE:-}" ] && [ "$SLURM_CPUS_ON_NODE" -lt "$CORES" ] && CORES=$SLURM_CPUS_ON_NODE
  elif [ -n "${PE_HOSTFILE:-}" ] && [ -r "${PE_HOSTFILE:-}" ]; then
    WHERE=sge JOBTAG=sge-${JOB_ID:-0}
    PLACE=sge:${SGE_CELL:-default}@$(cat "${SGE_ROOT:-/}/${SGE_CELL:-default}/common/act_qmaster" 2>/dev/null || hostname)
    ALLOC=${NSLOTS:-1}
    local host slots _
    while read -r host slots _; do HOSTS+=("${host%%.*}"); SLOTS+=("$slots"); done <"$PE_HOSTFILE"
  else
    WHERE=local JOBTAG=local-$(date +%Y%m%d-%H%M%S) PLACE=local:$(hostname)
    ALLOC=${MAXPROCS:-0}
    HOSTS=("$(hostname)") SLOTS=("${MAXPROCS:-0}")
  fi
  [ -n "$MPIRUN" ] || [ "$WHERE" = slurm ] || aepar_die "no mpirun (set MPIRUN=)"
}

# aepar_default_out BASE -> BASE/JOBTAG, or BASE/JOBTAG-<date> when that is taken: job ids
# start again on a new cluster and Grid Engine's job 4 is not SLURM's job 4. A requeued
# or restarted job (same id) comes back to its own directory.
aepar_default_out() {
  local out=$1/$JOBTAG
  [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] || [ "${RESTARTED:-0}" = 1 ] && { echo "$out"; return; }
  [ -e "$out" ] && out=$out-$(date +%Y%m%d-%H%M%S)
  [ -e "$out" ] && out=$out-$$
  echo "$out"
}

# aepar_open_out KEY: make OUT (or check it is a sweep directory) and choose the run.
#   RUN_ID  this run's id (kept from run.id when OUT holds a sweep with the same KEY)
#   KEPT    1 when finished points of that run may be kept
aepar_open_out() {
  local key=$1 old
  [ -z "${OUT:-}" ] && OUT=$(aepar_default_out runs/sparse_scaling)
  [ -e "$OUT" ] && [ ! -d "$OUT" ] && aepar_die "OUT=$OUT exists and is not a directory"
  if [ -d "$OUT" ] && [ ! -f "$OUT/run.key" ] && [ -n "$(ls -A "$OUT" 2>/dev/null)" ]; then
    aepar_die "OUT=$OUT exists and is not a sweep directory (no run.key): name a new one"
  fi
  mkdir -p "$OUT/points" "$OUT/logs" || aepar_die "cannot create $OUT"
  OUT=$(cd "$OUT" && pwd -P)
  KEPT=0
  if [ -f "$OUT/run.key" ] && [ -s "$OUT/run.id" ]; then
    old=$(cat "$OUT/run.key")
    if [ "$old" = "$key" ] && [ "${RESUME:-1}" = 1 ]; then
      RUN_ID=$(cat "$OUT/run.id") KEPT=1
      aepar_log "OUT holds run $RUN_ID with these settings: its finished points are kept"
      return
    fi
    if [ "$old" = "$key" ]; then
      aepar_log "RESUME=0: a new run in $OUT; nothing of run $(cat "$OUT/run.id") is reused"
    else
      aepar_log "OUT holds run $(cat "$OUT/run.id") with other settings ($(diff <(echo "$old") <(echo "$key") |
        sed -n 's/^< //p' | paste -sd' ') -> $(diff <(echo "$old") <(echo "$key") | sed -n 's/^> //p' |
        paste -sd' ')): a new run there, nothing of it reused"
    fi
  fi
  RUN_ID=$JOBTAG@$(date +%Y%m%d-%H%M%S)
  echo "$key" >"$OUT/run.key"
  echo "$RUN_ID" >"$OUT/run.id"
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

# aepar_mpirun_opts P -> MPI_OPTS: mpirun's options for P ranks (hostfile under a scheduler)
aepar_mpirun_opts() {
  local v
  # shellcheck disable=SC2206  # MPI_ARGS is a list of options
  MPI_OPTS=(-np "$1" --bind-to "${MPI_BIND:-none}" ${MPI_ARGS:-})
  # the variables set here (Open MPI warns in every rank's log about one that is not)
  for v in $AEPAR_THREAD_VARS PYTHONPATH; do [ -n "${!v+set}" ] && MPI_OPTS+=(-x "$v"); done
  if [ -n "$HOSTFILE" ]; then MPI_OPTS+=(--hostfile "$HOSTFILE")
  elif [ "$1" -gt "$CORES" ]; then MPI_OPTS+=(--oversubscribe); fi # plain bash, more ranks than cores
}
AEPAR_THREAD_VARS="AEPAR_THREADS OMP_NUM_THREADS OPENBLAS_NUM_THREADS MKL_NUM_THREADS NUMBA_NUM_THREADS"

# aepar_probe LAUNCH P [PLUGIN]: start P ranks of an mpi4py hello the way the points will be
# started; true if they form one job of size P, else PROBE_WHY says what went wrong.
aepar_probe() {
  local how=$1 p=$2 plugin=${3:-} got err=${AEPAR_SCRATCH:-$OUT/logs}/probe-$1${3:+-$3}-$2.log
  # through aepar.comm, which sets MPI's options (OMPI_MCA_btl) as the points will have them
  local hello='import aepar.comm; from mpi4py import MPI; print(MPI.COMM_WORLD.Get_size())'
  aepar_place "$p"
  if [ "$how" = srun ]; then
    got=$(timeout 120 srun -n "$p" -N "$NODES_USED" --mpi="$plugin" --kill-on-bad-exit=1 \
      "$PYTHON" -c "$hello" 2>"$err" </dev/null | sort | uniq -c | awk '{print $1 "x" $2}')
  else
    aepar_mpirun_opts "$p"
    # shellcheck disable=SC2086  # MPIRUN may be "mpirun --option"
    got=$(timeout 120 $MPIRUN "${MPI_OPTS[@]}" "$PYTHON" -c "$hello" 2>"$err" </dev/null |
      sort | uniq -c | awk '{print $1 "x" $2}')
  fi
  [ "$got" = "${p}x$p" ] && return 0
  PROBE_WHY=$(aepar_reason "$err")
  PROBE_WHY="${PROBE_WHY:-${got:-no output} instead of $p ranks of size $p} (full output: $err)"
  return 1
}

# aepar_reason LOG -> one line saying why a launch failed: MPI's complaint, the launcher's
aepar_reason() {
  local topic lines
  topic=$(grep -A1 -m1 'help about:' "$1" 2>/dev/null | tail -1 | tr -d ' ')
  lines=$( { grep -m1 'MPI_Init' "$1" | sed 's/^[* ]*//'
    grep -m1 -E '(^| )error:' "$1"
    [ -n "$topic" ] && echo "Open MPI's message $topic"; } 2>/dev/null | awk 'NF && !seen[$0]++' | head -2)
  [ -n "$lines" ] || lines=$(grep -v -E '^[-* ]*$' "$1" 2>/dev/null | tail -1)
  echo "$lines" | cut -c1-160 | paste -sd'|' | sed 's/|/; /g'
}

# aepar_choose_launcher PMAX: LAUNCH=srun|mpirun, after starting PMAX ranks (the largest
# point, placed as it will be) with it; with LAUNCHER=auto srun falls back to mpirun.
aepar_choose_launcher() {
  local want=${LAUNCHER:-auto} pmax=$1 m why=""
  SRUN_PLUGIN="" HOSTFILE=""
  [ "$WHERE" != slurm ] && [ "$want" = srun ] && aepar_die "LAUNCHER=srun needs a SLURM job"
  if [ "$WHERE" = slurm ] && [ "$want" != mpirun ] && [ "$pmax" -gt 0 ]; then
    # Slurm's PMIx server offers munge and native security; the pip Open MPI's PMIx only
    # has native, and complains on every rank unless told.
    export PMIX_MCA_psec=${PMIX_MCA_psec:-native}
    aepar_place "$pmax"
    for m in ${SRUN_MPI:-pmix pmi2}; do
      if aepar_probe srun "$pmax" "$m"; then
        LAUNCH=srun SRUN_PLUGIN=$m
        aepar_log "srun --mpi=$m starts $pmax rank(s) on $NODES_USED node(s) (the largest point): launching with srun"
        return
      fi
      why="${why:+$why; }--mpi=$m: $PROBE_WHY"
    done
    [ "$want" = srun ] && aepar_die "LAUNCHER=srun: srun cannot start $pmax rank(s) on $NODES_USED node(s): $why"
    aepar_log "srun cannot start $pmax rank(s) on $NODES_USED node(s) (the largest point): $why"
    aepar_log "falling back to mpirun"
  fi
  [ -n "$MPIRUN" ] || aepar_die "no mpirun (set MPIRUN=)"
  LAUNCH=mpirun
  if [ "$WHERE" != local ]; then # the allocation's hosts, slots = its tasks there
    HOSTFILE=${AEPAR_SCRATCH:-$OUT}/hostfile
    local i
    : >"$HOSTFILE"
    for i in "${!HOSTS[@]}"; do echo "${HOSTS[$i]} slots=${SLOTS[$i]:-1}" >>"$HOSTFILE"; done
    # a scheduler's allocation is worth a probe too: stop now rather than fail every point
    if [ "$pmax" -gt 0 ]; then
      aepar_probe mpirun "$pmax" || aepar_die "mpirun cannot start $pmax rank(s) on ${HOSTS[*]}: $PROBE_WHY"
      aepar_log "mpirun starts $pmax rank(s) on $NODES_USED node(s) (the largest point)"
    fi
  fi
}

# aepar_on_signal SIG: stop after the running point; ask it to checkpoint (SIGUSR1, which
# mpirun and srun pass on to the ranks; mpirun would kill them on SIGTERM).
aepar_on_signal() {
  local sig=USR1
  [ "$1" = TERM ] && sig=TERM
  [ "$1" = INT ] && [ -n "$AEPAR_STOP" ] && sig=TERM # a second Ctrl-C
  AEPAR_TRAPPED=1
  [ -n "$AEPAR_STOP" ] || aepar_log "SIG$1: ${AEPAR_STOP_SAYS:-no new points}${AEPAR_CHILD:+; sending SIG$sig to the running point}"
  AEPAR_STOP=${AEPAR_STOP:-$1}
  [ -n "$AEPAR_CHILD" ] && kill -"$sig" "$AEPAR_CHILD" 2>/dev/null
  return 0
}

# aepar_launch P LOGFILE cmd... : start P ranks of cmd with the chosen launcher, in the
# background so that a signal to this shell is handled (and passed on) while it runs.
# LOGFILE "-": the output goes to this script's own (the job's output file).
aepar_launch() {
  local p=$1 log=$2 v rc; shift 2
  for v in $AEPAR_THREAD_VARS; do export "$v=$THREADS_P"; done
  if [ "$LAUNCH" = srun ]; then
    set -- srun -n "$p" -N "$NODES_USED" --mpi="$SRUN_PLUGIN" --kill-on-bad-exit=1 "$@"
  else
    aepar_mpirun_opts "$p"
    # shellcheck disable=SC2086  # MPIRUN may be "mpirun --option"
    set -- $MPIRUN "${MPI_OPTS[@]}" "$@"
  fi
  if [ "$log" = - ]; then "$@" </dev/null & else "$@" </dev/null >"$log" 2>&1 & fi
  AEPAR_CHILD=$!
  while :; do # wait returns early when a trapped signal arrives: wait again
    AEPAR_TRAPPED=0
    wait "$AEPAR_CHILD"; rc=$?
    [ "$AEPAR_TRAPPED" = 1 ] || break
  done
  AEPAR_CHILD=""
  return "$rc"
}

# aepar_fresh_dir NAME -> points/NAME, or points/NAME.2, .3 ...: a path nothing is at
aepar_fresh_dir() {
  local d=points/$1 k=2
  while [ -e "$OUT/$d" ]; do d=points/$1.$k; k=$((k + 1)); done
  echo "$d"
}

# aepar_kept NAME -> the directory of NAME's finished result in this run, if any
aepar_kept() {
  [ "$KEPT" = 1 ] || return 1
  local d
  d=$(awk -F, -v n="$1" -v r="$RUN_ID" '$1 == n && $13 == r && $11 == "ok" { d = $14 } END { print d }' "$OUT/sweep.csv")
  [ -n "$d" ] && [ -s "$OUT/$d/summary.json" ] && echo "$d"
}

# aepar_why RC -> what a scheme's exit status means
aepar_why() {
  case $1 in
    1) echo "internal error" ;; 2) echo "bad input" ;; 3) echo "diverged" ;;
    75) echo "checkpoint saved" ;; 124) echo "a rank stalled" ;;
    *) if [ "$1" -gt 128 ] && [ "$1" -lt 160 ]; then echo "SIG$(kill -l $(($1 - 128)) 2>/dev/null)"; else echo "failed"; fi ;;
  esac
}

# aepar_launcher_failed RC: true when a launch ended with a status no aepar program exits
# with (nor a signal's), without a stop asked for: the launcher itself failed to start the
# ranks (Open MPI's PMIx listener does so now and then). Such a launch is tried once more
# (a sweep's point only if its run directory did not appear); any other failure is the
# program's own.
aepar_launcher_failed() {
  [ -z "$AEPAR_STOP" ] || return 1
  case $1 in 0 | 1 | 2 | 3 | 75 | 124) return 1 ;; esac
  [ "$1" -le 128 ] || [ "$1" -ge 160 ]
}

SWEEP_HEADER="name,scheme,processes,samples,iterations,repeat,threads,launcher,nodes,oversubscribed,status,wall_seconds,run,dir"

# aepar_sweep: run every point of the grid inside this allocation, then write the CSVs.
aepar_sweep() {
  aepar_setup
  local scheme=${SCHEME:-aepar.sparse} repeats=${REPEATS:-1} points iters key
  # shellcheck disable=SC2206  # ARGS is a list of options
  local extra=(${ARGS:-})
  points=$("$PYTHON" -m bench.scaling points --grid "${GRID:-full}" --procs "${PROCS:-}" \
    --samples "${SAMPLES:-}" --iterations "${ITERS:-}" --weak "${WEAK:-}") ||
    aepar_die "bad grid (GRID=${GRID:-full} PROCS=${PROCS:-} SAMPLES=${SAMPLES:-} ITERS=${ITERS:-})"
  iters=$(echo "$points" | awk 'NR == 1 { print $3 }')
  # what a point's result depends on, besides its own processes, samples and repeat
  key=$(printf 'where=%s\nscheme=%s\nargs=%s\nseed=%s\niterations=%s\nthreads=%s\npython=%s' \
    "$PLACE" "$scheme" "${ARGS:-}" "${SEED:-0}" "$iters" "${THREADS:-1}" "$PYTHON")
  aepar_open_out "$key"
  "$PYTHON" -m bench.scaling points --grid "${GRID:-full}" --procs "${PROCS:-}" --samples "${SAMPLES:-}" \
    --iterations "${ITERS:-}" --weak "${WEAK:-}" --write "$OUT/grid.json" --run "$RUN_ID" >/dev/null ||
    aepar_die "cannot write $OUT/grid.json"
  local sweep=$OUT/sweep.csv
  if [ -s "$sweep" ]; then
    [ "$(head -1 "$sweep")" = "$SWEEP_HEADER" ] || aepar_die "$sweep has other columns (an older aepar): name a new OUT"
  else
    echo "$SWEEP_HEADER" >"$sweep"
  fi

  # the plan: points of the grid this allocation can run and this run has not finished;
  # with REPEATS the whole grid once per round, so that a slow minute of a shared machine
  # hits one round and not every run of one point
  local p s it r name d plan=() clipped=() kept=0 pmax=0
  for ((r = 1; r <= repeats; r++)); do
    while read -r p s it; do
      [ -n "$p" ] || continue
      if [ "$ALLOC" -gt 0 ] && [ "$p" -gt "$ALLOC" ]; then
        [ "$r" = 1 ] || continue
        clipped+=("$p"); echo "p${p}_s${s},$scheme,$p,$s,$it,,,,,,skipped: $ALLOC tasks,,$RUN_ID," >>"$sweep"
        continue
      fi
      name=p${p}_s${s}; [ "$repeats" -gt 1 ] && name=${name}_r$r
      if d=$(aepar_kept "$name"); then kept=$((kept + 1)); continue; fi
      plan+=("$name $p $s $it $r"); [ "$p" -gt "$pmax" ] && pmax=$p
    done <<<"$points"
  done
  if [ "${#clipped[@]}" -gt 0 ]; then
    aepar_log "the grid is clipped to the allocation's $ALLOC tasks: ${#clipped[@]} point(s) with" \
      "$(printf '%s\n' "${clipped[@]}" | sort -nu | paste -sd' ') processes are skipped" \
      "(ask for more: sbatch -n N, qsub -pe orte N)"
  fi
  [ "$kept" -gt 0 ] && aepar_log "$kept point run(s) already finished in run $RUN_ID: kept"

  aepar_choose_launcher "$pmax"
  case $WHERE in
    slurm) aepar_log "SLURM job $SLURM_JOB_ID: $ALLOC tasks on ${HOSTS[*]} (tasks per node ${SLOTS[*]})" ;;
    sge) aepar_log "Grid Engine job ${JOB_ID:-?}: $ALLOC slots on ${HOSTS[*]} (slots ${SLOTS[*]})" ;;
    *) aepar_log "no scheduler: mpirun on $(hostname)${MAXPROCS:+, at most $MAXPROCS ranks}" ;;
  esac
  aepar_log "repo $REPO; python $PYTHON; launcher $LAUNCH${SRUN_PLUGIN:+ --mpi=$SRUN_PLUGIN}${HOSTFILE:+ --hostfile $HOSTFILE}"
  aepar_log "$CORES cores per node; grid ${GRID:-full}${PROCS:+ PROCS=\"$PROCS\"}${SAMPLES:+ SAMPLES=\"$SAMPLES\"}${ITERS:+ ITERS=$ITERS}${WEAK:+ WEAK=$WEAK}: ${#plan[@]} point run(s) to go, small first -> $OUT (run $RUN_ID)"

  # name p s it ranks-on-the-busiest-node threads cores: what bench.scaling eta prices
  local entry
  : >"$OUT/plan.tsv"
  for entry in "${plan[@]}"; do
    read -r name p s it r <<<"$entry"
    aepar_place "$p"
    echo "$name $p $s $it $RANKS_NODE $THREADS_P $CORES" >>"$OUT/plan.tsv"
  done

  AEPAR_STOP="" AEPAR_CHILD=""
  trap 'aepar_on_signal USR1' USR1
  trap 'aepar_on_signal USR2' USR2
  trap 'aepar_on_signal INT' INT
  trap 'aepar_on_signal TERM' TERM
  local k=0 n=${#plan[@]} attempt t0 t1 wall rc status failed=0 ran=0 interrupted=0 left first_eta="" sweep_t0
  sweep_t0=$(date +%s)
  for entry in "${plan[@]}"; do
    [ -n "$AEPAR_STOP" ] && break
    read -r name p s it r <<<"$entry"
    k=$((k + 1))
    aepar_place "$p"
    [ "$OVERSUB" = 1 ] && aepar_log "note: $RANKS_NODE ranks x $THREADS_P threads on $CORES cores: oversubscribed"
    d=$(aepar_fresh_dir "$name")
    for attempt in 1 2; do
      t0=$(date +%s%N)
      aepar_launch "$p" "$OUT/logs/$name.log" "$PYTHON" -m "$scheme" --limit "$s" --iterations "$it" \
        --seed "${SEED:-0}" --out "$OUT/$d" --quiet "${extra[@]}"
      rc=$?
      [ "$attempt" = 1 ] && [ ! -e "$OUT/$d" ] && aepar_launcher_failed "$rc" || break
      aepar_log "$name: the launcher failed before the program started (rc=$rc: $(aepar_reason "$OUT/logs/$name.log")); launching it once more"
      mv "$OUT/logs/$name.log" "$OUT/logs/$name.launch-failed.log"
      sleep 1
    done
    t1=$(date +%s%N)
    wall=$(aepar_seconds $((t1 - t0)))
    if [ "$rc" = 0 ] && [ -s "$OUT/$d/summary.json" ]; then status=ok
    elif [ -n "$AEPAR_STOP" ]; then status="interrupted rc=$rc ($(aepar_why "$rc"))"; interrupted=1
    else status="failed rc=$rc ($(aepar_why "$rc"))"; failed=$((failed + 1)); fi
    ran=$((ran + 1))
    echo "$name,$scheme,$p,$s,$it,$r,$THREADS_P,${LAUNCH}${SRUN_PLUGIN:+ --mpi=$SRUN_PLUGIN},$NODES_USED,$OVERSUB,$status,$wall,$RUN_ID,$d" >>"$sweep"
    left=""
    if [ "$k" -lt "$n" ] && [ -z "$AEPAR_STOP" ]; then
      left=$("$PYTHON" -m bench.scaling eta "$OUT" --done "$k" 2>/dev/null)
      [ -z "$first_eta" ] && [ "$status" = ok ] && first_eta="$left after point $k"
    fi
    if [ "$status" = ok ]; then
      aepar_log "$name ($k/$n) ok: $p rank(s) x $THREADS_P thread(s) on $NODES_USED node(s), ${wall}s wall${left:+; $left}"
    else
      aepar_log "$name ($k/$n) $(echo "${status%% *}" | tr a-z A-Z): ${status#* }${left:+; $left}; last lines of $OUT/logs/$name.log:"
      tail -5 "$OUT/logs/$name.log" | sed 's/^/    /'
    fi
  done
  trap - USR1 USR2 INT TERM
  local took=$(($(date +%s) - sweep_t0))
  aepar_log "ran $ran of $n point run(s) in $(aepar_duration "$took") ($failed failed, ${#clipped[@]} skipped, $kept kept)${first_eta:+; estimated $first_eta}"
  if [ -n "$AEPAR_STOP" ]; then
    aepar_log "stopped by SIG$AEPAR_STOP: $((n - ran + interrupted)) point run(s) not finished; resubmit with" \
      "OUT=$OUT and the same settings to run them (finished points are kept)"
  fi
  if "$PYTHON" -m bench.scaling collect "$OUT"; then
    if [ "${REPORT:-1}" = 1 ]; then
      "$PYTHON" -m bench.scaling report "$OUT" >/dev/null 2>"$OUT/logs/report.log" &&
        aepar_log "plots and scaling.md in $OUT" ||
        aepar_log "no plots (see $OUT/logs/report.log); the CSVs are complete"
    fi
    aepar_log "done: $OUT/strong.csv $OUT/weak.csv"
  else
    aepar_log "no results to collect"
    [ -z "$AEPAR_STOP" ] && return 1
  fi
  case $AEPAR_STOP in
    "") [ "$failed" = 0 ] ;;
    TERM) return 143 ;;
    *) return 75 ;;
  esac
}

# ---- one training run (jobs/train.sh, jobs/starcluster/train.sge) ---------------------------
AEPAR_PROGRAMS="pretrain greedy sync sparse eager finetune classify"
AEPAR_SCHEMES="data model hybrid auto" # pretrain's schemes that are no program of their own

# aepar_train SCHEME [options...]: run `python -m aepar.PROGRAM options... --resume-or-start`
# on the job's ranks, in WORKDIR; pass a stop signal on to it; after the time-limit signal
# (SIGUSR1) and a saved checkpoint (exit 75), requeue the job (SLURM) or ask Grid Engine to
# run it again (exit 99). Returns the program's status.
aepar_train() {
  local scheme=${1:-} prog a out="" i np scratch rc pre=()
  [ -n "$scheme" ] || aepar_die "usage: train.sh SCHEME [aepar options...]; SCHEME: a program ($AEPAR_PROGRAMS) or a scheme of pretrain ($AEPAR_SCHEMES)"
  shift
  if [[ " $AEPAR_PROGRAMS " == *" $scheme "* ]]; then prog=aepar.$scheme
  elif [[ " $AEPAR_SCHEMES " == *" $scheme "* ]]; then prog=aepar.pretrain pre=(--scheme "$scheme")
  else aepar_die "no program or scheme '$scheme': programs $AEPAR_PROGRAMS; schemes of pretrain $AEPAR_SCHEMES"; fi
  local args=("$@")
  for ((i = 0; i < ${#args[@]}; i++)); do
    a=${args[$i]}
    case $a in
      --resume | --resume=* | --overwrite | --resume-or-start)
        aepar_die "$a: the job starts or continues its run by itself (--resume-or-start); give --out DIR only" ;;
      --out) out=${args[$((i + 1))]:-} ;;
      --out=*) out=${a#--out=} ;;
    esac
  done
  aepar_setup
  cd "$WORKDIR" || aepar_die "cannot cd to $WORKDIR"
  # the checkout's aepar, from any working directory and on every node
  export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
  [ -n "$out" ] || { out=runs/$scheme/$JOBTAG; pre+=(--out "$out"); }
  case $WHERE in
    slurm) np=$ALLOC; THREADS=${THREADS:-${SLURM_CPUS_PER_TASK:-auto}} ;;
    sge) np=$ALLOC; THREADS=${THREADS:-auto} ;;
    *) np=${NP:-1}; THREADS=${THREADS:-auto} ;;
  esac
  [[ $np =~ ^[1-9][0-9]*$ ]] || aepar_die "NP=$np: need a number of ranks >= 1"
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/aepar-train.XXXXXX") || aepar_die "cannot make a scratch directory"
  # shellcheck disable=SC2064  # the path now
  trap "rm -rf '$scratch'" EXIT
  AEPAR_SCRATCH=$scratch
  aepar_choose_launcher "$np"
  aepar_place "$np"
  case $WHERE in
    slurm) aepar_log "SLURM job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}): $np tasks on ${HOSTS[*]} (tasks per node ${SLOTS[*]})" ;;
    sge) aepar_log "Grid Engine job ${JOB_ID:-?}: $np slots on ${HOSTS[*]} (slots ${SLOTS[*]})" ;;
    *) aepar_log "no scheduler: mpirun on $(hostname), NP=$np" ;;
  esac
  aepar_log "$prog ${pre[*]:+${pre[*]} }${args[*]} --resume-or-start: $np rank(s) x $THREADS_P thread(s), launcher $LAUNCH${SRUN_PLUGIN:+ --mpi=$SRUN_PLUGIN}, in $WORKDIR"
  [ "$OVERSUB" = 1 ] && aepar_log "note: $RANKS_NODE ranks x $THREADS_P threads on $CORES cores: oversubscribed"

  AEPAR_STOP="" AEPAR_CHILD="" AEPAR_STOP_SAYS="the run is asked to checkpoint and stop"
  trap 'aepar_on_signal USR1' USR1
  trap 'aepar_on_signal USR2' USR2
  trap 'aepar_on_signal INT' INT
  trap 'aepar_on_signal TERM' TERM
  local attempt
  for attempt in 1 2; do
    aepar_launch "$np" - "$PYTHON" -m "$prog" "${pre[@]}" "${args[@]}" --resume-or-start
    rc=$?
    [ "$attempt" = 1 ] && aepar_launcher_failed "$rc" || break
    aepar_log "the launcher failed before $prog started (rc=$rc): launching it once more"
    sleep 1
  done
  trap - USR1 USR2 INT TERM
  aepar_log "$prog exited $rc${AEPAR_STOP:+ after SIG$AEPAR_STOP} ($([ "$rc" = 0 ] && echo done || aepar_why "$rc"))"
  if [ "$rc" = 75 ] && [ "$AEPAR_STOP" = USR1 ]; then # the time limit's warning: come back
    if [ "$WHERE" = slurm ]; then
      if [ "${SLURM_RESTART_COUNT:-0}" -ge "${MAX_REQUEUES:-20}" ]; then
        aepar_log "not requeued: restarted ${SLURM_RESTART_COUNT:-0} times already (MAX_REQUEUES=${MAX_REQUEUES:-20})"
      elif scontrol requeue "$SLURM_JOB_ID"; then
        aepar_log "checkpoint saved: job $SLURM_JOB_ID requeued; it resumes from $out"
      else
        aepar_log "checkpoint saved, but scontrol requeue failed: resubmit the same command to resume"
      fi
    elif [ "$WHERE" = sge ]; then
      aepar_log "checkpoint saved: exit 99, Grid Engine runs the job again and it resumes from $out"
      return 99
    fi
  elif [ "$rc" = 75 ]; then
    aepar_log "checkpoint saved in $out: the same command resumes it"
  fi
  return "$rc"
}
