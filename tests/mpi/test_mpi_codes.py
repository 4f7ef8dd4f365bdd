"""The encoding of an eager run's evaluations shared by the ranks (aepar.tasks.combine)."""
import pytest

from tests.conftest import run_mpi

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_every_rank_gets_every_code_with_the_bits_of_one_process(ranks):
    p = run_mpi(ranks, ["tests/mpi/mpi_codes.py"], timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    assert sorted(p.stdout.split("\n")[:-1]) == sorted(f"codes ok rank {r} of {ranks}" for r in range(ranks))
