"""The CuPy set's products straight to cuBLAS (kernels/cp/gemm.py) against NumPy's: every
layout a kernel hands it (C-contiguous, transposed views, row slices), into a new array,
over ``out`` and added into it, empty sides, and what it passes on to cupy.matmul."""
import numpy as np
import pytest

from tests.conftest import HAVE_GPU
from tests.gradcheck import assert_close

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAVE_GPU, reason="no CUDA GPU/CuPy on this machine")]


def _exact(a, b):
    return a.astype(np.float64) @ b.astype(np.float64)


def _layout(cp, host, transposed):
    """``host`` on the device, as it is or as the transposed view of its transpose's copy."""
    return cp.asarray(np.ascontiguousarray(host.T)).T if transposed else cp.asarray(host)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("a_t", [False, True])
@pytest.mark.parametrize("b_t", [False, True])
@pytest.mark.parametrize("shape", [(7, 5, 3), (1, 9, 4), (6, 1, 8), (5, 4, 1), (100, 784, 33)])
def test_matmul_matches_numpy_in_every_layout(dtype, a_t, b_t, shape, rng):
    import cupy as cp

    from aepar.kernels.cp.gemm import matmul

    m, k, n = shape
    a, b = rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)
    A, B = _layout(cp, a, a_t), _layout(cp, b, b_t)
    got = matmul(A, B)
    assert got.flags.c_contiguous and got.dtype == dtype
    assert_close(got, _exact(a, b), dtype, work=k, name="a @ b")
    c = rng.standard_normal((m, n)).astype(dtype)
    out = cp.asarray(c)
    assert matmul(A, B, out=out, accumulate=True) is out
    assert_close(out, c + _exact(a, b), dtype, work=k + 1, name="c + a @ b")
    assert matmul(A, B, out=out) is out
    assert_close(out, _exact(a, b), dtype, work=k, name="a @ b over c")


def test_row_slices_and_strided_operands(rng):
    import cupy as cp

    from aepar.kernels.cp.gemm import matmul

    x = rng.standard_normal((20, 6)).astype(np.float32)
    w = rng.standard_normal((12, 6)).astype(np.float32)
    X, W = cp.asarray(x), cp.asarray(w)
    assert_close(matmul(X[5:11].T, X[5:11]), _exact(x[5:11].T, x[5:11]), np.float32, work=6)
    # every other column: neither C- nor F-contiguous, copied first
    assert_close(matmul(X[:, ::2], W[:3]), _exact(x[:, ::2], w[:3]), np.float32, work=3)


def test_empty_sides(rng):
    import cupy as cp

    from aepar.kernels.cp.gemm import matmul

    assert matmul(cp.ones((0, 4), np.float32), cp.ones((4, 3), np.float32)).shape == (0, 3)
    out = cp.full((2, 3), 5.0, dtype=np.float32)
    matmul(cp.ones((2, 0), np.float32), cp.ones((0, 3), np.float32), out=out, accumulate=True)
    assert float(out.min()) == float(out.max()) == 5.0
    matmul(cp.ones((2, 0), np.float32), cp.ones((0, 3), np.float32), out=out)
    assert not out.any()


def test_other_types_and_bad_shapes_take_cupy_or_fail(rng):
    import cupy as cp

    from aepar.kernels.cp.gemm import matmul

    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4, 2)).astype(np.float32)
    got = matmul(cp.asarray(a), cp.asarray(b))  # mixed: cupy.matmul's promotion
    np.testing.assert_allclose(cp.asnumpy(got), a @ b, rtol=1e-6)
    strided_out = cp.zeros((3, 4), np.float64)[:, ::2]
    matmul(cp.asarray(a), cp.asarray(b, dtype=np.float64), out=strided_out, accumulate=True)
    np.testing.assert_allclose(cp.asnumpy(strided_out), a @ b, rtol=1e-6)
    with pytest.raises(ValueError, match="do not chain"):
        matmul(cp.asarray(a), cp.asarray(a))
    with pytest.raises(ValueError, match="out"):
        matmul(cp.asarray(a), cp.asarray(a.T), out=cp.zeros((3, 4)))
