"""bench.block_tax: the ratios and their targets per machine, a real run's rows and
table, impossible options refused with nothing written."""
import csv

import pytest

from bench import block_tax


def _row(cpu, workload, threads, impl, seconds):
    return {"benchmark": "block_tax", "cpu_model": cpu, "isa": "avx2", "blas": "openblas", "workload": workload,
            "threads": threads, "implementation": impl, "seconds": str(seconds),
            "fraction_of_sgemm": str(round(0.6 / seconds, 3)), "date": "2026-11-28",
            "command": "python -m bench.block_tax", "batch": "100"}


def test_the_ratios_are_8_blocks_over_1_block_and_over_the_faster_peer():
    rows = [_row("cpu A", "rbm", 1, block_tax.EIGHT, 1.2), _row("cpu A", "rbm", 1, block_tax.ONE, 1.0),
            _row("cpu A", "rbm", 1, "pytorch careful", 0.8), _row("cpu A", "rbm", 1, "pytorch plain", 2.0),
            _row("cpu A", "cae", 2, block_tax.EIGHT, 1.0), _row("cpu A", "cae", 2, block_tax.ONE, 1.0),
            _row("cpu B", "ae", 1, block_tax.EIGHT, 1.0)]  # no 1-block epoch: no ratio to give
    found = {(s["cpu"], s["workload"]): s for s in block_tax.summary(rows)}
    assert set(found) == {("cpu A", "rbm"), ("cpu A", "cae")}
    rbm = found[("cpu A", "rbm")]
    assert rbm["tax"] == pytest.approx(1.2) and rbm["peer"] == "pytorch careful"
    assert rbm["vs_peer"] == pytest.approx(1.5)
    assert found[("cpu A", "cae")]["peer"] is None
    table = block_tax.markdown(rows)
    assert "| 1.20 (over) |" in table and "| 1.50 (slower) |" in table  # both targets missed, and said
    assert "| 50% (75%) |" in table  # the 8-block epoch's share of SGEMM, then the faster peer's
    assert "| 1.00 | not measured | not measured | 60% |" in table
    assert table.count("\n## ") == 1 and "2026-11-28" in table and "`python -m bench.block_tax`" in table
    # a narrow layer's epoch of about 15 ms keeps three significant digits
    assert block_tax._seconds(0.01476) == "0.0148" and block_tax._seconds(0.4351) == "0.435"


def test_a_run_writes_its_rows_and_table(tmp_path):
    out, md = tmp_path / "block_tax.csv", tmp_path / "block_tax.md"

    def run(workload, *more):
        assert block_tax.main(["--threads", "1", "--workloads", workload, "--rows", "300", "--repeats", "1",
                               "--no-torch", "--out", str(out), "--md", str(md), *more]) == 0
    run("ae,rbm")
    lines = out.read_text().splitlines()
    assert len(lines) == 1 + 4 and "cpu_model" in lines[0] and "isa" in lines[0] and "blas" in lines[0]
    assert "autoencoder layer | 1 |" in md.read_text() and "RBM layer | 1 |" in md.read_text()
    kept = [r["all_seconds"] for r in csv.DictReader(open(out)) if r["workload"] == "ae"]
    run("rbm")  # one workload again on the same machine: its rows replaced, the other's kept
    again = list(csv.DictReader(open(out)))
    assert sorted(r["workload"] for r in again) == ["ae", "ae", "rbm", "rbm"]
    assert [r["all_seconds"] for r in again if r["workload"] == "ae"] == kept
    assert "autoencoder layer | 1 |" in md.read_text() and "RBM layer | 1 |" in md.read_text()
    run("rbm", "--batch", "150")  # another batch: rows and a table of its own, the batch-100 ones kept
    rows = list(csv.DictReader(open(out)))
    assert sorted((r["workload"], r["batch"]) for r in rows) == [("ae", "100")] * 2 + [("rbm", "100")] * 2 + \
        [("rbm", "150")] * 2
    assert [r["all_seconds"] for r in rows if r["workload"] == "ae"] == kept
    text = md.read_text()
    assert text.count("\n## ") == 2 and text.count(", batch 150\n") == 1
    assert text.index(", batch 150\n") > text.index("autoencoder layer | 1 |")  # after batch 100's table


@pytest.mark.parametrize("argv", [["--workloads", "rbm,gan"], ["--threads", "1,x"], ["--repeats", "0"],
                                  ["--rows", "-3"], ["--batch", "0"]])
def test_impossible_options_are_refused(argv, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        block_tax.main(argv + ["--out", str(tmp_path / "t.csv"), "--md", str(tmp_path / "t.md")])
    assert e.value.code == 2 and "error:" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_the_greedy_workload_trains_every_layer_of_the_stack_on_the_rows_below(monkeypatch):
    """One greedy epoch is a CD-1 epoch of each RBM of the stack, in order, on the rows the
    layer below gives (its width, every row), with 8 blocks and with one."""
    import numpy as np
    from aepar.parallel import data_parallel

    calls, real = [], data_parallel.train_epoch

    def recording(layer, shard, epoch):
        calls.append((layer.n_in, layer.n_out, int(shard.x.shape[0]), int(shard.x.shape[1]), shard.blocks.count))
        return real(layer, shard, epoch)
    monkeypatch.setattr(data_parallel, "train_epoch", recording)
    x = np.random.default_rng(0).random((120, 784), dtype=np.float32)
    epochs, flops = block_tax.greedy_epochs(x, 1, torch=False)
    assert set(epochs) == {block_tax.EIGHT, block_tax.ONE}
    layers = list(zip(block_tax.STACK[:-1], block_tax.STACK[1:]))
    assert flops == sum(10.0 * a * b + 12.0 * (a + b) for a, b in layers)
    for name, blocks in ((block_tax.EIGHT, 8), (block_tax.ONE, 1)):
        calls.clear()
        epochs[name]()
        assert calls == [(a, b, 120, a, blocks) for a, b in layers]


def test_a_layer_of_the_stack_alone_trains_that_layer_on_the_rows_below(monkeypatch):
    """Each upper layer's workload (``rbm250x30``, ...) times a CD-1 epoch of that RBM alone,
    on the rows the layers below give, with 8 blocks and with one, and counts its FLOPs only."""
    import numpy as np
    from aepar.parallel import data_parallel

    calls, real = [], data_parallel.train_epoch

    def recording(layer, shard, epoch):
        calls.append((layer.n_in, layer.n_out, int(shard.x.shape[1]), shard.blocks.count, layer.batch))
        return real(layer, shard, epoch)
    monkeypatch.setattr(data_parallel, "train_epoch", recording)
    assert list(block_tax.LAYERS) == ["rbm1000x500", "rbm500x250", "rbm250x30"]
    assert set(block_tax.LAYERS) <= set(block_tax.WORKLOADS) and all(n in block_tax.TITLES for n in block_tax.LAYERS)
    x = np.random.default_rng(0).random((120, 784), dtype=np.float32)
    epochs, flops = block_tax.workload_epochs("rbm250x30", x, 1, torch=False, batch=40)
    assert set(epochs) == {block_tax.EIGHT, block_tax.ONE}
    assert flops == 10.0 * 250 * 30 + 12.0 * (250 + 30)
    for name, blocks in ((block_tax.EIGHT, 8), (block_tax.ONE, 1)):
        calls.clear()
        epochs[name]()
        assert calls == [(250, 30, 250, blocks, 40)]  # at the batch asked for


def test_the_autoencoder_stacks_top_layer_trains_alone_with_identity_code_units(monkeypatch):
    """``ae250x30`` times an epoch of the autoencoder stack's top layer alone (identity code
    units, as --pretrainer ae stacks it), on the rows its sigmoid layers below give, with 8
    blocks and with one."""
    import numpy as np
    from aepar.parallel import data_parallel

    calls, real = [], data_parallel.train_epoch

    def recording(layer, shard, epoch):
        calls.append((layer.kind, layer.code_act, layer.n_in, layer.n_out, shard.blocks.count, layer.batch))
        return real(layer, shard, epoch)
    monkeypatch.setattr(data_parallel, "train_epoch", recording)
    assert list(block_tax.AE_LAYERS) == ["ae250x30"] and "ae250x30" in block_tax.WORKLOADS
    x = np.random.default_rng(0).random((120, 784), dtype=np.float32)
    epochs, flops = block_tax.workload_epochs("ae250x30", x, 1, torch=False, batch=40)
    assert [c[:4] for c in calls[:3]] == [("ae", "sigmoid", 784, 1000), ("ae", "sigmoid", 1000, 500),
                                          ("ae", "sigmoid", 500, 250)]  # the rows below, once
    assert set(epochs) == {block_tax.EIGHT, block_tax.ONE}
    from aepar.models.ae_layer import AELayer
    from aepar import backend
    assert flops == AELayer(backend.select("cpu", "numpy", "float32"), 250, 30).flops_per_sample()
    for name, blocks in ((block_tax.EIGHT, 8), (block_tax.ONE, 1)):
        calls.clear()
        epochs[name]()
        assert calls == [("ae", "identity", 250, 30, blocks, 40)]
