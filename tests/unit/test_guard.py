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


class _Root:
    rank, size, is_root = 0, 1, True


def test_a_stop_signal_is_acknowledged_once_with_where_it_takes_effect(capsys):
    """A scheme whose steps are not safe points (the eager ensemble's rounds, model-parallel
    slots) stops minutes after the signal: the run says so at once, in one line, and only once."""
    import signal

    from aepar.guard import Guard, StepsOnly

    guard = Guard(_Root(), "aepar.eager", faults=[])
    steps = StepsOnly(guard, "the end of this round (every model's current epoch)")
    steps.step()
    assert capsys.readouterr().out == ""  # no signal, nothing said
    guard.signum = signal.SIGUSR1
    steps.step()
    steps.step()
    assert capsys.readouterr().out == ("aepar.eager: SIGUSR1 received: saving a checkpoint at the end of this round "
                                       "(every model's current epoch), then exit 75\n")
    quiet = Guard(_Root(), "aepar.greedy", faults=[], quiet=True)
    quiet.signum = signal.SIGTERM
    quiet.step()
    assert capsys.readouterr().out == ""
