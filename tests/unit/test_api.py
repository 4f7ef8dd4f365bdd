"""The Python API: the same engine and bits as the command, the example of its docstring
runs, a saved network loads back, bad arrays are one line, and several ranks share the work."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest

import aepar.api as ae
from aepar.data.sources import load_digits
from aepar.errors import UserError
from tests.conftest import ROOT, run_mpi

OPTIONS = ["--layers", "784-32-8", "--epochs", "2", "--finetune-epochs", "1", "--batch", "50"]


def _weights(path) -> dict:
    out = {}
    with h5py.File(path) as f:
        f.visititems(lambda k, v: out.__setitem__(k, v[()]) if isinstance(v, h5py.Dataset) else None)
    return out


def _same(a, b):
    a, b = _weights(a), _weights(b)
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_the_api_trains_the_same_bits_as_the_command(tmp_path):
    d = load_digits("mnist5k", None, 0, 500, dtype=np.float32)
    model = ae.pretrain(d.train_x, d.train_y, test=(d.test_x, d.test_y), layers="784-32-8", epochs=2,
                        finetune_epochs=1, batch=50, out=tmp_path / "api")
    r = subprocess.run([sys.executable, "-m", "aepar.pretrain", "--scheme", "greedy", "--dataset", "mnist5k",
                        "--limit", "500", *OPTIONS, "--quiet", "--out", str(tmp_path / "cli")],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert _same(tmp_path / "api" / "weights.h5", tmp_path / "cli" / "weights.h5")
    assert model.summary["scheme"] == "greedy" and model.encode(d.test_x).shape == (len(d.test_x), 8)


def test_the_docstring_example_runs_and_a_saved_network_loads_back(tmp_path, monkeypatch):
    example = textwrap.dedent(re.search(r"\n\n((?: {4}.*\n|\n)+)", ae.__doc__).group(1))  # the indented block
    monkeypatch.chdir(tmp_path)  # its run directory goes under runs/
    scope = {}
    exec(example.replace("epochs=5", "epochs=1").replace("(2000, 100)", "(400, 100)"), scope)
    model, again, x = scope["model"], scope["again"], scope["x"]
    assert scope["codes"].shape == (400, 10) and np.array_equal(again.encode(x), model.encode(x))
    saved = model.save(tmp_path / "saved.h5")
    back = ae.Autoencoder.load(saved)
    assert np.array_equal(back.reconstruct(x), model.reconstruct(x)) and back.sizes == [100, 50, 10]


@pytest.mark.parametrize("x, y, message", [
    (np.full((10, 4), np.nan), None, "finite"),
    (np.full((10, 4), 2.0), None, "[0, 1]"),
    (np.zeros(10), None, "2-D"),
    (np.zeros((10, 4)), np.zeros(9), "9 labels for 10 rows"),
])
def test_bad_arrays_are_one_line(x, y, message):
    with pytest.raises(UserError) as err:
        ae.pretrain(x, y, layers="4-2", epochs=1)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_layers_as_a_list_train_what_the_string_does(tmp_path):
    x = np.random.default_rng(3).random((240, 12))
    as_list = ae.pretrain(x, layers=[12, np.int64(6), 3], epochs=1, finetune_epochs=0, batch=40, out=tmp_path / "a")
    ae.pretrain(x, layers="12-6-3", epochs=1, finetune_epochs=0, batch=40, out=tmp_path / "b")
    assert as_list.sizes == [12, 6, 3] and _same(tmp_path / "a" / "weights.h5", tmp_path / "b" / "weights.h5")
    for bad in ([12, 6.5, 3], [], [12, "6", 3], 7):
        with pytest.raises(UserError, match="give the sizes as integers") as err:
            ae.pretrain(x, layers=bad, epochs=1)
        assert "\n" not in str(err.value)


SCRIPT = """
import sys, numpy as np, aepar.api as ae
x = np.random.default_rng(1).random((512, 20))
ae.pretrain(x, layers="20-8-4", epochs=2, finetune_epochs=1, batch=32, dtype="float64", out=sys.argv[1])
photos = np.random.default_rng(2).integers(0, 256, (4, 32, 32), dtype=np.uint8)
ae.sparse_autoencoder(photos, hidden=9, samples=512, iterations=10, out=sys.argv[1] + "-sparse")
"""


@pytest.mark.mpi
def test_under_mpirun_the_ranks_share_the_work_with_the_same_bits(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    one = subprocess.run([sys.executable, str(script), str(tmp_path / "np1")], capture_output=True, text=True,
                         timeout=600, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert one.returncode == 0, one.stderr
    two = run_mpi(2, [str(script), tmp_path / "np2"], timeout=600, env={"PYTHONPATH": str(ROOT)})
    assert two.returncode == 0, two.stderr
    assert _same(tmp_path / "np1" / "weights.h5", tmp_path / "np2" / "weights.h5")
    assert _same(tmp_path / "np1-sparse" / "weights.h5", tmp_path / "np2-sparse" / "weights.h5")


def _cli(program, args):
    r = subprocess.run([sys.executable, "-m", program, *map(str, args), "--quiet"], capture_output=True, text=True,
                       timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]


def test_the_sparse_autoencoder_on_your_images_is_the_command_on_their_file(tmp_path):
    photos = np.random.default_rng(3).integers(0, 256, (5, 36, 40, 3), dtype=np.uint8)  # colour, not square
    model = ae.sparse_autoencoder(photos, hidden=9, samples=640, iterations=15, out=tmp_path / "api")
    np.save(tmp_path / "photos.npy", photos)
    _cli("aepar.sparse", ["--data", tmp_path / "photos.npy", "--hidden", 9, "--limit", 640, "--iterations", 15,
                          "--out", tmp_path / "cli"])
    assert _same(tmp_path / "api" / "weights.h5", tmp_path / "cli" / "weights.h5")
    patches = np.random.default_rng(4).random((7, 64))
    assert model.encode(patches).shape == (7, 9) and model.reconstruct(patches).shape == (7, 64)
    back = ae.SparseAutoencoder.load(model.save(tmp_path / "saved.h5"))
    assert np.array_equal(back.encode(patches), model.encode(patches)) and model.summary["iterations"] == 15


def test_eager_on_your_labelled_images_is_the_command_on_their_files(tmp_path):
    rng = np.random.default_rng(5)
    x, y = rng.integers(0, 256, (48, 16, 16, 3), dtype=np.uint8), np.repeat(["ant", "bee", "cat", "dog"], 12)
    xt, yt = rng.integers(0, 256, (12, 16, 16, 3), dtype=np.uint8), np.repeat(["ant", "bee", "cat", "dog"], 3)
    opts = dict(models=2, epochs=1, filters="2,4", mono_epochs=0, classify_epochs=1, batch=8, classify_batch=8,
                reduce_blocks=2, no_plot=True)
    run = ae.eager(x, y, test=(xt, yt), out=tmp_path / "api", **opts)
    np.savez(tmp_path / "train.npz", x=x, y=y)
    np.savez(tmp_path / "test.npz", x=xt, y=yt)
    _cli("aepar.eager", ["--data", tmp_path / "train.npz", "--test-data", tmp_path / "test.npz", *ae._argv(opts),
                         "--out", tmp_path / "cli"])
    for name in ("model0_epoch001.h5", "model1_epoch001.h5"):
        assert _same(tmp_path / "api" / name, tmp_path / "cli" / name)
    cli = json.loads((tmp_path / "cli" / "summary.json").read_text())["final"]
    assert run.accuracy == {k: cli[k]["test"] for k in ("combined", "vote")}  # the labels mapped alike
    assert run.summary["n_test"] == 12 and (run.path / "accuracy.md").exists()
