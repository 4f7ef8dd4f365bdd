"""bench.stacked's Santara table over seeds: a row per seed and scheme, the mean ± half the
range, the verdict on the mean; --reuse reads only a finished run whose options resolve as today's."""
import json

import pytest

import bench.stacked as stacked
from aepar.rundir import started_options
from aepar.sync import parse_args

MACHINE = {"hostname": "h", "cores": 2, "cpu_model": "Some CPU", "isa": "avx2", "blas": "b"}


def _summary(test_greedy, test_sync, pca=10.0):
    def errors(test):
        return {"finetuned": {"train": test - 0.5, "test": test}, "pretrained": {"test": 13.0}}
    return {"source": "data", "pca": {"test": pca}, "machine": MACHINE, "ranks": 2, "pretrain_time_s": 1.0,
            "finetune_time_s": 1.0, "error": errors(test_sync), "test_error_vs_greedy": test_sync / test_greedy,
            "finetune": {"optimizer": "adam", "lr": 0.004, "n_epochs": 10, "loss": "xent"}, "extra": [0, 10, 40, 80],
            "greedy": {"ranks": 1, "pretrain_time_s": 1.0, "finetune_time_s": 1.0, "error": errors(test_greedy)}}


def _finished(runs, seed, summary, argv_seed=None, state="complete", **changed):
    """A run directory as aepar.sync leaves it: run.json's started_options resolved from its
    argv (``changed``: options that differ, as from a preset of another release)."""
    d = runs / f"full_quality_seed{seed}"
    d.mkdir(parents=True)
    argv = ["--out", str(d), "--preset", "full"] + ([] if argv_seed is None else ["--seed", str(argv_seed)])
    options = started_options(parse_args(argv)) | changed
    (d / "run.json").write_text(json.dumps({"state": state, "argv": argv, "started_options": options,
                                            "started": "2026-11-29T01:00:00"}))
    (d / "summary.json").write_text(json.dumps(summary))


@pytest.fixture
def ran(monkeypatch):
    calls = []

    def run_sync(np_, out, args, log):
        calls.append(args)
        raise AssertionError(f"ran {args}")
    monkeypatch.setattr(stacked, "run_sync", run_sync)
    return calls


def test_mean_and_half_range_over_the_seeds_decide_the_verdict(tmp_path, ran):
    _finished(tmp_path, 0, _summary(4.4, 4.6))  # seed 0 written without --seed: the default
    _finished(tmp_path, 1, _summary(4.6, 4.4), argv_seed=1)
    rows, md = stacked.quality("full", stacked.CONFIGS["full"], tmp_path, [0, 1], True, "")
    assert not ran
    assert [(r["seed"], r["scheme"], r["vs_pca"]) for r in rows] == [
        (0, "greedy", pytest.approx(0.44)), (0, "sync", pytest.approx(0.46)),
        (1, "greedy", pytest.approx(0.46)), (1, "sync", pytest.approx(0.44))]
    assert all(r["cpu_model"] == "Some CPU" and r["day"] == "2026-11-29" for r in rows)
    text = "\n".join(md)
    assert "| mean | greedy | 4.000 ± 0.100 | 4.500 ± 0.100 |" in text
    assert "greedy 0.450 ± 0.010 (met); sync 0.450 ± 0.010 (met)" in text
    assert "--seeds 0,1`" in text and "--reuse" not in text
    assert "Sync's extra epochs up to 0,10,40,80 per layer. Fine-tuning adam lr 0.004 / xent, 10 epochs. " \
           "Runs of" in text


def test_reuse_takes_only_a_finished_run_of_the_same_seed(tmp_path, ran):
    _finished(tmp_path, 1, _summary(5.0, 5.0), argv_seed=2)  # another seed's run in this directory
    with pytest.raises(AssertionError, match="ran"):
        stacked.quality("full", stacked.CONFIGS["full"], tmp_path, [1], True, "")
    assert ran == [["--preset", "full", "--seed", "1"]]
    _finished(tmp_path, 3, _summary(5.0, 5.0), argv_seed=3, state="stopped")
    with pytest.raises(AssertionError, match="ran"):
        stacked.quality("full", stacked.CONFIGS["full"], tmp_path, [3], True, "")
    _finished(tmp_path, 4, _summary(5.0, 6.0), argv_seed=4)
    with pytest.raises(AssertionError, match="ran"):  # without --reuse every seed runs
        stacked.quality("full", stacked.CONFIGS["full"], tmp_path, [4], False, "")
    rows, md = stacked.quality("full", stacked.CONFIGS["full"], tmp_path, [4], True, "")
    assert rows[1]["vs_greedy"] == pytest.approx(1.2) and "Sync within 5% of greedy on every seed: no" in md[-3]


def test_reuse_reruns_a_run_whose_preset_resolved_otherwise(tmp_path, ran):
    """The same --preset and --seed in argv, but the preset gave other values then."""
    _finished(tmp_path, 0, _summary(5.0, 5.0), final_momentum=0.5)
    with pytest.raises(AssertionError, match="ran"):
        stacked.quality("full", stacked.CONFIGS["full"], tmp_path, [0], True, "")
    _finished(tmp_path, 1, _summary(5.0, 5.0), argv_seed=1, quiet=False, timeout=60)  # run controls only
    rows, _ = stacked.quality("full", stacked.CONFIGS["full"], tmp_path, [1], True, "")
    assert len(rows) == 2


@pytest.mark.parametrize("text", ["0,0", "-1", "x", ""])
def test_bad_seeds_are_refused(text):
    assert stacked.parse_seeds(text) is None
    assert stacked.parse_seeds("2,0,1") == [2, 0, 1]
