"""MNIST-format IDX files (http://yann.lecun.com/exdb/mnist/), raw or gzip-compressed.

Layout: two zero bytes, a type code, the number of dimensions, one big-endian uint32 per
dimension, then the values in C order, big-endian. Compression is recognised by the gzip
magic bytes (1f 8b), not by the file name, so a renamed file still reads.
"""
from __future__ import annotations

import gzip
import math
import os
import tempfile
import zlib
from pathlib import Path

import numpy as np

from aepar.errors import DataError

__all__ = ["read_idx", "write_idx", "read_idx_pair", "check_idx_pair"]

# IDX type code -> big-endian dtype
_CODES = {0x08: np.dtype(">u1"), 0x09: np.dtype(">i1"), 0x0B: np.dtype(">i2"),
          0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}
_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 20  # bytes per read: a header that lies about the size allocates nothing


def _open(path: Path):
    """The file as a binary stream, decompressing when it starts with the gzip magic;
    also says whether it is gzip."""
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        raise DataError(path, "missing (no such file)") from None
    except IsADirectoryError:
        raise DataError(path, "is a directory, not an IDX file") from None
    except OSError as e:
        raise DataError(path, f"cannot be read ({e.strerror or e})") from None
    gz = fh.read(2) == _GZIP_MAGIC
    fh.seek(0)
    return (gzip.GzipFile(fileobj=fh, mode="rb") if gz else fh), fh, gz


def _read_upto(stream, n: int, path: Path, gz: bool) -> bytes:
    """Up to ``n`` bytes (fewer at the end of the data): a gzip stream in chunks, since
    only reading tells how long it is; a raw file, whose size was checked, at once."""
    parts, left = [], n
    try:
        while left > 0:
            chunk = stream.read(min(left, _CHUNK) if gz else left)
            if not chunk:
                break
            parts.append(chunk)
            left -= len(chunk)
    except (EOFError, OSError, zlib.error) as e:
        if gz:
            raise DataError(path, f"corrupt or truncated gzip stream ({e})") from None
        raise DataError(path, f"cannot be read ({e.strerror or e})") from None
    return b"".join(parts)


def read_idx(path) -> np.ndarray:
    """Read an IDX file (raw or gzip) into an array of native byte order.

    The size the header declares is checked against the file before the data is read,
    so a corrupt header cannot make the reader allocate more than the file holds.

    Parameters
    ----------
    path : str or Path
        The file, e.g. ``train-images-idx3-ubyte`` or ``train-images-idx3-ubyte.gz``.

    Returns
    -------
    numpy.ndarray
        Shape given by the header; dtype uint8, int8, int16, int32, float32 or float64.

    Raises
    ------
    DataError
        Missing file, wrong magic number, unknown type code, no values (a zero dimension),
        truncated data or gzip stream, or trailing bytes.
    """
    path = Path(path)
    stream, fh, gz = _open(path)
    with fh, stream:
        head = _read_upto(stream, 4, path, gz)
        if len(head) < 4:
            raise DataError(path, f"truncated: {len(head)} bytes, an IDX header needs at least 4")
        if head[0] != 0 or head[1] != 0:
            raise DataError(path, f"wrong magic number 0x{head.hex()} (IDX files start with 00 00)")
        code, ndim = head[2], head[3]
        if code not in _CODES:
            raise DataError(path, f"wrong magic number 0x{head.hex()}: unknown IDX type code 0x{code:02x}")
        if ndim == 0:
            raise DataError(path, "wrong magic number: IDX header declares 0 dimensions")
        header = 4 + 4 * ndim
        raw_dims = _read_upto(stream, 4 * ndim, path, gz)
        if len(raw_dims) < 4 * ndim:
            raise DataError(path, f"truncated header: {4 + len(raw_dims)} bytes, {header} needed "
                                  f"for {ndim} dimensions")
        dims = tuple(int(d) for d in np.frombuffer(raw_dims, dtype=">u4"))
        dtype = _CODES[code]
        # Python integers: the product of 255 dimensions of up to 2^32 - 1 does not overflow
        expected = math.prod(dims) * dtype.itemsize
        if expected == 0:
            raise DataError(path, f"holds no values: the header declares dimensions {dims}")
        if not gz:  # the size is known before reading: refuse a lying header at once
            got = os.fstat(fh.fileno()).st_size - header
            if got < expected:
                raise DataError(path, f"truncated: {got} data bytes, header {dims} needs {expected}")
            if got > expected:
                raise DataError(path, f"{got - expected} trailing bytes after the {dims} {dtype.name} data")
        body = _read_upto(stream, expected + 1, path, gz)
    if len(body) < expected:
        raise DataError(path, f"truncated: {len(body)} data bytes, header {dims} needs {expected}")
    if len(body) > expected:
        raise DataError(path, f"trailing bytes after the {dims} {dtype.name} data")
    data = np.frombuffer(body, dtype=dtype).reshape(dims)
    return data.astype(dtype.newbyteorder("="))


def write_idx(path, array) -> Path:
    """Write ``array`` as an IDX file; gzip-compressed when ``path`` ends in ``.gz``.

    The file is written to a temporary sibling and renamed into place, so a failure never
    leaves a partial file.

    Parameters
    ----------
    path : str or Path
    array : array_like
        Any shape with 1 to 255 dimensions, dtype one of uint8, int8, int16, int32,
        float32, float64.

    Returns
    -------
    Path
    """
    path = Path(path)
    a = np.asarray(array)
    codes = {dt.newbyteorder("="): code for code, dt in _CODES.items()}
    native = a.dtype.newbyteorder("=")
    if native not in codes:
        raise DataError(path, f"dtype {a.dtype} cannot be stored in IDX "
                              "(uint8, int8, int16, int32, float32, float64)")
    if not 1 <= a.ndim <= 255:
        raise DataError(path, f"{a.ndim} dimensions cannot be stored in IDX (1..255)")
    code = codes[native]
    payload = (bytes([0, 0, code, a.ndim]) + np.asarray(a.shape, dtype=">u4").tobytes()
               + np.ascontiguousarray(a, dtype=_CODES[code]).tobytes())
    if path.suffix == ".gz":
        payload = gzip.compress(payload, mtime=0)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def read_idx_pair(images_path, labels_path, classes: int | None = 10):
    """Read an images file and its labels file and check they agree.

    Parameters
    ----------
    images_path, labels_path : str or Path
    classes : int or None
        Labels must lie in ``0 .. classes - 1`` (MNIST and Fashion-MNIST: 10); None
        checks only that they are integers.

    Returns
    -------
    images : numpy.ndarray
        (N, ...) as stored.
    labels : numpy.ndarray
        (N,) int64.

    Raises
    ------
    DataError
        Either file unreadable, labels not 1-D integers or out of range, or N differs
        between the two.
    """
    return check_idx_pair(read_idx(images_path), read_idx(labels_path), images_path, labels_path,
                          classes)


def check_idx_pair(images, labels, images_path, labels_path, classes: int | None = 10):
    """Check that ``labels`` are 1-D integers in ``0 .. classes - 1``, one per image;
    return (images, int64 labels)."""
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        raise DataError(labels_path, f"labels must be 1-D integers, got {labels.dtype} {labels.shape}")
    if images.shape[0] != labels.shape[0]:
        raise DataError(labels_path, f"shape mismatch: {labels.shape[0]} labels but {images_path} "
                                     f"holds {images.shape[0]} images")
    labels = labels.astype(np.int64)
    if classes is not None and labels.size and (labels.min() < 0 or labels.max() >= classes):
        raise DataError(labels_path, f"labels outside 0..{classes - 1} "
                                     f"(min {labels.min()}, max {labels.max()})")
    return images, labels
