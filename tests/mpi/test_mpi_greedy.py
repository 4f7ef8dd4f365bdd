"""Data-parallel RBM / autoencoder-layer / stacked-autoencoder epochs equal one process (mpirun -np 1/2/4)."""
import pytest

from tests.conftest import run_mpi


@pytest.mark.mpi
@pytest.mark.parametrize("np_", [1, 2, 4])
def test_data_parallel_epochs_equal_one_process(np_):
    result = run_mpi(np_, ["tests/mpi/mpi_greedy.py", "numpy"], timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    ok = [line for line in result.stdout.splitlines() if line.startswith("OK rank")]
    assert sorted(ok) == sorted(f"OK rank {r}/{np_}" for r in range(np_)), result.stdout + result.stderr
