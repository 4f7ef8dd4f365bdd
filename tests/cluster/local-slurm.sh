#!/usr/bin/env bash
# tests/cluster/local-slurm.sh - bring up a real SLURM cluster on this one Debian 12 host.
#
# aepar's copy of the team tool (/work/shared/tools/local-slurm.sh), adapted so that
# `make test-cluster` (tests/cluster/test_slurm.sh) and users can try jobs/sparse_scaling.sh
# without a cluster. Changes: accounting (MariaDB + slurmdbd) off by default, and the
# self-test is a one-line `srun` with the project's own .venv instead of building extra
# mpi4py/MPICH venvs from PyPI.
#
# Runs as root, needs only Debian's apt repository. Needs no systemd: munged, slurmctld,
# slurmd (and optionally MariaDB + slurmdbd) run as plain background processes; every PID
# is recorded under $BASE/run/ for the teardown script. Idempotent: running it again just
# checks that everything is up (restarting SLURM if the generated slurm.conf changed).
#
# Knobs (environment variables):
#   LOCAL_SLURM_DIR  base dir for config/state/logs          (default /tmp/local-slurm)
#   NNODES           emulated nodes; 1 -> NodeName=localhost, N>1 -> n[1-N] all on this host,
#                    one slurmd each (Debian's build supports multiple slurmd)   (default 1)
#   CPUS             CPUs declared per node (may exceed the real core count) (default 16)
#   MEM_MB           RealMemory declared per node                            (default 8000)
#   WITH_ACCT        1: private MariaDB + slurmdbd so that sacct works        (default 0)
#   SELFTEST         1: srun an mpi4py hello on 2 ranks with the .venv        (default 1)
#   CLUSTER          cluster name                                        (default localcluster)
#   PORT_BASE        slurmctld port; slurmd, slurmdbd and MariaDB take the next three, the
#                    emulated nodes' slurmds PORT_BASE+10184...        (default 6817: Slurm's)
#   LINK_ETC         1: link /etc/slurm/slurm.conf to the generated config so that plain
#                    sinfo/sbatch find it; 0: leave /etc alone, clients need SLURM_CONF (default 1)
#
# With NNODES>1 every "node" is this host: TmpFS is per node (%n) so that Slurm's PMIx
# plugin (srun --mpi=pmix) does not create the same per-step directory twice. Nodes may
# declare more CPUs than the host has; the pip Open MPI then fails in MPI_Init for a
# node's ranks past the real core count under srun (mpirun works): jobs/sparse_scaling.sh
# probes srun at the grid's largest point and falls back to mpirun, saying why.
#
# Submit:    sbatch jobs/sparse_scaling.sh            (from the checkout)
# Tear down: bash tests/cluster/local-slurm-teardown.sh  [--purge]
set -euo pipefail

BASE=${LOCAL_SLURM_DIR:-/tmp/local-slurm}
NNODES=${NNODES:-1}
CPUS=${CPUS:-16}
MEM_MB=${MEM_MB:-8000}
WITH_ACCT=${WITH_ACCT:-0}
SELFTEST=${SELFTEST:-1}
CLUSTER=${CLUSTER:-localcluster}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PORT_BASE=${PORT_BASE:-6817}
LINK_ETC=${LINK_ETC:-1}
# a second instance (another PORT_BASE and LOCAL_SLURM_DIR) runs beside the first untouched
CTLD_PORT=$PORT_BASE SLURMD_PORT=$((PORT_BASE + 1)) DBD_PORT=$((PORT_BASE + 2))
DB_PORT=$((PORT_BASE == 6817 ? 3307 : PORT_BASE + 3)) MULTI_PORT0=$((PORT_BASE + 10184))
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CONF=$BASE/etc/slurm.conf
T_START=$(date +%s%N)
elapsed() { local ms=$((($(date +%s%N) - T_START) / 1000000)); printf '%d.%01d' $((ms / 1000)) $((ms % 1000 / 100)); }
log() { echo "[local_slurm $(elapsed)s] $*"; }
die() { echo "local_slurm: ERROR: $*" >&2; exit 1; }
# alive PIDFILE COMM -> true if the PID in the file is running and is COMM
alive() { local p; [ -s "$1" ] || return 1; p=$(cat "$1"); [ -n "$p" ] && [ "$(ps -o comm= -p "$p" 2>/dev/null)" = "$2" ]; }
wait_for() { local secs=$1; shift; local i; for ((i = 0; i < secs * 4; i++)); do "$@" >/dev/null 2>&1 && return 0; sleep 0.25; done; return 1; }

[ "$(id -u)" = 0 ] || die "run as root"
if [ "$NNODES" -gt 1 ]; then NODES="n[1-$NNODES]"; NODE_NAMES=$(seq -f 'n%g' 1 "$NNODES"); else NODES=localhost; NODE_NAMES=localhost; fi

# ---------------------------------------------------------------- 1. packages
PKGS="slurmctld slurmd slurm-client munge libpmix2"
[ "$WITH_ACCT" = 1 ] && PKGS="$PKGS slurmdbd mariadb-server"
MISSING=""
for p in $PKGS; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || MISSING="$MISSING $p"; done
if [ -n "$MISSING" ]; then
  echo "[local_slurm] installing:$MISSING"
  TMP_POLICY=0
  # keep apt's maintainer scripts from starting the daemons themselves (no systemd here)
  if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; TMP_POLICY=1; fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $MISSING >/dev/null
  [ "$TMP_POLICY" = 1 ] && rm -f /usr/sbin/policy-rc.d
fi
log "packages ok ($(slurmctld -V))"

# Slurm's mpi/pmix plugin dlopen()s .../pmix2/lib/libpmix.so, which only libpmix-dev ships
# (with autoconf & co.); a symlink to the runtime library is enough.
PMIX_SO=$(dpkg -L libpmix2 | grep -m1 '/pmix2/lib/libpmix\.so\.2$' || true)
[ -n "$PMIX_SO" ] && [ ! -e "${PMIX_SO%.2}" ] && ln -s "$(basename "$PMIX_SO")" "${PMIX_SO%.2}"

mkdir -p "$BASE"/{etc,state,spool,log,run}
for n in $NODE_NAMES; do mkdir -p "$BASE/spool/slurmd-$n" "$BASE/tmp/$n"; done

# ---------------------------------------------------------------- 2. munge
[ -s /etc/munge/munge.key ] || mungekey --create --keyfile=/etc/munge/munge.key
chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
mkdir -p /run/munge && chown munge:munge /run/munge && chmod 755 /run/munge
if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
  runuser -u munge -- /usr/sbin/munged
  wait_for 10 test -s /run/munge/munged.pid || die "munged did not start"
  cp /run/munge/munged.pid "$BASE/run/munged.pid"   # marks munged as ours for teardown
  wait_for 10 sh -c 'munge -n </dev/null | unmunge' || die "munge does not work"
fi
log "munge ok"

# ---------------------------------------------------------------- 3. slurm.conf
{
  cat <<EOF
# generated by local-slurm.sh
ClusterName=$CLUSTER
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
StateSaveLocation=$BASE/state
SlurmdSpoolDir=$BASE/spool/slurmd-%n
# per node: srun --mpi=pmix makes its client directory under TmpFS, and emulated nodes share one /tmp
TmpFS=$BASE/tmp/%n
SlurmctldPidFile=$BASE/run/slurmctld.pid
SlurmdPidFile=$BASE/run/slurmd-%n.pid
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdLogFile=$BASE/log/slurmd-%n.log
MailProg=/bin/true
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# trust the CPUs/memory declared below instead of the real hardware (oversubscription)
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
MinJobAge=60
JobCompType=jobcomp/filetxt
JobCompLoc=$BASE/log/jobcomp.log
EOF
  if [ "$WITH_ACCT" = 1 ]; then
    printf 'AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=localhost\nAccountingStoragePort=%s\n' "$DBD_PORT"
  else
    echo 'AccountingStorageType=accounting_storage/none'
  fi
  if [ "$NNODES" -gt 1 ]; then
    echo "NodeName=$NODES NodeHostname=localhost NodeAddr=127.0.0.1 Port=[$MULTI_PORT0-$((MULTI_PORT0 + NNODES - 1))] CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN"
  else
    echo "NodeName=localhost NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN"
  fi
  echo "PartitionName=debug Nodes=$NODES Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
} >"$CONF.new"
CONF_CHANGED=0
if ! cmp -s "$CONF.new" "$CONF"; then mv "$CONF.new" "$CONF"; CONF_CHANGED=1; else rm -f "$CONF.new"; fi

# client commands (sbatch, srun, sinfo ...) read /etc/slurm/slurm.conf: point it at ours
if [ "$LINK_ETC" = 1 ]; then
  mkdir -p /etc/slurm
  if [ -e /etc/slurm/slurm.conf ] && [ ! -L /etc/slurm/slurm.conf ] && [ ! -e /etc/slurm/slurm.conf.local_slurm.bak ]; then
    mv /etc/slurm/slurm.conf /etc/slurm/slurm.conf.local_slurm.bak
  fi
  ln -sfn "$CONF" /etc/slurm/slurm.conf
fi
export SLURM_CONF=$CONF

stop_pid() { # pidfile comm
  alive "$1" "$2" || return 0
  local p; p=$(cat "$1"); kill "$p"
  wait_for 20 sh -c "! kill -0 $p" || kill -9 "$p" 2>/dev/null || true
}
if [ "$CONF_CHANGED" = 1 ]; then # restart SLURM daemons that run with an older config
  for f in "$BASE"/run/slurmd-*.pid; do [ -e "$f" ] && stop_pid "$f" slurmd; done
  stop_pid "$BASE/run/slurmctld.pid" slurmctld
fi

# ---------------------------------------------------------------- 4. accounting (optional)
if [ "$WITH_ACCT" = 1 ]; then
  DB=$BASE/mysql DBRUN=$BASE/mysqlrun
  mkdir -p "$DBRUN" && chown mysql:mysql "$DBRUN"
  if [ ! -d "$DB/mysql" ]; then
    mkdir -p "$DB" && chown mysql:mysql "$DB"
    mariadb-install-db --no-defaults --datadir="$DB" --user=mysql --skip-test-db >"$BASE/log/mariadb-install.log" 2>&1
  fi
  if ! alive "$BASE/run/mariadbd.pid" mariadbd; then
    setsid nohup mariadbd --no-defaults --datadir="$DB" --socket="$DBRUN/mysqld.sock" --port=$DB_PORT \
      --bind-address=127.0.0.1 --user=mysql --pid-file="$DBRUN/mysqld.pid" --innodb-buffer-pool-size=128M \
      --innodb-lock-wait-timeout=900 --log-error="$BASE/log/mariadb.err" </dev/null >/dev/null 2>&1 &
    wait_for 60 mariadb -S "$DBRUN/mysqld.sock" -e 'select 1' || die "MariaDB did not start, see $BASE/log/mariadb.err"
    cp "$DBRUN/mysqld.pid" "$BASE/run/mariadbd.pid"
  fi
  mariadb -S "$DBRUN/mysqld.sock" -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;"
  cat >"$BASE/etc/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdPort=$DBD_PORT
SlurmUser=root
LogFile=$BASE/log/slurmdbd.log
PidFile=$BASE/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
EOF
  chmod 600 "$BASE/etc/slurmdbd.conf"
  if ! alive "$BASE/run/slurmdbd.pid" slurmdbd; then # reads slurmdbd.conf next to $SLURM_CONF
    rm -f "$BASE/run/slurmdbd.pid"
    setsid nohup slurmdbd -D </dev/null >"$BASE/log/slurmdbd.out" 2>&1 &
    wait_for 30 alive "$BASE/run/slurmdbd.pid" slurmdbd || die "slurmdbd did not start, see $BASE/log/slurmdbd.out"
  fi
  wait_for 30 sacctmgr -n list cluster || die "slurmdbd not answering, see $BASE/log/slurmdbd.log"
  sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER" || sacctmgr -i add cluster "$CLUSTER" >/dev/null
  log "MariaDB + slurmdbd ok"
fi

# ---------------------------------------------------------------- 5. slurmctld + slurmd(s)
if ! alive "$BASE/run/slurmctld.pid" slurmctld; then
  rm -f "$BASE/run/slurmctld.pid"
  setsid nohup slurmctld -D -f "$CONF" </dev/null >"$BASE/log/slurmctld.out" 2>&1 &
  wait_for 30 alive "$BASE/run/slurmctld.pid" slurmctld || die "slurmctld did not start, see $BASE/log/slurmctld.out"
fi
wait_for 30 scontrol ping || die "slurmctld not answering, see $BASE/log/slurmctld.log"
for n in $NODE_NAMES; do
  if ! alive "$BASE/run/slurmd-$n.pid" slurmd; then
    rm -f "$BASE/run/slurmd-$n.pid"
    setsid nohup slurmd -D -N "$n" -f "$CONF" </dev/null >"$BASE/log/slurmd-$n.out" 2>&1 &
    wait_for 30 alive "$BASE/run/slurmd-$n.pid" slurmd || die "slurmd $n did not start, see $BASE/log/slurmd-$n.out"
  fi
done
all_idle() { ! sinfo -h -N -o '%T' | grep -vqE '^(idle|mixed|allocated)$'; }
if ! wait_for 30 all_idle; then # e.g. DOWN/DRAIN left in the state files by an earlier run
  scontrol update nodename="$NODES" state=resume 2>/dev/null || true
  wait_for 30 all_idle || { sinfo -N -l; die "nodes not idle, see $BASE/log/"; }
fi
T_UP=$(elapsed)
log "cluster up"
sinfo -N -o '%N %P %T %c %m'

# ---------------------------------------------------------------- 6. self-test (optional)
if [ "$SELFTEST" = 1 ] && [ -x "$REPO/.venv/bin/python" ]; then
  # the pip Open MPI's PMIx has no munge security module: ask for native
  HELLO=$(cd /tmp && PMIX_MCA_psec=native timeout 120 srun -n 2 -N 1 --mpi=pmix "$REPO/.venv/bin/python" -c \
    'from mpi4py import MPI; c = MPI.COMM_WORLD; print(c.Get_rank(), c.Get_size())' 2>&1 | sort | tr '\n' ' ')
  case "$HELLO" in
    "0 2 1 2 ") log "self-test PASS: srun --mpi=pmix started 2 ranks of $REPO/.venv's mpi4py" ;;
    *) log "self-test: srun --mpi=pmix did not start 2 ranks as one job (got: ${HELLO:0:200}); jobs will use mpirun" ;;
  esac
fi
cat <<EOF

SLURM is up on this host (cluster '$CLUSTER', nodes $NODES, $CPUS CPUs each) in ${T_UP}s.
  config: $CONF ($([ "$LINK_ETC" = 1 ] && echo "linked from /etc/slurm/slurm.conf" || echo "export SLURM_CONF=$CONF"))   logs: $BASE/log/   pids: $BASE/run/
  try:    sinfo; sbatch -n 4 --wrap 'srun hostname'; squeue; $( [ "$WITH_ACCT" = 1 ] && echo sacct || echo "cat $BASE/log/jobcomp.log")
  aepar:  sbatch jobs/sparse_scaling.sh (from the checkout; PROCS="1 2" SAMPLES=2000 ITERS=20 for a short one)
Tear down: bash $HERE/local-slurm-teardown.sh        (add --purge to delete $BASE too)
EOF
