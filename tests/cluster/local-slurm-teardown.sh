#!/usr/bin/env bash
# tests/cluster/local-slurm-teardown.sh - stop what local-slurm.sh started, by the PIDs it
# recorded (aepar's copy of /work/shared/tools/local-slurm-teardown.sh, unchanged otherwise).
#   --purge   also delete the base dir (config, state, logs, MariaDB data, self-test venvs)
# Packages stay installed, so the next local-slurm.sh run skips apt.
set -uo pipefail
BASE=${LOCAL_SLURM_DIR:-/tmp/local-slurm}
CONF=$BASE/etc/slurm.conf
alive() { local p; [ -s "$1" ] || return 1; p=$(cat "$1"); [ -n "$p" ] && [ "$(ps -o comm= -p "$p" 2>/dev/null)" = "$2" ]; }
stop() { # pidfile comm
  if alive "$1" "$2"; then
    local p i; p=$(cat "$1"); kill "$p"
    for ((i = 0; i < 80; i++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.25; done
    kill -0 "$p" 2>/dev/null && { echo "  $2 ($p) ignored SIGTERM, sending SIGKILL"; kill -9 "$p"; }
    echo "  stopped $2 (pid $p)"
  fi
  rm -f "$1"
}

echo "[local_slurm teardown] base $BASE"
if [ -f "$CONF" ] && alive "$BASE/run/slurmctld.pid" slurmctld; then
  JOBS=$(SLURM_CONF=$CONF squeue -h -o %i 2>/dev/null | tr '\n' ' ')
  if [ -n "${JOBS// /}" ]; then
    echo "  cancelling jobs: $JOBS"; SLURM_CONF=$CONF scancel $JOBS
    for ((i = 0; i < 60; i++)); do [ -z "$(SLURM_CONF=$CONF squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.5; done
  fi
fi
for f in "$BASE"/run/slurmd-*.pid; do [ -e "$f" ] && stop "$f" slurmd; done
stop "$BASE/run/slurmctld.pid" slurmctld
stop "$BASE/run/slurmdbd.pid" slurmdbd
stop "$BASE/run/mariadbd.pid" mariadbd
stop "$BASE/run/munged.pid" munged # only present when local-slurm.sh started munged itself

if [ -L /etc/slurm/slurm.conf ] && [ "$(readlink /etc/slurm/slurm.conf)" = "$CONF" ]; then
  rm -f /etc/slurm/slurm.conf
  [ -e /etc/slurm/slurm.conf.local_slurm.bak ] && mv /etc/slurm/slurm.conf.local_slurm.bak /etc/slurm/slurm.conf
fi
LEFT=$(ps -eo pid=,comm= | awk '$2 ~ /^(slurmstepd|slurmd|slurmctld|slurmdbd)$/')
[ -n "$LEFT" ] && echo "  note: still running (not started from $BASE, left alone):" && echo "$LEFT"
if [ "${1:-}" = --purge ]; then rm -rf "$BASE"; echo "  removed $BASE"; fi
echo "[local_slurm teardown] done"
