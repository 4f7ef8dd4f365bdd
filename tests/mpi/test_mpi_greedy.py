"""Data-parallel RBM / autoencoder-layer / stacked-autoencoder epochs are bit-identical to
one process, also across a pause and resume (mpirun -np 1/2/3/4/8)."""
import pytest

from tests.conftest import run_mpi


@pytest.mark.mpi
@pytest.mark.parametrize("np_, kernels, dtype", [(1, "numba", "float32"), (2, "numba", "float32"),
                                                  (3, "numpy", "float64"), (4, "numba", "float64"),
                                                  (8, "numpy", "float64")])
def test_data_parallel_epochs_equal_one_process(np_, kernels, dtype):
    result = run_mpi(np_, ["tests/mpi/mpi_greedy.py", kernels, dtype], timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    ok = [line for line in result.stdout.splitlines() if line.startswith("OK rank")]
    assert sorted(ok) == sorted(f"OK rank {r}/{np_}" for r in range(np_)), result.stdout + result.stderr
