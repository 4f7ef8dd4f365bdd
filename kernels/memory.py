"""Host arrays for the CPU kernels: data that starts on a 64-byte (cache line) boundary.

NumPy starts a large array 16 or 32 bytes past a line. A vector load that straddles two
lines costs two, and rows that start 16 bytes past a line slow the thin products of
:mod:`.nb.rowprod` (``rows_times``: W's rows; ``rows_times_t``: W's and h's rows;
``block_outer_sum``: its output), most on the AVX2 path. A row of a C-contiguous
array is then aligned as far as its length allows: every row of 784 or 1000 float32s,
every fourth of 500.

Plain NumPy (no Numba): the CPU backend allocates a run's parameters and gradient buffers
here, and the numba kernels the arrays they hand on to be loaded as vectors and the sparse
autoencoder's float64 workspace (whose tiles run much slower unaligned).
"""
from __future__ import annotations

import ctypes
import math

import numpy as np

__all__ = ["ALIGNMENT", "empty", "zeros", "aligned", "is_aligned"]

ALIGNMENT = 64


def _allocate(shape, dtype, fill) -> np.ndarray:
    """A C-order array of ``shape`` and ``dtype`` in a block from ``fill`` (np.empty or
    np.zeros) a little larger than it, from the block's first 64-byte boundary (dearer
    than a plain np.empty: the kernels take it only for arrays they load as vectors)."""
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    raw = fill(math.prod(shape) * dtype.itemsize + ALIGNMENT, np.uint8)
    # the block's address through ctypes' buffer view: ``raw.ctypes.data`` builds an object
    # each call, and kernels allocate several arrays a step
    return np.ndarray(shape, dtype, raw, -ctypes.addressof(ctypes.c_char.from_buffer(raw)) % ALIGNMENT)


def empty(shape, dtype=np.float64) -> np.ndarray:
    """Like ``np.empty(shape, dtype)`` (C order), the data on a 64-byte boundary."""
    return _allocate(shape, dtype, np.empty)


def zeros(shape, dtype=np.float64) -> np.ndarray:
    """Like ``np.zeros(shape, dtype)`` (C order), the data on a 64-byte boundary."""
    return _allocate(shape, dtype, np.zeros)


def is_aligned(a: np.ndarray) -> bool:
    return a.ctypes.data % ALIGNMENT == 0


def aligned(a, dtype=None) -> np.ndarray:
    """``a`` as a C-contiguous array of ``dtype`` on a 64-byte boundary: ``a`` itself when
    it is one, else one copy (converting as it copies)."""
    a = np.asarray(a)
    dtype = a.dtype if dtype is None else np.dtype(dtype)
    if a.dtype == dtype and a.flags.c_contiguous and is_aligned(a):
        return a
    out = empty(a.shape, dtype)
    out[...] = a
    return out
