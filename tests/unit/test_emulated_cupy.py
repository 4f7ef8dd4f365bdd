"""The CPU stand-in for CuPy (tests/unit/cuda/emulated) behaves as CuPy does where aepar's
GPU set depends on it: what ``make test-gpu-emulated`` shows is only as good as this."""
import numpy as np
import pytest

import aepar  # noqa: F401  (fixes thread counts before numpy loads)


@pytest.fixture(scope="module")
def cp(emulated_cupy):
    return emulated_cupy


def test_host_arrays_are_refused_where_cupy_refuses_them(cp):
    host, dev = np.ones(4, np.float32), cp.ones(4, np.float32)
    add = cp.ElementwiseKernel("T x, T y", "T z", "z = x + y", "add")
    with pytest.raises(TypeError, match="host array"):
        add(host, dev)
    with pytest.raises(TypeError, match="host array"):
        dev + host
    with pytest.raises(TypeError, match="host array"):
        cp.concatenate([dev, host])
    copy = cp.asarray(host)  # a copy: the host array changed later is not seen on the device
    host[0] = 7
    assert copy.get()[0] == 1 and isinstance(copy, cp.ndarray) and not isinstance(copy.get(), cp.ndarray)
    assert np.isnan(cp.empty(3, np.float32).get()).all()


def test_elementwise_kernels_resolve_types_and_broadcast_as_cupy(cp):
    bias_sigmoid = cp.ElementwiseKernel("T b", "T z", "z = (T)1 / ((T)1 + exp(-(z + b)))", "bias_sigmoid")
    z, b = np.arange(6, dtype=np.float32).reshape(2, 3) / 4, np.array([0.5, -1, 2], np.float32)
    dz = cp.asarray(z)
    bias_sigmoid(cp.asarray(b), dz)  # an output is read and written in place, b broadcast over rows
    np.testing.assert_allclose(dz.get(), 1 / (1 + np.exp(-(z + b))), rtol=1e-6)
    with pytest.raises(TypeError, match="mismatched"):
        bias_sigmoid(cp.asarray(b.astype(np.float64)), dz)
    scale = cp.ElementwiseKernel("T x, T s", "T y", "y = x * s", "scale")
    assert scale(cp.asarray(b), 2.0).dtype == np.float32  # a Python float takes the arrays' T


def test_reduction_kernels_reduce_the_axis_given(cp):
    rows = cp.ReductionKernel("T y, float64 s", "float64 total", "(double)y", "a + b", "total = s * a", "0", "rows")
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(rows(cp.asarray(x), 0.5, axis=1).get(), 0.5 * x.sum(axis=1))
    assert float(rows(cp.asarray(x), 1.0)) == x.sum()


TREE = r"""
extern "C" __global__ void tree_sum(const float *x, int n, float scale, double *out) {
    __shared__ float s[64];
    s[threadIdx.x] = threadIdx.x < n ? x[blockIdx.x * 64 + threadIdx.x] : 0.0f;
    if (threadIdx.x >= 32 && threadIdx.x >= n) return;  // leaves early: the barrier must not wait for it
    __syncthreads();
    for (int half = 16; half > 0; half >>= 1) {
        if (threadIdx.x < half) s[threadIdx.x] += s[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = (double)(scale * s[0]);
}
"""


def test_raw_kernels_run_blocks_and_threads_and_read_arguments_as_declared(cp):
    kernel = cp.RawKernel(TREE, "tree_sum")
    x = np.arange(128, dtype=np.float32)
    out = cp.zeros(2, np.float64)
    kernel((2,), (64,), (cp.asarray(x), np.int32(20), np.float32(2), out))
    np.testing.assert_array_equal(out.get(), [2 * x[:20].sum(), 2 * x[64:84].sum()])
    # a Python float is 8 bytes: a kernel declaring float reads the double's low half, as on a GPU
    kernel((1,), (64,), (cp.asarray(x), np.int32(20), 2.0, out))
    assert out.get()[0] != 2 * x[:20].sum()
    with pytest.raises(TypeError, match="2 bytes"):  # would read past what was passed
        kernel((1,), (64,), (cp.asarray(x), np.int16(20), np.float32(2), out))
    with pytest.raises(TypeError, match="host array"):
        kernel((1,), (64,), (x, np.int32(20), np.float32(2), out))


def test_cublas_gemm_reads_column_major_operands_and_beta(cp):
    from cupy_backends.cuda.libs import cublas
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal(s).astype(np.float32) for s in ((5, 3), (3, 4), (5, 4)))
    da, db, dc = cp.asarray(a), cp.asarray(b), cp.asarray(c)
    one, half = np.ones(1, np.float32), np.full(1, 0.5, np.float32)
    # row-major C = A @ B is column-major C^T = B^T A^T: as kernels/cp/gemm.py calls it
    cublas.sgemm(0, cublas.CUBLAS_OP_N, cublas.CUBLAS_OP_N, 4, 5, 3, one.ctypes.data, db.data.ptr, 4,
                 da.data.ptr, 3, half.ctypes.data, dc.data.ptr, 4)
    np.testing.assert_allclose(dc.get(), a @ b + 0.5 * c, rtol=1e-5)
