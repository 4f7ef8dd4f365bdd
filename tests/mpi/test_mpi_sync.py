"""Synchronized pre-training across ranks (tests/mpi/mpi_sync.py under mpirun).

The plan executed on 1 rank, 2 (fewer ranks than layers), 4 (one per layer) and 6 ranks
(replicas inside stages) gives the weights of an independent sequential execution, bit for
bit, also when every stage pauses where it is and a new pipeline continues from the
gathered state; both hand-over modes agree; the real-time newest-wins mode runs to
completion everywhere; a rank waiting for its input sleeps instead of spinning.
"""
import pytest

from tests.conftest import run_mpi

pytestmark = pytest.mark.mpi
PROG = "tests/mpi/mpi_sync.py"


def _ok(result, expect):
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert expect in result.stdout, out


@pytest.mark.parametrize("np_", [1, 2, 4, 6])
def test_plan_reproduces_the_sequential_weights(np_):
    _ok(run_mpi(np_, [PROG, "--mode", "data"], timeout=240), f"OK np={np_} mode=data handover=plan")


@pytest.mark.parametrize("np_, mode, step", [(1, "data", 7), (2, "data", 5), (4, "weights", 4), (6, "data", 5)])
def test_pause_mid_pipeline_and_continue_gives_the_same_weights(np_, mode, step):
    _ok(run_mpi(np_, [PROG, "--mode", mode, "--pause", step], timeout=240),
        f"OK np={np_} mode={mode} handover=plan")


@pytest.mark.parametrize("np_", [2, 4, 6])
def test_weights_handover_gives_the_same_weights(np_):
    _ok(run_mpi(np_, [PROG, "--mode", "weights"], timeout=240), f"OK np={np_} mode=weights handover=plan")


@pytest.mark.parametrize("mode", ["data", "weights"])
def test_replicated_producer_and_consumer(mode):
    # 6 ranks: layer 1 on 3 replicas hands over to layer 2 on 2 replicas (rows re-sharded)
    _ok(run_mpi(6, [PROG, "--mode", mode, "--layers", "784-16-500-8", "--extra", "0,2,1"], timeout=240),
        f"OK np=6 mode={mode} handover=plan layout=layer 1: ranks 0-2 | layer 2: ranks 3-4")


@pytest.mark.parametrize("np_", [1, 4, 6])
def test_newest_wins_runs_every_epoch_once(np_):
    _ok(run_mpi(np_, [PROG, "--handover", "newest"], timeout=240), f"OK np={np_} mode=data handover=newest")


def test_a_waiting_rank_does_not_spin():
    # layer 2 (256-8) waits most of the time for layer 1 (784-256) on 3,000 digits
    _ok(run_mpi(2, [PROG, "--spin", "--layers", "784-256-8", "--rows", "3000", "--epochs", "4",
                    "--extra", "0,2"], timeout=240), "OK spin np=2")
