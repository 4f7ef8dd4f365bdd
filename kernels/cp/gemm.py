"""Matrix products straight to cuBLAS (CuPy arrays, row-major).

One ``cublas<t>gemm`` call per product, and ``accumulate=True`` adds the product into
``out`` (beta = 1): a weight gradient ``dW += x.T @ dz`` was a temporary and a second
launch, and at batch 100 a GPU step is host-bound (each launch costs host time). A
plain product costs the host what ``cupy.matmul`` does (the cuBLAS call itself dominates
either way), and its bits were the same in every shape compared.

A row-major (m, n) matrix is a column-major (n, m) one, so C = A @ B is computed as
C^T = B^T A^T; a transposed view (F-contiguous) is the other operation on the same memory.
"""
import cupy as cp
import numpy as np
from cupy_backends.cuda.libs import cublas

__all__ = []  # the set's own helper, not a kernel

_GEMM = {np.dtype(np.float32): cublas.sgemm, np.dtype(np.float64): cublas.dgemm}
# alpha and beta in host memory, kept alive for the process (cuBLAS reads them at the call)
_SCALARS = {dt: (np.ones(1, dt), np.zeros(1, dt)) for dt in _GEMM}
_POINTERS = {dt: (one.ctypes.data, zero.ctypes.data) for dt, (one, zero) in _SCALARS.items()}


def _operand(a):
    """(cuBLAS operation, leading dimension, a) for a 2-D operand: C-contiguous is the
    transpose of a column-major matrix, F-contiguous (a transposed view) is one."""
    if a.flags.c_contiguous:
        return cublas.CUBLAS_OP_N, max(1, a.shape[1]), a
    if a.flags.f_contiguous:
        return cublas.CUBLAS_OP_T, max(1, a.shape[0]), a
    a = cp.ascontiguousarray(a)
    return cublas.CUBLAS_OP_N, max(1, a.shape[1]), a


def matmul(a, b, out=None, accumulate=False):
    """``a @ b`` for 2-D float32/float64 CuPy arrays of one dtype: into a new C-contiguous
    array, into ``out`` (overwritten), or added into ``out`` with ``accumulate=True``.
    Other or mixed dtypes, or an ``out`` of another dtype or not C-contiguous, take
    ``cupy.matmul`` (and ``out`` is cast into)."""
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul: shapes {a.shape} and {b.shape} do not chain")
    m, k = a.shape
    n = b.shape[1]
    dt = a.dtype if a.dtype == b.dtype else np.result_type(a.dtype, b.dtype)
    gemm = _GEMM.get(dt)
    if out is not None and out.shape != (m, n):
        raise ValueError(f"matmul: out {out.shape} is not {(m, n)}")
    if gemm is None or a.dtype != b.dtype or (out is not None and (out.dtype != dt or not out.flags.c_contiguous)):
        product = cp.matmul(a, b)
        if out is None:
            return product
        if accumulate:
            out += product
        else:
            out[...] = product
        return out
    if out is None:
        out = cp.empty((m, n), dtype=dt)
        accumulate = False
    if m == 0 or n == 0:
        return out
    if k == 0:
        if not accumulate:
            out.fill(0)
        return out
    op_a, ld_a, a = _operand(a)
    op_b, ld_b, b = _operand(b)
    handle = cp.cuda.device.get_cublas_handle()
    cublas.setStream(handle, cp.cuda.get_current_stream().ptr)
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    one, zero = _POINTERS[dt]
    # column-major: out^T (n, m) = op(b^T) (n, k) @ op(a^T) (k, m)
    gemm(handle, op_b, op_a, n, m, k, one, b.data.ptr, ld_b, a.data.ptr, ld_a,
         one if accumulate else zero, out.data.ptr, max(1, n))
    return out
