"""Training on the user's own files (``--data PATH``) end to end: an .npy of rows through
the stacked pre-training, a folder of colour PNGs (labels from sub-folders) through the
eager CAEs, and the same weights on 2 ranks, each reading only its rows, as on 1."""
import numpy as np

from tests.integration.test_reliability import assert_same_bits, cli


def _rows(tmp_path, n=120, width=100):
    path = tmp_path / "x.npy"
    np.save(path, np.random.default_rng(0).random((n, width)).astype(np.float32))
    return path


def test_npy_rows_train_the_stacked_pretraining(tmp_path):
    path = _rows(tmp_path)
    out = tmp_path / "run"
    r = cli("aepar.pretrain", ["--scheme", "greedy", "--layers", "100-50-10", "--data", path, "--epochs", "1",
                               "--finetune-epochs", "1", "--batch", "24", "--out", out])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"file {path}: X (120, 100) float32" in r.stdout and "96 train / 24 test rows of 100" in r.stdout
    assert (out / "weights.h5").exists()
    bad = cli("aepar.pretrain", ["--scheme", "greedy", "--data", path, "--dataset", "mnist5k",
                                 "--out", tmp_path / "bad"])
    assert bad.returncode == 2 and "--data and --dataset" in bad.stderr and not (tmp_path / "bad").exists()
    wide = cli("aepar.pretrain", ["--scheme", "greedy", "--layers", "784-10", "--data", path,
                                  "--out", tmp_path / "wide"])
    assert wide.returncode == 2 and "the data has 100 inputs" in wide.stderr


def test_png_folder_trains_eager_with_labels_from_subfolders(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(1)
    classes = [f"c{k:02d}" for k in range(12)]  # more than the digits' ten: the classifiers get 12 outputs
    for c in classes:
        (tmp_path / "imgs" / c).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(tmp_path / "imgs" / c / f"{i}.png")
    out = tmp_path / "eager"
    r = cli("aepar.eager", ["--data", tmp_path / "imgs", "--preset", "quick", "--models", "2", "--filters", "2,4",
                            "--epochs", "1", "--mono-epochs", "0", "--classify-epochs", "1", "--batch", "8",
                            "--classify-batch", "8", "--reduce-blocks", "2", "--no-plot", "--out", out])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "36 colour images 32x32" in r.stdout and "12 classes (c00, c01" in r.stdout
    assert "of 3x32x32" in r.stdout and (out / "summary.json").exists()


def test_two_ranks_read_their_rows_and_train_the_same_weights(tmp_path):
    """Greedy is data-parallel over fixed blocks: each rank takes (and reads) its blocks of
    the .npy and the weights are the same bits as on one rank."""
    path = _rows(tmp_path, n=160)
    args = ["--scheme", "greedy", "--layers", "100-20", "--data", path, "--epochs", "1", "--finetune-epochs", "0",
            "--batch", "16", "--dtype", "float64", "--reduce-blocks", "4", "--quiet"]
    one, two = tmp_path / "one", tmp_path / "two"
    r1 = cli("aepar.pretrain", [*args, "--out", one])
    r2 = cli("aepar.pretrain", [*args, "--out", two], np_=2)
    assert r1.returncode == 0 and r2.returncode == 0, r1.stderr[-2000:] + r2.stdout[-2000:] + r2.stderr[-2000:]
    assert_same_bits(one, two)


def test_unlabelled_rows_train_the_pipeline_schemes(tmp_path):
    """sync holds out a validation part of the rows: stratified by label where there are
    labels, a plain random part where there are none."""
    path = _rows(tmp_path)
    r = cli("aepar.pretrain", ["--scheme", "sync", "--layers", "100-20-8", "--data", path, "--epochs", "1",
                               "--finetune-epochs", "0", "--batch", "24", "--out", tmp_path / "sync"], np_=2)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "no labels" in r.stdout and "held out for validation" in r.stdout
