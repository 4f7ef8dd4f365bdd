"""Losses, forward and backward (CuPy): reductions accumulate in double.

Same conventions as the reference: ``scale`` defaults to 1/batch, arrays keep the input
dtype. Scalar losses stay on the device as 0-d float64 arrays (the kernel contract): reading
one waits for the GPU, so a training step that reads its loss cannot queue the next step
behind it. ``float(loss)`` reads it.
"""
import math

import cupy as cp
import numpy as np

from ..ref.blocksum import check_starts
from ..ref.loss import check_same_shape, default_scale, mse_forward_blocks_via, sigmoid_xent_forward_blocks_via
from .rowprod import on_device
from .activation import _sigmoid
from .c_types import C_TYPE

__all__ = ["mse_forward", "mse_forward_blocks", "mse_backward", "softmax_xent_forward", "softmax_xent_forward_blocks",
           "softmax_xent_backward",
           "sigmoid_xent_forward", "sigmoid_xent_forward_blocks", "sigmoid_xent_backward"]

# A whole-array ReductionKernel runs in one thread block (slow on a large batch), so the
# scalar losses take two: one sum per row, then the rows' sums, scaled.
_sq_diff_rows = cp.ReductionKernel(
    "T y, U t", "float64 s", "((double)y - (double)t) * ((double)y - (double)t)",
    "a + b", "s = a", "0", "aepar_sq_diff_rows")
_scaled_diff = cp.ElementwiseKernel("T y, T t, T scale", "T d", "d = scale * (y - t)",
                                    "aepar_scaled_diff")
# softplus(z) - z t = max(z, 0) - z t + log1p(exp(-|z|)), in double
_sigmoid_xent_rows = cp.ReductionKernel(
    "T z, U t", "float64 s",
    "fmax((double)z, 0.0) - (double)z * (double)t + log1p(exp(-fabs((double)z)))",
    "a + b", "s = a", "0", "aepar_sigmoid_xent_rows")
_scaled_sum = cp.ReductionKernel("float64 s, float64 scale", "float64 total", "s", "a + b",
                                 "total = scale * a", "0", "aepar_scaled_sum")
_value_rows = cp.ReductionKernel("T y, U t", "float64 s", "(double)y", "a + b", "s = a", "0", "aepar_value_rows")
_ROWS = {"sq_diff": _sq_diff_rows, "sigmoid_xent": _sigmoid_xent_rows, "value": _value_rows}

# The same totals as compiled kernels, for y and t of one float type in C order: every
# block sums a grid-stride share of the map in double (a fixed tree), then one block sums
# the blocks' partials and scales. The grid depends on the size only: the same bits every
# run. Two ReductionKernel calls cost the host a visible part of a batch-100 step; two
# RawKernel launches much less.
_TOTAL_THREADS = 256  # the sources' THREADS
_TOTAL_BLOCKS = 1024  # the sources' MOST_BLOCKS


def _grid(n: int) -> int:
    """The partial sums' blocks for n elements: the sources' aepar_grid_of."""
    return max(1, min(-(-n // _TOTAL_THREADS), _TOTAL_BLOCKS))


_MAPS = {"sq_diff": "(a - b) * (a - b)", "sigmoid_xent": "fmax(a, 0.0) - a * b + log1p(exp(-fabs(a)))",
         "value": "a"}  # (value: the sum of y itself)
_TREE = r"""
#define THREADS 256
#define MOST_BLOCKS 1024
// the partial sums' blocks for n elements (the grid depends on the size only)
__device__ int aepar_grid_of(long long n) {
    return (int)max(1LL, min((n + THREADS - 1) / THREADS, (long long)MOST_BLOCKS));
}
__device__ double aepar_block_tree(double v) {
    __shared__ double s[THREADS];
    s[threadIdx.x] = v;
    __syncthreads();
    for (int half = THREADS / 2; half > 0; half >>= 1) {
        if (threadIdx.x < half) s[threadIdx.x] += s[threadIdx.x + half];
        __syncthreads();
    }
    return s[0];
}
"""
# The blocks' kernels (mse_forward_blocks) take every block of rows in one launch each:
# blockIdx.y is the block, whose grid is the one its size alone gives (the blocks past it
# return at once), so each block's total has the bits of its own call.
_PARTIALS_SOURCE = _TREE + r"""
__device__ void aepar_partial_NAME(const T *y, const T *t, long long n, int blocks, double *part) {
    double acc = 0.0;
    for (long long i = (long long)blockIdx.x * THREADS + threadIdx.x; i < n; i += (long long)blocks * THREADS) {
        const double a = (double)y[i], b = (double)t[i];
        acc += MAP;
    }
    const double total = aepar_block_tree(acc);
    if (threadIdx.x == 0) part[blockIdx.x] = total;
}
extern "C" __global__ void aepar_total_NAME(const T *y, const T *t, long long n, double *part) {
    aepar_partial_NAME(y, t, n, gridDim.x, part);
}
extern "C" __global__ void aepar_total_blocks_NAME(const T *y, const T *t, const long long *starts, double *part) {
    const long long lo = starts[blockIdx.y], n = starts[blockIdx.y + 1] - lo;
    const int blocks = aepar_grid_of(n);
    if ((int)blockIdx.x >= blocks) return;
    aepar_partial_NAME(y + lo, t + lo, n, blocks, part + (long long)blockIdx.y * MOST_BLOCKS);
}
"""
_total_kernels = {(name, dt, kind): cp.RawKernel(f"typedef {c} T;" + _PARTIALS_SOURCE.replace("NAME", f"{name}_{c}")
                                                 .replace("MAP", body), f"aepar_total{kind}_{name}_{c}")
                  for name, body in _MAPS.items() for dt, c in C_TYPE.items() for kind in ("", "_blocks")}
_SUM_PARTIALS_SOURCE = _TREE + r"""
__device__ void aepar_sum_partials_of(const double *part, int n, double scale, double *total) {
    double acc = 0.0;
    for (int i = threadIdx.x; i < n; i += THREADS) acc += part[i];
    const double sum = aepar_block_tree(acc);
    if (threadIdx.x == 0) *total = scale * sum;
}
extern "C" __global__ void aepar_sum_partials(const double *part, int n, double scale, double *total) {
    aepar_sum_partials_of(part, n, scale, total);
}
extern "C" __global__ void aepar_sum_partials_blocks(const double *part, const long long *starts, const double *scales,
                                                     double *totals) {
    const long long n = starts[blockIdx.x + 1] - starts[blockIdx.x];
    aepar_sum_partials_of(part + (long long)blockIdx.x * MOST_BLOCKS, aepar_grid_of(n), scales[blockIdx.x],
                          totals + blockIdx.x);
}
"""
_sum_partials, _sum_partials_blocks = (cp.RawKernel(_SUM_PARTIALS_SOURCE, f"aepar_sum_partials{kind}")
                                       for kind in ("", "_blocks"))


def _by_rows(y):
    """y as (rows, rest): the first stage of a loss sums along axis 1 (the rest's size
    spelled out: -1 is undefined for no rows)."""
    return y.reshape(y.shape[0], math.prod(y.shape[1:])) if y.ndim >= 2 else y.reshape(1, -1)


def _scaled_total(name, y, t, scale):
    """scale * (the sum over every element of the map ``name`` of y and t), a 0-d float64
    array; mixed types or layouts take the rows' ReductionKernel, then the rows' sum."""
    kernel = _total_kernels.get((name, y.dtype, ""))
    if kernel is None or t.dtype != y.dtype or not (y.flags.c_contiguous and t.flags.c_contiguous):
        return _scaled_sum(_ROWS[name](_by_rows(y), _by_rows(t), axis=1), scale)
    n = y.size
    blocks = _grid(n)
    part = cp.empty(blocks, dtype=cp.float64)
    total = cp.empty((), dtype=cp.float64)
    kernel((blocks,), (_TOTAL_THREADS,), (y, t, np.int64(n), part))
    _sum_partials((1,), (_TOTAL_THREADS,), (part, np.int32(blocks), np.float64(scale), total))
    return total


def _check_labels(name, z, labels):
    """Shapes only: checking the values would wait for the device every step
    (out-of-range labels are caught by the reference and Numba sets, not here)."""
    if z.ndim != 2:
        raise ValueError(f"{name}: logits must be (batch, classes), not {z.shape}")
    if labels.shape != (z.shape[0],) or labels.dtype.kind not in "iu":
        raise ValueError(f"{name}: labels must be {z.shape[0]} integers, got {labels.dtype} {labels.shape}")


def mse_forward(y, t, scale=None):
    """scale * 0.5 * sum((y - t)**2) as a 0-d float64 array (scale defaults to 1/batch)."""
    check_same_shape("mse_forward", y, t)
    return _scaled_total("sq_diff", y, t, 0.5 * default_scale(y, scale))


def mse_forward_blocks(y, t, starts, scale=None):
    """:func:`mse_forward` of each block of rows starts[b]:starts[b + 1] (0-d arrays, left
    on the device): two launches for all blocks where one block's call takes the compiled
    kernels (y and t of one float type, C-ordered), with each block's bits."""
    if not _blocks_take_kernels("sq_diff", y, t):
        return mse_forward_blocks_via(mse_forward, y, t, starts, scale)
    check_same_shape("mse_forward_blocks", y, t)
    return _scaled_totals_blocks("mse_forward_blocks", "sq_diff", y, t, starts, scale, 0.5)


def _blocks_take_kernels(name, y, t):
    return _total_kernels.get((name, y.dtype, "_blocks")) is not None and t.dtype == y.dtype \
        and y.flags.c_contiguous and t.flags.c_contiguous and y.ndim >= 2


def _scaled_totals_blocks(what, name, y, t, starts, scale, factor):
    """[factor * scale_b * (block b's sum of the map ``name``)] as 0-d device arrays, in two
    launches, each block's total with the bits of :func:`_scaled_total` on it alone
    (``scale`` None: each block's 1/rows)."""
    rows = check_starts(what, y.shape[0], starts).tolist()
    count, width = len(rows) - 1, math.prod(y.shape[1:])
    scales = ((factor * float(scale),) * count if scale is not None  # the usual step: no view of y a block
              else tuple(factor * default_scale(y[lo:hi], None) for lo, hi in zip(rows[:-1], rows[1:])))
    elements = on_device(tuple(r * width for r in rows), np.int64)
    part = cp.empty((count, _TOTAL_BLOCKS), dtype=cp.float64)
    totals = cp.empty(count, dtype=cp.float64)
    most = max(_grid((hi - lo) * width) for lo, hi in zip(rows[:-1], rows[1:]))
    _total_kernels[name, y.dtype, "_blocks"]((most, count), (_TOTAL_THREADS,), (y, t, elements, part))
    _sum_partials_blocks((count,), (_TOTAL_THREADS,), (part, elements, on_device(scales, np.float64), totals))
    return [totals[b] for b in range(count)]


def mse_backward(y, t, scale=None):
    """scale * (y - t) as a new array."""
    check_same_shape("mse_backward", y, t)
    return _scaled_diff(y, t.astype(y.dtype, copy=False), y.dtype.type(default_scale(y, scale)))


# Softmax cross-entropy a thread per row, each row in a fixed order (a row's bits its own,
# whatever rows share the launch): m = its max, e = exp(z - m) in T, s = Σ e in double in
# order, probs = e / (T)s, logp = ((double)z[label] - m) - log(s) (NaN for a label out of
# range). The gradient: dz =
# scale * probs, less scale at the label, each operation rounded on its own (--fmad=false).
_SOFTMAX_SOURCE = r"""
template <typename T>
__global__ void softmax_rows(const T* z, const long long* labels, long long n, int k, T* probs, double* logp) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const T* r = z + i * k;
    T* p = probs + i * k;
    T m = r[0];
    for (int j = 1; j < k; ++j) m = r[j] > m ? r[j] : m;
    double s = 0.0;
    for (int j = 0; j < k; ++j) {
        const T e = exp(r[j] - m);
        p[j] = e;
        s += (double)e;
    }
    const T st = (T)s;
    for (int j = 0; j < k; ++j) p[j] = p[j] / st;
    const long long y = labels[i];  // out of range (unchecked here: a check waits for the GPU): NaN, not a stray read
    logp[i] = (y >= 0 && y < k) ? ((double)r[y] - (double)m) - log(s) : nan("");
}
template <typename T>
__global__ void softmax_grad(const T* probs, const long long* labels, long long n, int k, T scale, T* dz) {
    const long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n * k) return;
    const T d = probs[e] * scale;
    dz[e] = (e % k == labels[e / k]) ? d - scale : d;
}
"""
_SOFTMAX = cp.RawModule(code=_SOFTMAX_SOURCE, options=("-std=c++14", "--fmad=false"),
                        name_expressions=[f"softmax_{kind}<{t}>" for kind in ("rows", "grad") for t in C_TYPE.values()])


def _softmax_rows(z, labels):
    """(probs, logp): :data:`_SOFTMAX_SOURCE`'s rows, logp float64 (rows,)."""
    if z.dtype not in C_TYPE:
        raise ValueError(f"softmax_xent: logits of float32 or float64, not {z.dtype}")
    z, labels = cp.ascontiguousarray(z), cp.ascontiguousarray(labels, dtype=cp.int64)
    n, k = z.shape
    probs, logp = cp.empty((n, k), z.dtype), cp.empty(n, cp.float64)
    if n and k:
        _SOFTMAX.get_function(f"softmax_rows<{C_TYPE[z.dtype]}>")(
            (-(-n // 128),), (128,), (z, labels, np.int64(n), np.int32(k), probs, logp))
    return probs, logp


def softmax_xent_forward(z, labels, scale=None):
    """Softmax cross-entropy from logits z (batch, classes) and int labels (batch,).

    Returns (loss, probs) as the reference, the loss a 0-d float64 array: each row by one
    thread in a fixed order, their losses summed as the other losses are.
    """
    labels = cp.asarray(labels)
    _check_labels("softmax_xent_forward", z, labels)
    probs, logp = _softmax_rows(z, labels)
    return _scaled_total("value", logp, logp, -default_scale(z, scale)), probs


def softmax_xent_forward_blocks(z, labels, starts, scale=None):
    """:func:`softmax_xent_forward` of each block of rows starts[b]:starts[b + 1]: ([one 0-d
    loss per block], probs of every row), three launches for all blocks, with each block's
    bits (its rows are their own; its sum has the grid of its call alone)."""
    labels = cp.asarray(labels)
    _check_labels("softmax_xent_forward_blocks", z, labels)
    probs, logp = _softmax_rows(z, labels)
    column = logp.reshape(-1, 1)
    return _scaled_totals_blocks("softmax_xent_forward_blocks", "value", column, column, starts, scale, -1.0), probs


def softmax_xent_backward(probs, labels, scale=None):
    """dz = scale * (probs - onehot(labels)), one launch."""
    labels = cp.asarray(labels)
    _check_labels("softmax_xent_backward", probs, labels)
    if probs.dtype not in C_TYPE:
        raise ValueError(f"softmax_xent_backward: probabilities of float32 or float64, not {probs.dtype}")
    probs, labels = cp.ascontiguousarray(probs), cp.ascontiguousarray(labels, dtype=cp.int64)
    n, k = probs.shape
    dz = cp.empty((n, k), probs.dtype)
    if n and k:
        _SOFTMAX.get_function(f"softmax_grad<{C_TYPE[probs.dtype]}>")(
            (-(-(n * k) // 256),), (256,), (probs, labels, np.int64(n), np.int32(k),
                                            probs.dtype.type(default_scale(probs, scale)), dz))
    return dz


def sigmoid_xent_forward(z, t, scale=None):
    """Pixel cross-entropy of targets t in [0, 1] against y = sigmoid(z), from logits.

    Returns (loss, y) as the reference, the loss a 0-d float64 array.
    """
    check_same_shape("sigmoid_xent_forward", z, t)
    return _scaled_total("sigmoid_xent", z, t, default_scale(z, scale)), _sigmoid(z)


def sigmoid_xent_forward_blocks(z, t, starts, scale=None):
    """:func:`sigmoid_xent_forward` of each block of rows starts[b]:starts[b + 1]: ([one 0-d
    loss per block], y of every row), three launches for all blocks where one block's call
    takes the compiled kernels, with each block's bits (y is element-wise: the same bits in
    one launch)."""
    if not _blocks_take_kernels("sigmoid_xent", z, t):
        return sigmoid_xent_forward_blocks_via(sigmoid_xent_forward, _sigmoid, z, t, starts, scale)
    check_same_shape("sigmoid_xent_forward_blocks", z, t)
    return _scaled_totals_blocks("sigmoid_xent_forward_blocks", "sigmoid_xent", z, t, starts, scale, 1.0), _sigmoid(z)


def sigmoid_xent_backward(y, t, scale=None):
    """d loss / d z from y = sigmoid(z): scale * (y - t)."""
    check_same_shape("sigmoid_xent_backward", y, t)
    return _scaled_diff(y, t.astype(y.dtype, copy=False), y.dtype.type(default_scale(y, scale)))
