"""``python -m bench.chaos`` for real on one small case: the sparse autoencoder interrupted
twice (seed 6: SIGTERM on rank 1 of 2, then SIGKILL of the only rank after a periodic
checkpoint), resumed on 1 and then 2 ranks, ends with the uninterrupted run's bits."""
import csv

import pytest

from bench import chaos
from tests.conftest import mpirun_cmd

pytestmark = pytest.mark.mpi


def test_sparse_survives_two_interruptions_bit_for_bit(tmp_path):
    if mpirun_cmd() is None:
        pytest.skip("no mpirun found (not next to this Python, not on PATH; MPIRUN unset)")
    code = chaos.main(["--schemes", "sparse", "--seed", "6", "--interruptions", "2", "--max-ranks", "2",
                       "--out", str(tmp_path), "--work", str(tmp_path / "work")])
    rows = list(csv.DictReader(open(tmp_path / "chaos.csv")))
    assert code == 0, rows
    assert [(r["fault"], r["ranks"], r["exit"], r["counted"], r["resume"], r["resume_ranks"]) for r in rows] == [
        ("sigterm", "2", "75", "True", "accepted", "1"), ("kill", "1", "-9", "True", "accepted", "2")]
    assert all(r["checkpoint"].startswith("iteration ") for r in rows)
    assert int(rows[1]["checkpoint"].split()[1]) > int(rows[0]["checkpoint"].split()[1])
    table = (tmp_path / "chaos.md").read_text()
    assert "| sparse | 1-2 | 2 / 2 | 0 | kill 1, sigterm 1 | yes |" in table and "## Problems" not in table
