"""bench.blas_peers: aepar's blocked products compute the same products as one BLAS call;
a run writes its rows and table; impossible options end with one line, nothing written."""
import numpy as np
import pytest

from bench import blas_peers


@pytest.mark.parametrize("n_out", [1000, 1024])
@pytest.mark.parametrize("batch", [16, 100, 520])  # row kernels; stacked blocks; blocks for BLAS
def test_aepar_products_are_the_whole_batch_products(batch, n_out):
    for name, shape, flops, ours, blas, _ in blas_peers.cases(batch, np.random.default_rng(1), n_out):
        mine = ours().copy()
        np.testing.assert_allclose(mine, blas(), rtol=2e-5, atol=1e-4 * np.sqrt(flops / mine.size), err_msg=name)


def test_runs_write_rows_and_tables_and_a_rerun_replaces_its_rows(tmp_path, capsys):
    for batches, widths in (("16", "1000"), ("16,24", "1000,64")):  # the rerun replaces batch 16's 1000 rows
        assert blas_peers.main(["--batches", batches, "--widths", widths, "--repeats", "1",
                                "--out", str(tmp_path)]) == 0
    csv = (tmp_path / "blas_peers.csv").read_text().splitlines()
    assert len(csv) == 1 + 12 and "aepar_gflops" in csv[0] and "cpu_model" in csv[0]
    table = (tmp_path / "blas_peers.md").read_text()
    assert table.count("| 16 |") == 6 and table.count("| 24 |") == 6 and table.count("\n## ") == 1
    assert table.count("x64 |") == 4 and table.count("16x784x64 |") == 1


@pytest.mark.parametrize("argv", [["--batches", "100,x"], ["--batches", "4"], ["--repeats", "0"],
                                  ["--widths", "0"], ["--widths", "1k"]])
def test_impossible_options_are_refused(argv, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        blas_peers.main(argv + ["--out", str(tmp_path)])
    assert e.value.code == 2 and "error:" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_the_ways_of_a_product_are_timed_in_turns():
    from bench.common import time_calls

    calls = []
    timings = time_calls({name: (lambda name=name: calls.append(name)) for name in "abc"}, 3)
    assert calls == list("abc") * 4  # one warm-up each, then three rounds of one call each
    assert set(timings) == set("abc") and all(0 <= t.seconds < 1 and len(t.samples) == 3 for t in timings.values())
