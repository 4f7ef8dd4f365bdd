"""The whitened natural images of Olshausen & Field as UFLDL ships them: IMAGES.mat.

The file holds one variable ``IMAGES`` of shape (512, 512, 10) (rows, columns, image).
MATLAB v5-v7.2 files (UFLDL's, and what ``scipy.io.savemat`` writes) are read here, by
the few elements of the MAT-file format a numeric array needs (MathWorks, "MAT-File
Format"): importing scipy.io, which imports scipy.sparse, was a sizeable part of
``python -m aepar.sparse``'s start-up. v7.3 files are HDF5 and are read with h5py
(MATLAB stores them column-major, so the axes come back reversed). v4 files hold 2-D
matrices only, so they never hold an image stack.
"""
from __future__ import annotations

import math
import struct
import zlib
from pathlib import Path

import numpy as np

from aepar.errors import DataError, one_line

__all__ = ["read_images_mat", "VARIABLE"]

VARIABLE = "IMAGES"

# the MAT v5 data types a numeric array's values may be stored in, and the compressed
# and matrix elements that hold the variables
_MI_DTYPES = {1: "i1", 2: "u1", 3: "i2", 4: "u2", 5: "i4", 6: "u4", 7: "f4", 9: "f8", 12: "i8", 13: "u8"}
_MI_INT8, _MI_UINT32, _MI_INT32, _MI_MATRIX, _MI_COMPRESSED = 1, 6, 5, 14, 15
# array classes that are not real numbers (6-15 are the numeric ones)
_NOT_NUMBERS = {1: "a cell array", 2: "a struct", 3: "an object", 4: "text", 5: "a sparse matrix",
                16: "a function handle", 17: "an opaque object"}
_COMPLEX, _NUMERIC = 0x0800, range(6, 16)


class _Malformed(ValueError):
    """The bytes are not the MAT v5 format (said as 'not a MAT file (...)')."""


def _element(buf, pos: int, order: str):
    """(type, data, next position) of the data element at ``pos``: its 8-byte tag, or the
    4-byte small form (type and size in one word, up to 4 bytes of data)."""
    if pos + 8 > len(buf):
        raise _Malformed("an element's tag is cut off")
    word, nbytes = struct.unpack_from(order + "II", buf, pos)
    if word >> 16:  # the small data element format
        nbytes, kind = word >> 16, word & 0xFFFF
        if nbytes > 4:
            raise _Malformed(f"a small element says {nbytes} bytes")
        return kind, buf[pos + 4:pos + 4 + nbytes], pos + 8
    end = pos + 8 + nbytes
    if end > len(buf):
        raise _Malformed(f"an element says {nbytes} bytes, past its end")
    # elements start 8-byte aligned, but for compressed ones, which are not padded
    return word, buf[pos + 8:end], end if word == _MI_COMPRESSED else pos + 8 + (nbytes + 7) // 8 * 8


def _matrix_header(buf, order: str):
    """(class, flags, dims, name, position of the values) of a miMATRIX element's data."""
    kind, flags, pos = _element(buf, 0, order)
    if kind != _MI_UINT32 or len(flags) < 8:
        raise _Malformed("a matrix without its array flags")
    word = struct.unpack_from(order + "I", flags)[0]
    kind, dims, pos = _element(buf, pos, order)
    if kind != _MI_INT32 or len(dims) % 4 or len(dims) < 8:
        raise _Malformed("a matrix without its dimensions")
    dims = struct.unpack(order + f"{len(dims) // 4}i", dims)
    kind, name, pos = _element(buf, pos, order)
    if kind != _MI_INT8:
        raise _Malformed("a matrix without its name")
    return word & 0xFF, word, dims, bytes(name).decode("latin-1"), pos


def _values(path: Path, variable: str, cls: int, flags: int, dims, buf, pos: int, order: str):
    """The variable's values as an array of ``dims`` (column-major in the file)."""
    if cls not in _NUMERIC:
        raise DataError(path, f"{variable} is {_NOT_NUMBERS.get(cls, f'of MATLAB class {cls}')}, need real numbers")
    if flags & _COMPLEX:
        raise DataError(path, f"{variable} is complex, need real numbers")
    if any(d < 0 for d in dims):
        raise _Malformed(f"{variable} has negative dimensions {dims}")
    kind, data, _ = _element(buf, pos, order)
    if kind not in _MI_DTYPES:
        raise _Malformed(f"{variable}'s values are of data type {kind}")
    dtype = np.dtype(_MI_DTYPES[kind]).newbyteorder(order)
    count = math.prod(dims)
    if len(data) != count * dtype.itemsize:  # checked before anything is allocated
        raise _Malformed(f"{variable} declares {count} values in {len(data)} bytes of {dtype.name}")
    return np.frombuffer(data, dtype).reshape(dims, order="F")


def _read_v5(path: Path, blob, variable: str, order: str):
    """The variable from a MAT v5 file's elements (``blob``: its bytes after the 128-byte
    header; each element a matrix, or a compressed one): only the one named ``variable``
    is decompressed whole."""
    names, pos = [], 0
    while pos < len(blob):
        kind, data, pos = _element(blob, pos, order)
        if kind == _MI_COMPRESSED:
            unzip = zlib.decompressobj()
            try:
                head = unzip.decompress(data, 8)  # the inner tag: the matrix's size
                if len(head) < 8:
                    raise _Malformed("a compressed element too short for its tag")
                inner, size = struct.unpack(order + "II", head)
                if inner != _MI_MATRIX:
                    continue
                # no more than the tag declares: a small file cannot unpack into gigabytes
                body = unzip.decompress(unzip.unconsumed_tail, size)
                if len(body) < size:
                    raise _Malformed("a compressed matrix shorter than its tag says")
            except zlib.error as e:
                raise _Malformed(f"a compressed element does not decompress ({e})") from None
            data = body
        elif kind != _MI_MATRIX:
            continue
        cls, flags, dims, name, at = _matrix_header(data, order)
        if name == variable:
            return _values(path, variable, cls, flags, dims, data, at, order)
        if name:
            names.append(name)
    raise DataError(path, f"no {variable} variable (has: {', '.join(sorted(names)) or 'none'})")


def _mat_version(blob):
    """("v5" | "v7.3" | "v4" | None, byte order) from the 128-byte header (or its absence)."""
    mark = bytes(blob[126:128])
    if len(blob) >= 128 and mark in (b"IM", b"MI"):
        order = "<" if mark == b"IM" else ">"
        major = blob[125] if order == "<" else blob[124]
        return {1: "v5", 2: "v7.3"}.get(major), order
    # v4: a header of five int32, the first of them (type code) small: zero bytes in its word
    return ("v4" if len(blob) >= 20 and 0 in bytes(blob[:4]) else None), "<"


def _read_v73(path: Path, variable: str):
    import h5py

    from aepar.data.hdf5 import storage_problem

    with h5py.File(path, "r") as f:
        if variable not in f:
            raise DataError(path, f"no {variable} variable (has: {', '.join(sorted(f)) or 'none'})")
        dset = f[variable]
        # checked from the header, before reading: a struct, cell, string or complex
        # variable, or one whose data the file does not hold, allocates nothing
        if not isinstance(dset, h5py.Dataset) or dset.dtype.kind not in "fiu":
            what = f"{dset.dtype}" if isinstance(dset, h5py.Dataset) else "a group (struct or cell)"
            raise DataError(path, f"{variable} is {what}, need real numbers")
        problem = storage_problem(dset)
        if problem:
            raise DataError(path, f"{variable} {problem}")
        # MATLAB writes column-major: h5py sees (K, W, H)
        return np.asarray(dset[()]).T


def read_images_mat(path, variable: str = VARIABLE) -> np.ndarray:
    """Read the image stack from a MATLAB IMAGES.mat.

    Parameters
    ----------
    path : str or Path
    variable : str
        Name of the variable holding the stack (UFLDL: ``IMAGES``).

    Returns
    -------
    numpy.ndarray
        float64, (H, W, K): K images of H rows and W columns.

    Raises
    ------
    DataError
        Missing file, not a MAT file, no such variable, not a finite real 3-D array.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(path, "missing (no such file)" if not path.exists() else "not a file")
    try:
        with open(path, "rb") as f:
            version, order = _mat_version(f.read(128))
            # a v5 file whole (slices of the view are views: the values are not copied)
            blob = memoryview(f.read()) if version == "v5" else None
    except OSError as e:
        raise DataError(path, f"unreadable ({e.strerror or e})") from None
    if version == "v7.3":
        try:
            images = _read_v73(path, variable)
        except DataError:
            raise
        except Exception as e:  # h5py's errors on a damaged file
            raise DataError(path, f"not a readable MAT v7.3 file ({one_line(e)})") from None
    elif version == "v4":
        raise DataError(path, f"a MATLAB v4 file (2-D matrices only), need a v5 or v7.3 file with a 3-D {variable}")
    elif version is None:
        raise DataError(path, "not a MAT file (no MAT-file header)")
    else:
        try:
            images = _read_v5(path, blob, variable, order)
        except _Malformed as e:
            raise DataError(path, f"not a MAT file ({e})") from None
    images = np.asarray(images)
    if images.dtype.kind not in "fiu":
        raise DataError(path, f"{variable} is {images.dtype}, need real numbers")
    if images.ndim != 3:
        raise DataError(path, f"{variable} has shape {images.shape}, need 3-D (rows, columns, images)")
    if images.size == 0:
        raise DataError(path, f"{variable} is empty {images.shape}")
    images = images.astype(np.float64)
    if not np.isfinite(images).all():
        raise DataError(path, f"{variable} holds NaN or infinite values")
    return images
