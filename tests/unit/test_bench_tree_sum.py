"""bench.tree_sum: both ways timed under mpirun for every vector, a row each with the machine;
a rerun replaces that machine's rows; impossible options end with one line."""
import csv

import pytest

from bench import tree_sum
from tests.conftest import mpirun_cmd


def test_the_vectors_are_the_stacks_packed_gradients():
    v = tree_sum.vectors()
    assert v["784x1000 layer"] == 784 * 1000 + 784 + 1000 and v["250x30 layer"] == 250 * 30 + 250 + 30
    # the unrolled 784-1000-500-250-30-250-500-1000-784: each weight twice, every bias once
    weights, inner_biases = 784000 + 500000 + 125000 + 7500, 1000 + 500 + 250
    assert v["784-1000-500-250-30 unrolled"] == 2 * weights + 2 * inner_biases + 784 + 30


@pytest.mark.mpi
def test_rows_per_vector_and_a_rerun_replaces_them(tmp_path, capsys):
    if mpirun_cmd() is None:
        pytest.skip("no mpirun")
    out = tmp_path / "tree_sum.csv"
    for _ in range(2):
        assert tree_sum.main(["--rounds", "1", "--reps", "2", "--out", str(out)]) == 0
    rows = list(csv.DictReader(open(out)))
    assert [r["vector"] for r in rows] == list(tree_sum.vectors())
    for r in rows:
        assert r["cpu_model"] and r["ranks"] == "2" and r["threads"] == "1"
        assert float(r["tree_bcast_ms"]) > 0 and float(r["halving_ms"]) > 0
        assert float(r["halving_over_tree"]) == pytest.approx(float(r["halving_ms"]) / float(r["tree_bcast_ms"]),
                                                             rel=1e-4)
    table = (tmp_path / "tree_sum.md").read_text()
    assert table.count("| 784x1000 layer |") == 1 and "2 ranks" in table
    assert "784x1000 layer" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--ranks", "3"], ["--rounds", "0"], ["--reps", "0"]])
def test_impossible_options_are_refused(argv, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        tree_sum.main(argv + ["--out", str(tmp_path / "tree_sum.csv")])
    assert e.value.code == 2 and "error:" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
