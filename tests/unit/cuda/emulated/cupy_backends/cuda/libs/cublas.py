"""cuBLAS's GEMMs, as aepar's GPU set calls them, on the arrays behind the device pointers
(column-major, leading dimensions, alpha and beta read from host memory)."""
import ctypes

import numpy as np
from numpy.lib.stride_tricks import as_strided

CUBLAS_OP_N, CUBLAS_OP_T, CUBLAS_OP_C = 0, 1, 2
CUBLAS_POINTER_MODE_HOST, CUBLAS_POINTER_MODE_DEVICE = 0, 1
_C_TYPE = {np.dtype(np.float32): ctypes.c_float, np.dtype(np.float64): ctypes.c_double}


def setStream(handle, stream):
    pass


def setPointerMode(handle, mode):
    if mode != CUBLAS_POINTER_MODE_HOST:
        raise NotImplementedError("the emulated cuBLAS reads alpha and beta from host memory only")


def _matrix(ptr, dtype, rows, cols, ld):
    """The column-major (rows, cols) matrix at ptr with leading dimension ld."""
    if ld < max(1, rows):
        raise ValueError(f"CUBLAS_STATUS_INVALID_VALUE: leading dimension {ld} < {rows} rows")
    if rows == 0 or cols == 0:
        return np.empty((rows, cols), dtype)
    count = ld * (cols - 1) + rows
    flat = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(_C_TYPE[dtype])), shape=(count,))
    return as_strided(flat, (rows, cols), (dtype.itemsize, ld * dtype.itemsize))


def _operand(op, ptr, dtype, rows, cols, ld):
    """op(X) as (rows, cols), X stored as given by op."""
    if op == CUBLAS_OP_N:
        return _matrix(ptr, dtype, rows, cols, ld)
    return _matrix(ptr, dtype, cols, rows, ld).T


def _gemm(dtype, handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc):
    dtype = np.dtype(dtype)
    scalar = _C_TYPE[dtype]
    al, be = dtype.type(scalar.from_address(alpha).value), dtype.type(scalar.from_address(beta).value)
    c = _matrix(C, dtype, m, n, ldc)
    product = _operand(transa, A, dtype, m, k, lda) @ _operand(transb, B, dtype, k, n, ldb)
    c[...] = al * product if be == 0 else al * product + be * c  # beta 0: C is not read


def sgemm(*args):
    _gemm(np.float32, *args)


def dgemm(*args):
    _gemm(np.float64, *args)
