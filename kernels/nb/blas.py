"""General matrix products that let other threads run: BLAS ?gemm without the GIL.

``scipy.linalg.blas.sgemm`` (f2py) holds the interpreter lock for the whole product, so
threads that take different blocks of rows (aepar.rows.parallel_map) would
queue behind one another. The same Fortran routine is reached here through scipy's Cython
BLAS table and called with ctypes, which releases the lock for the call: the same library,
the same results, and the blocks' products run side by side.
"""
from __future__ import annotations

import ctypes

import numpy as np

__all__ = ["gemm"]

_P = ctypes.c_void_p
_PROTO = ctypes.CFUNCTYPE(None, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P)
_ROUTINES = {}


def _routine(dtype):
    key = np.dtype(dtype).char
    if key not in _ROUTINES:
        from numba.extending import get_cython_function_address

        name = {"f": "sgemm", "d": "dgemm"}[key]
        _ROUTINES[key] = (_PROTO(get_cython_function_address("scipy.linalg.cython_blas", name)),
                          ctypes.c_float if key == "f" else ctypes.c_double)
    return _ROUTINES[key]


def gemm(alpha, a, b, beta, c, trans_a=0, trans_b=0):
    """c = alpha op(a) op(b) + beta c in place, column-major like BLAS (and like
    ``scipy.linalg.blas.?gemm`` with ``overwrite_c``): ``a``, ``b``, ``c`` are Fortran-ordered
    float32 or float64 arrays of c's dtype (the transposed views of C-ordered arrays).
    Returns ``c``."""
    if c.dtype not in (np.float32, np.float64) or not (a.dtype == b.dtype == c.dtype):
        raise TypeError(f"gemm takes float32 or float64 arrays of one dtype, got {a.dtype}, {b.dtype}, {c.dtype}")
    if not (c.flags.f_contiguous and c.flags.writeable):
        raise ValueError("gemm writes into a writeable Fortran-ordered c")
    a, b = np.asfortranarray(a), np.asfortranarray(b)  # copies only what is not laid out so
    m, n = c.shape
    k = a.shape[0] if trans_a else a.shape[1]
    if (a.shape[1] if trans_a else a.shape[0]) != m or (b.shape[1] if trans_b else b.shape[0]) != k or \
            (b.shape[0] if trans_b else b.shape[1]) != n:
        raise ValueError(f"gemm: op(a) {a.shape[::-1] if trans_a else a.shape} x op(b) "
                         f"{b.shape[::-1] if trans_b else b.shape} does not give c {c.shape}")
    if m == 0 or n == 0:
        return c
    fn, real = _routine(c.dtype)
    ref, i32 = ctypes.byref, ctypes.c_int
    fn(ref(ctypes.c_char(b"T" if trans_a else b"N")), ref(ctypes.c_char(b"T" if trans_b else b"N")),
       ref(i32(m)), ref(i32(n)), ref(i32(k)), ref(real(alpha)), a.ctypes.data_as(_P), ref(i32(max(1, a.shape[0]))),
       b.ctypes.data_as(_P), ref(i32(max(1, b.shape[0]))), ref(real(beta)), c.ctypes.data_as(_P),
       ref(i32(max(1, m))))
    return c
