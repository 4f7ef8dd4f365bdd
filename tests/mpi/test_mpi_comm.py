"""aepar.comm under mpirun -np 1, 2 and 4."""
import pytest

from tests.conftest import run_mpi

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_collectives_hold_at_every_size(ranks):
    p = run_mpi(ranks, ["tests/mpi/mpi_comm.py"], timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert sorted(p.stdout.split("\n")[:-1]) == sorted(f"ok rank {r} of {ranks}" for r in range(ranks))


@pytest.mark.parametrize("ranks", [2, 4])
def test_collective_user_error_one_line_exit_2(ranks):
    p = run_mpi(ranks, ["tests/mpi/mpi_fail.py", "user-all"], timeout=60)
    assert p.returncode == 2
    errors = [line for line in p.stderr.splitlines() if line.startswith("mpi_fail: error:")]
    assert errors == ["mpi_fail: error: --samples 1 is fewer than the 2 ranks"], p.stderr
    assert "finished" not in p.stdout


@pytest.mark.parametrize("ranks", [2, 4])
def test_one_rank_user_error_ends_every_rank(ranks):
    p = run_mpi(ranks, ["tests/mpi/mpi_fail.py", "user-one"], timeout=60)
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert f"mpi_fail: error: rank-local bad file (rank {ranks - 1})" in p.stderr
    assert "finished" not in p.stdout


@pytest.mark.parametrize("ranks", [2, 4])
def test_internal_error_aborts_not_hangs(ranks):
    p = run_mpi(ranks, ["tests/mpi/mpi_fail.py", "crash"], timeout=60)
    assert p.returncode != 0
    assert f"rank {ranks - 1}/{ranks}: internal error" in p.stderr and "RuntimeError: boom" in p.stderr
    assert "finished" not in p.stdout
