"""CIFAR-10 "python version" batches (https://www.cs.toronto.edu/~kriz/cifar.html).

Each batch is a pickled dict with ``b'data'`` (N, 3072) uint8, rows = the red, green and
blue 32x32 planes in row-major order, and ``b'labels'`` (N integers 0..9). The batches
were pickled by Python 2, so they are read with ``encoding="bytes"``. Only the classes a
numpy array needs may be unpickled: a pickle naming anything else is refused rather than
run, since unpickling arbitrary globals executes code.
"""
from __future__ import annotations

import io
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from aepar.errors import DataError, one_line

__all__ = ["read_cifar10_batch", "load_cifar10", "find_cifar10", "Cifar10", "CLASSES", "BATCHES"]

CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
BATCHES = TRAIN_BATCHES + (TEST_BATCH,)
BATCH_DIR = "cifar-10-batches-py"

# (module, name) a numpy array pickle may reference
_ALLOWED = {
    ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
    ("numpy._core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "scalar"), ("numpy.core.multiarray", "scalar"),
    ("numpy._core.numeric", "_frombuffer"), ("numpy.core.numeric", "_frombuffer"),
}


class _NumpyOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name}")
        # numpy 2 moved numpy.core to numpy._core: map to whichever this numpy has
        numpy2 = not np.__version__.startswith("1.")
        if numpy2 and module.startswith("numpy.core."):
            module = "numpy._core." + module[len("numpy.core."):]
        elif not numpy2 and module.startswith("numpy._core."):
            module = "numpy.core." + module[len("numpy._core."):]
        return super().find_class(module, name)


@dataclass
class Cifar10:
    """CIFAR-10 as stored: uint8 images (N, 3, 32, 32), int64 labels 0..9 (see CLASSES)."""

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    source: str


def read_cifar10_batch(path):
    """Read one CIFAR-10 python batch.

    Parameters
    ----------
    path : str or Path

    Returns
    -------
    images : numpy.ndarray
        uint8, (N, 3, 32, 32) (channel, row, column).
    labels : numpy.ndarray
        int64, (N,), values 0..9.

    Raises
    ------
    DataError
        Missing file, not a pickle, not a dict with data/labels, wrong shapes or labels.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError(path, "missing (no such file)") from None
    except OSError as e:
        raise DataError(path, f"cannot be read ({e.strerror or e})") from None
    try:
        batch = _NumpyOnlyUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except Exception as e:  # pickle raises many types on garbage: all mean "not a batch"
        raise DataError(path, f"not a CIFAR batch (unpickling failed: {one_line(e)})") from None
    if not isinstance(batch, dict):
        raise DataError(path, f"not a CIFAR batch (a pickled {type(batch).__name__}, not a dict)")
    # Python-2 pickles have bytes keys; a batch re-pickled by Python 3 may have str keys
    batch = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in batch.items()}
    if "data" not in batch or "labels" not in batch:
        raise DataError(path, f"not a CIFAR batch (keys {sorted(map(str, batch))}, "
                              "need 'data' and 'labels')")
    data = batch["data"]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 \
            or data.shape[1] != 3 * 32 * 32:
        desc = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise DataError(path, f"not a CIFAR batch (data is {desc}, need uint8 (N, 3072))")
    if data.shape[0] == 0:
        raise DataError(path, "holds no images (data is (0, 3072))")
    return data.reshape(-1, 3, 32, 32), _labels(batch["labels"], data.shape[0], path)


def _labels(raw, n: int, path: Path) -> np.ndarray:
    """``raw`` as int64 labels 0..9, one per image, or DataError."""
    if isinstance(raw, np.ndarray):
        if raw.ndim != 1 or raw.dtype.kind not in "iu":
            raise DataError(path, f"not a CIFAR batch (labels are {raw.dtype} {raw.shape}, need integers)")
    elif isinstance(raw, (list, tuple)):
        # checked one by one: np.asarray on nested or shared lists could build a huge array
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in raw):
            raise DataError(path, "not a CIFAR batch (labels are not all integers)")
    else:
        raise DataError(path, f"not a CIFAR batch (labels are a {type(raw).__name__}, need a list of integers)")
    if len(raw) != n:
        raise DataError(path, f"shape mismatch: {len(raw)} labels for {n} images")
    # compared before converting: a Python integer may not fit in int64
    lo, hi = (int(raw.min()), int(raw.max())) if isinstance(raw, np.ndarray) else (min(raw), max(raw))
    if lo < 0 or hi >= len(CLASSES):
        raise DataError(path, f"labels outside 0..{len(CLASSES) - 1} (min {lo}, max {hi})")
    return np.asarray(raw, dtype=np.int64)


def find_cifar10(directory) -> Path | None:
    """The directory holding CIFAR-10 batches: ``directory`` itself or the
    ``cifar-10-batches-py`` directory inside it (the official tarball unpacks to it).

    Returns
    -------
    Path or None
        None when neither holds any of ``data_batch_1`` .. ``data_batch_5``, ``test_batch``.
    """
    directory = Path(directory)
    for d in (directory, directory / BATCH_DIR):
        if any((d / name).is_file() for name in BATCHES):
            return d
    return None


def load_cifar10(directory) -> Cifar10:
    """Load the five training batches and the test batch of CIFAR-10.

    Parameters
    ----------
    directory : str or Path
        Holds ``data_batch_1`` .. ``data_batch_5`` and ``test_batch``, or holds the
        ``cifar-10-batches-py`` directory the official tarball unpacks to.

    Returns
    -------
    Cifar10
        50,000 training and 10,000 test images for the official files.

    Raises
    ------
    DataError
        A batch missing (all six are needed) or malformed.
    """
    d = find_cifar10(directory) or Path(directory)
    parts = [read_cifar10_batch(d / name) for name in TRAIN_BATCHES]
    test_x, test_y = read_cifar10_batch(d / TEST_BATCH)
    train_x = np.concatenate([p[0] for p in parts])
    train_y = np.concatenate([p[1] for p in parts])
    return Cifar10(train_x, train_y, test_x, test_y,
                   f"cifar10: {len(train_y)} train / {len(test_y)} test from {d}")
