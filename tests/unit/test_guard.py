"""Signals that come before the run's Guard exists (aepar.comm.run_main keeps them)."""
import subprocess
import sys

from tests.conftest import ROOT

PROGRAM = r"""
import os, signal, sys
import aepar
from aepar.comm import run_main
from aepar.guard import STOP, Guard

def main(argv, comm):
    os.kill(os.getpid(), signal.SIGUSR1)  # while the CLI sets up: remembered, not fatal
    guard = Guard(comm, "t", faults=[])
    assert guard.flags() == 0.0
    with guard:
        assert guard.signum == signal.SIGUSR1 and guard.flags() == STOP, (guard.signum, guard.flags())
    print("EARLY OK", flush=True)

sys.exit(run_main(main, "t", []))
"""


def test_a_signal_before_the_guard_is_acted_on_at_its_first_safe_point():
    result = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0 and "EARLY OK" in result.stdout, result.stdout + result.stderr
