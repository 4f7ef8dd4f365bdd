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
    assert capsys.readouterr().out == ("aepar.eager: SIGUSR1 received: stopping at the end of this round "
                                       "(every model's current epoch) with a checkpoint (exit 75)\n")
    quiet = Guard(_Root(), "aepar.greedy", faults=[], quiet=True)
    quiet.signum = signal.SIGTERM
    quiet.step()
    assert capsys.readouterr().out == ""


def test_a_stop_that_reached_another_rank_first_is_announced_by_rank_0(capsys):
    """mpirun and SLURM signal the ranks one after another: when the step's reduction carries
    another rank's stop before rank 0's own signal lands (or it never does), rank 0 still says
    the one line, once; a phase of StepsOnly before does not leave its safe point in the line."""
    import signal

    from aepar.guard import STOP, Guard, StepsOnly

    guard = Guard(_Root(), "aepar.pretrain", faults=[])
    StepsOnly(guard, "the end of this slot (every rank's current epoch)").step()
    guard.step()
    assert guard.decide(0.0) == (False, False) and capsys.readouterr().out == ""
    assert guard.decide(STOP)[1] and guard.decide(STOP)[1]
    assert capsys.readouterr().out == ("aepar.pretrain: a stop signal reached another rank: stopping here "
                                       "with a checkpoint (exit 75)\n")
    late = Guard(_Root(), "aepar.pretrain", faults=[])
    StepsOnly(late, "the end of this slot (every rank's current epoch)").step()
    late.signum = signal.SIGTERM
    late.step()
    late.decide(STOP)
    assert capsys.readouterr().out == ("aepar.pretrain: SIGTERM received: stopping at the next step "
                                       "with a checkpoint (exit 75)\n")


def test_the_eager_evaluations_are_safe_points(capsys):
    """aepar.eager's accuracy evaluations after training are no steps, minutes each on a
    large data set: a stop signal on any rank ends the run between two of them (exit 75 via
    the checkpoint taken when training ended), saying so once; without one they go on."""
    import signal

    import pytest

    from aepar.eager import _stop_if_asked
    from aepar.errors import Interrupted
    from aepar.guard import Guard

    class Comm(_Root):
        def allreduce(self, value, op="sum"):
            return value

    class Checkpointer:
        def interrupted(self):
            return Interrupted("checkpoint at 10 epochs saved")

    guard = Guard(Comm(), "aepar.eager", faults=[])
    _stop_if_asked(guard, Comm(), Checkpointer())  # no signal: nothing happens
    guard.signum = signal.SIGTERM
    with pytest.raises(Interrupted):
        _stop_if_asked(guard, Comm(), Checkpointer())
    assert capsys.readouterr().out == "aepar.eager: SIGTERM received: stopping here with a checkpoint (exit 75)\n"
