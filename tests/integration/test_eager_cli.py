"""``python -m aepar.eager`` end to end on the embedded real digits: the same per-model
weights on any number of ranks and any grouping, resume after a stop signal, impossible
options and data that end every rank with one line and leave nothing behind."""
import json
import pickle

import numpy as np
import pytest

from aepar import checkpoint
from aepar.data.idx import write_idx
from tests.integration.test_reliability import cli
from tests.integration.run_json import assert_run_json
from tests.integration.test_outputs import assert_describes_itself

PROG = "aepar.eager"
TINY = ["--dataset", "mnist5k", "--limit", "300", "--filters", "2,4", "--epochs", "2", "--mono-epochs", "0",
        "--classify-epochs", "1", "--reduce-blocks", "4", "--no-plot", "--quiet"]


def run(tmp_path, name, np_=1, extra=(), env=None, expect=0):
    out = tmp_path / name
    r = cli(PROG, [*TINY, *extra, "--out", out], np_=np_, env=env)
    assert r.returncode == expect, r.stdout[-3000:] + r.stderr[-3000:]
    return out


def snapshots(run_dir) -> dict:
    return {p.name: checkpoint.load(p).params for p in sorted(run_dir.glob("*_epoch*.h5"))}


def assert_same_snapshots(a_dir, b_dir, names=None):
    a, b = snapshots(a_dir), snapshots(b_dir)
    names = sorted(b) if names is None else names
    assert names and set(names) <= set(a) and set(names) <= set(b), (sorted(a), sorted(b))
    differ = [(n, k) for n in names for k in a[n] if not np.array_equal(a[n][k], b[n][k])]
    assert not differ, differ


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Four models trained by one process: the weights every layout must reproduce."""
    return run(tmp_path_factory.mktemp("eager"), "one", 1, ["--models", "4"])


@pytest.mark.parametrize("np_, models, groups", [
    (2, 4, None),   # two models per rank, in turn
    (4, 4, None),   # one model per rank
    (4, 2, None),   # K < P: two groups of two ranks, each model data-parallel
    (4, 3, None),   # groups of 2, 1 and 1 ranks
])
def test_same_per_model_weights_on_any_layout(tmp_path, reference, np_, models, groups):
    extra = ["--models", models] + (["--rank-groups", groups] if groups else [])
    out = run(tmp_path, "p", np_, extra)
    names = [f"model{m}_epoch{e:03d}.h5" for m in range(models) for e in (1, 2)]
    assert_same_snapshots(reference, out, names)
    s = json.loads((out / "summary.json").read_text())
    assert s["groups"] == (groups or min(models, np_)) and sum(s["ranks_per_group"]) == np_
    if models == 4:  # the evaluation too (its encoding shared by the ranks): the same accuracies
        one = json.loads((reference / "summary.json").read_text())["final"]
        for part in ("validation", "test"):
            assert s["final"]["combined"][part] == one["combined"][part]
            assert s["final"]["vote"][part] == one["vote"][part]


def test_outputs_table_csv_pngs_and_monolithic(tmp_path):
    out = run(tmp_path, "full", 2, ["--models", "2", "--mono-epochs", "2", "--mono-width", "2", "--plot", "--curve"])
    for name in ("summary.json", "accuracy.md", "epochs.csv", "losses.png", "reconstructions.png", "curve.csv",
                 "curve.png", "mono_epoch002.h5", "metrics.png"):
        assert (out / name).is_file(), name
    assert {r["phase"] for r in assert_describes_itself(out, None)} == {"pretrain"}
    s = json.loads((out / "summary.json").read_text())
    final = s["final"]
    assert 0.0 <= final["combined"]["validation"] <= 1.0 and "vote" in final and "mono" in final
    assert_run_json(out, 2, models=2, mono_epochs=2)
    assert s["mono_filters"] == [4, 8]
    assert final["effective_s"] >= final["train_s"] > 0
    assert len(s["curve"]) == 2 and s["curve"][1]["epoch"] == 2
    rows = (out / "epochs.csv").read_text().splitlines()
    assert rows[0].startswith("model,kind,epoch") and len(rows) == 1 + 2 * 2 + 2
    assert "monolithic CAE" in (out / "accuracy.md").read_text()


def test_pick_epoch_and_eager_rule(tmp_path):
    out = run(tmp_path, "pick", 1, ["--models", "2", "--epochs", "3", "--pick-epoch", "1",
                                    "--eager-rule", "1:0.99"])
    s = json.loads((out / "summary.json").read_text())
    # the rule (99% better every epoch) stops every model after its second epoch
    assert all(len(r["epochs"]) == 2 and r["stopped"].startswith("eager rule") for r in s["records"].values())
    assert s["final"]["picked_epochs"] == {"model0": 1, "model1": 1}


def test_interrupted_run_resumes_to_the_same_weights(tmp_path):
    np_, extra = 2, ["--models", "3", "--mono-epochs", "2"]
    whole = run(tmp_path, "whole", np_, extra)
    # rank 0's third step: inside the first epoch; the round ends, saves and exits 75
    part = run(tmp_path, "part", np_, extra, env={"AEPAR_FAULT": "0:3:sigterm"}, expect=75)
    assert (part / "checkpoint.h5").is_file()
    r = cli(PROG, ["--resume", part], np_=np_)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert_same_snapshots(whole, part)
    assert not (part / "checkpoint.h5").exists()


def _idx_dir(path, side):
    path.mkdir()
    rng = np.random.default_rng(0)
    for part, n in (("train", 40), ("t10k", 10)):
        write_idx(path / f"{part}-images-idx3-ubyte", rng.integers(0, 255, (n, side, side), dtype=np.uint8))
        write_idx(path / f"{part}-labels-idx1-ubyte", rng.integers(0, 10, n, dtype=np.uint8))
    return path


def _bad_cifar(path):
    path.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(path / name, "wb") as f:
            pickle.dump({b"data": np.zeros((10, 3 * 30 * 30), np.uint8), b"labels": [0] * 10}, f)
    return path


@pytest.mark.parametrize("np_, args, fragment", [
    (1, ["--models", "0"], "--models: invalid positive integer"),
    (2, ["--pick-epoch", "5"], "beyond the 2 epochs"),
    (2, ["--models", "3", "--rank-groups", "3"], "more than the 2 ranks"),
    (1, ["--models", "2", "--rank-groups", "3"], "more than the 2 models"),
    (1, ["--eager-rule", "0:0.1"], "--eager-rule wants K:DELTA"),
    (2, ["--reduce-blocks", "1"], "cannot be shared by 2 ranks"),
    (2, ["IDX30"], "shape mismatch"),  # the IDX reader takes 28x28 only; the CAE refuses sides not multiples of 4
    (2, ["CIFAR"], "not a CIFAR batch"),
])
def test_impossible_options_and_data_end_every_rank_with_one_line(tmp_path, np_, args, fragment):
    if args == ["IDX30"]:
        args = ["--dataset", "idx", "--data-dir", _idx_dir(tmp_path / "d", 30)]
    elif args == ["CIFAR"]:
        args = ["--dataset", "cifar10", "--data-dir", _bad_cifar(tmp_path / "c")]
    r = cli(PROG, [*TINY, *args, "--out", tmp_path / "x"], np_=np_)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    lines = [line for line in r.stderr.splitlines() if line.startswith(f"{PROG}: error:")]
    assert len(lines) == 1 and fragment in lines[0], r.stderr
    assert not (tmp_path / "x").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".x")]


def test_help_explains_the_scheme():
    r = cli(PROG, ["--help"])
    assert r.returncode == 0
    for word in ("--models", "--eager-rule", "--pick-by-budget", "--mono-width", "--preset", "monolithic"):
        assert word in r.stdout


@pytest.mark.parametrize("fault, code, fragment", [
    ("1:3:raise", 1, "fault injected"),   # an exception on one rank ends the job
    ("1:13:nan", 3, "diverged"),           # a NaN gradient in epoch 2: every rank ends at the round end
])
def test_faults_on_one_rank_end_the_job(tmp_path, fault, code, fragment):
    r = cli(PROG, [*TINY, "--models", "2", "--out", tmp_path / "f"], np_=2, env={"AEPAR_FAULT": fault})
    assert r.returncode == code, r.stdout[-2000:] + r.stderr[-2000:]
    assert fragment in r.stderr
    assert not list(tmp_path.iterdir())  # no checkpoint yet: nothing left behind, staging included
