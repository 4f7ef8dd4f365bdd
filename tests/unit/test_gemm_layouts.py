"""kernels/cp/gemm.py's choice of cuBLAS operations and leading dimensions, checked on any
machine: the module runs on NumPy arrays against a stand-in ``cublas<t>gemm`` that reads
and writes column-major memory through the pointers it is given, as cuBLAS does. A slip
in the row-major -> column-major mapping (an operation, a leading dimension, the operand
order) gives wrong products here, not only on a lent GPU (tests/unit/test_kernels_gemm.py
runs the real thing)."""
import ctypes
import importlib.util
import sys
import types
from pathlib import Path

import numpy as np
import pytest

GEMM_PY = Path(__file__).resolve().parents[2] / "kernels" / "cp" / "gemm.py"


_BUFFERS = []  # (first byte, end) of every buffer whose pointer was handed out


class _Device(np.ndarray):
    """A NumPy array that answers ``.data.ptr`` as a CuPy array does (and remembers the
    buffer behind it, so that the stand-in refuses to reach outside it)."""

    @property
    def data(self):
        base = self
        while isinstance(base.base, np.ndarray):
            base = base.base
        start = base.__array_interface__["data"][0]
        _BUFFERS.append((start, start + base.nbytes))
        return types.SimpleNamespace(ptr=self.__array_interface__["data"][0])


def _dev(a):
    return np.asarray(a).view(_Device)


def _column_major(ptr, rows, cols, ld, dtype):
    """The (rows, cols) column-major matrix at ``ptr`` with leading dimension ``ld``."""
    item = np.dtype(dtype).itemsize
    size = ld * (cols - 1) + rows
    assert any(lo <= ptr and ptr + size * item <= hi for lo, hi in _BUFFERS), "gemm reads past its operand"
    flat = np.frombuffer((ctypes.c_char * (size * item)).from_address(ptr), dtype)
    return np.lib.stride_tricks.as_strided(flat, (rows, cols), (item, ld * item))


def _stand_in_gemm(dtype, calls):
    def gemm(handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc):
        calls.append((transa, transb, m, n, k, lda, ldb, ldc))
        assert lda >= (k if transa else m) and ldb >= (n if transb else k) and ldc >= m
        op_a = _column_major(A, k, m, lda, dtype).T if transa else _column_major(A, m, k, lda, dtype)
        op_b = _column_major(B, n, k, ldb, dtype).T if transb else _column_major(B, k, n, ldb, dtype)
        c = _column_major(C, m, n, ldc, dtype)
        a, b = (float(np.frombuffer((ctypes.c_char * np.dtype(dtype).itemsize).from_address(p), dtype)[0])
                for p in (alpha, beta))
        product = a * (op_a.astype(np.float64) @ op_b.astype(np.float64))
        c[...] = product if b == 0 else product + b * c  # beta 0: C is not read (cuBLAS)
    return gemm


@pytest.fixture
def gemm_module(monkeypatch):
    """kernels/cp/gemm.py loaded against stand-ins; returns (module, calls)."""
    calls = []
    cupy = types.ModuleType("cupy")
    cupy.empty = lambda shape, dtype: _dev(np.empty(shape, dtype))
    cupy.ascontiguousarray = lambda a: _dev(np.ascontiguousarray(a))
    cupy.matmul = lambda a, b: _dev(np.matmul(a, b))
    stream = types.SimpleNamespace(ptr=0)
    cupy.cuda = types.SimpleNamespace(device=types.SimpleNamespace(get_cublas_handle=lambda: 0),
                                      get_current_stream=lambda: stream)
    cublas = types.ModuleType("cupy_backends.cuda.libs.cublas")
    cublas.CUBLAS_OP_N, cublas.CUBLAS_OP_T, cublas.CUBLAS_POINTER_MODE_HOST = 0, 1, 0
    cublas.setStream = cublas.setPointerMode = lambda *args: None
    cublas.sgemm, cublas.dgemm = _stand_in_gemm(np.float32, calls), _stand_in_gemm(np.float64, calls)
    libs = types.ModuleType("cupy_backends.cuda.libs")
    libs.cublas = cublas
    for name, module in (("cupy", cupy), ("cupy_backends", types.ModuleType("cupy_backends")),
                         ("cupy_backends.cuda", types.ModuleType("cupy_backends.cuda")),
                         ("cupy_backends.cuda.libs", libs), ("cupy_backends.cuda.libs.cublas", cublas)):
        monkeypatch.setitem(sys.modules, name, module)
    spec = importlib.util.spec_from_file_location("aepar_gemm_under_test", GEMM_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, calls


def _layout(host, kind):
    """``host`` as a kernel hands it: C order, a transposed view, or a row slice of a taller array."""
    if kind == "T":
        return _dev(np.ascontiguousarray(host.T)).T
    if kind == "rows":
        tall = np.zeros((host.shape[0] + 3, host.shape[1]), host.dtype)
        tall[2:2 + host.shape[0]] = host
        return _dev(tall)[2:2 + host.shape[0]]
    return _dev(host)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("a_kind", ["C", "T", "rows"])
@pytest.mark.parametrize("b_kind", ["C", "T"])
@pytest.mark.parametrize("shape", [(7, 5, 3), (1, 9, 4), (6, 1, 8), (5, 4, 1), (13, 784, 20)])
def test_products_in_every_layout_are_numpys(gemm_module, dtype, a_kind, b_kind, shape, rng):
    gemm, calls = gemm_module
    m, k, n = shape
    a, b = rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)
    want = a.astype(np.float64) @ b.astype(np.float64)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    got = gemm.matmul(_layout(a, a_kind), _layout(b, b_kind))
    assert got.shape == (m, n) and got.dtype == dtype and got.flags.c_contiguous
    np.testing.assert_allclose(got, want, **tol)
    c = rng.standard_normal((m, n)).astype(dtype)
    out = _dev(c.copy())
    gemm.matmul(_layout(a, a_kind), _layout(b, b_kind), out=out, accumulate=True)
    np.testing.assert_allclose(out, c + want, **tol)
    gemm.matmul(_layout(a, a_kind), _layout(b, b_kind), out=out)
    np.testing.assert_allclose(out, want, **tol)
    assert len(calls) == 3  # each a single gemm: no copies through cupy.matmul


def test_transposed_views_are_not_copied_and_strided_ones_are(gemm_module, rng):
    gemm, calls = gemm_module
    a, b = rng.standard_normal((6, 8)), rng.standard_normal((8, 5))
    gemm.matmul(_layout(a, "T"), _layout(b, "T"))
    assert calls[-1][:2] == (1, 1)  # both read as they lie, transposed by cuBLAS
    gemm.matmul(_layout(a, "C"), _layout(b, "C"))
    assert calls[-1][:2] == (0, 0)
    wide = _dev(np.zeros((6, 16)))
    wide[:, ::2] = a
    np.testing.assert_allclose(gemm.matmul(wide[:, ::2], _dev(b)), a @ b, rtol=1e-12)
