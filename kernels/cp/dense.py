"""Fully connected layer a = act(x @ W + b), forward and backward, and a tied autoencoder
layer's whole step (CuPy).

Products go to cuBLAS through :func:`.gemm.matmul` (a weight gradient added into dW by its
GEMM); bias + activation is one element-wise kernel applied in place on the product (b
broadcast along the rows). Float32 blocks of at most :data:`.rowprod.MAX_ROWS` rows take
the row kernels instead (:mod:`.rowprod`), whose rows do not depend on the rows beside
them: the blocks of a step then go through one launch per product and per kernel, where
block by block each was its own.
"""
import sys

import cupy as cp
import numpy as np

from ..ref.activation import check_act
from ..ref.blocksum import check_starts, most_rows
from ..ref.dense import (_check_backward_shapes, _check_shapes, backward_by_block, check_tied_ae, forward_by_block,
                         tied_ae_factors_blocks_via, tied_ae_update_blocks_via, tied_ae_update_via)
from .rowprod import MAX_ROWS, on_device, rows_times, rows_times_t
from .activation import RELU_BODY, SIGMOID_BODY
from .c_types import C_TYPE
from .gemm import matmul
from .loss import _scaled_sum

__all__ = ["dense_forward", "dense_backward", "dense_backward_factors", "dense_forward_blocks",
           "dense_backward_blocks", "tied_ae_update", "tied_ae_factors_blocks", "tied_ae_update_blocks"]

# z is read and written: an output argument of an ElementwiseKernel may be read
_BIAS_ACT = {
    "sigmoid": cp.ElementwiseKernel("T b", "T z", "T v = z + b; " + SIGMOID_BODY.format(out="z"),
                                    "aepar_bias_sigmoid"),
    "relu": cp.ElementwiseKernel("T b", "T z", "T v = z + b; " + RELU_BODY.format(out="z"),
                                 "aepar_bias_relu"),
    "identity": cp.ElementwiseKernel("T b", "T z", "z += b", "aepar_bias_identity"),
}
# dz = da * act'(a) and db += the column sums of dz (in double, a fixed order) in one launch:
# CuPy's axis-0 sum and the casts around it were three launches and, at 5000 rows, slow.
# A block takes COLS columns; its threads take every STRIDES-th row of them. The blocks'
# kernel does the same for each block of rows (blockIdx.y), into that block's own db: a
# block's sums are those it has alone.
_DZ_SOURCE = r"""
#define COLS 8
#define STRIDES 128
__device__ void aepar_dense_dz_cols(const T *da, const T *a, T *dz, long long lo, long long rows, int cols, int act,
                                    T *db) {
    __shared__ double part[STRIDES][COLS + 1];
    const int col = threadIdx.x % COLS, row = threadIdx.x / COLS;
    const int j = blockIdx.x * COLS + col;
    double g = 0.0;
    if (j < cols) {
        for (long long r = row; r < rows; r += STRIDES) {
            const long long i = (lo + r) * cols + j;
            T d = da[i];
            if (act == 1) d = d * a[i] * ((T)1 - a[i]);  /* sigmoid */
            else if (act == 2) d = a[i] > (T)0 ? d : (T)0;  /* relu */
            dz[i] = d;
            g += (double)d;
        }
    }
    part[row][col] = g;
    __syncthreads();
    if (row == 0 && j < cols) {
        for (int k = 1; k < STRIDES; ++k) g += part[k][col];
        db[j] += (T)g;
    }
}
extern "C" __global__ void aepar_dense_dz_NAME(const T *da, const T *a, T *dz, long long rows, int cols,
                                               int act, T *db) {
    aepar_dense_dz_cols(da, a, dz, 0, rows, cols, act, db);
}
extern "C" __global__ void aepar_dense_dz_blocks_NAME(const T *da, const T *a, T *dz, const long long *starts,
                                                      int cols, int act, T *const *dbs) {
    const long long lo = starts[blockIdx.y];
    aepar_dense_dz_cols(da, a, dz, lo, starts[blockIdx.y + 1] - lo, cols, act, dbs[blockIdx.y]);
}
"""
_dz_kernels = {(dt, kind): cp.RawKernel(f"typedef {name} T;" + _DZ_SOURCE.replace("NAME", name),
                                        f"aepar_dense_dz{kind}_{name}")
               for dt, name in C_TYPE.items() for kind in ("", "_blocks")}
_ACT_CODE = {"identity": 0, "sigmoid": 1, "relu": 2}


def _dz_and_bias(da, a, act, db):
    """dz = da * act'(a) as a new array; adds dz's column sums (taken in double) into ``db``."""
    da, a = cp.ascontiguousarray(da), cp.ascontiguousarray(a.astype(da.dtype, copy=False))
    dz = cp.empty_like(da)
    if da.size == 0:
        return dz
    rows, cols = da.shape
    # the kernel adds into a contiguous vector of dz's type (a parameter's own gradient is one)
    into = db if db.flags.c_contiguous and db.dtype == da.dtype else cp.zeros(cols, da.dtype)
    _dz_kernels[da.dtype, ""]((-(-cols // 8),), (1024,), (da, a, dz, np.int64(rows), np.int32(cols),
                                                            np.int32(_ACT_CODE[act]), into))
    if into is not db:
        db += into.astype(db.dtype, copy=False)
    return dz


def _by_rows(x, W, starts, dbs=()):
    """Whether these blocks take the row kernels: float32 throughout (W C-ordered or a
    transposed view, the bias gradients C-ordered), every block at most
    :data:`.rowprod.MAX_ROWS` rows."""
    if not (x.dtype == W.dtype == np.float32 and x.ndim == W.ndim == 2) or len(starts) < 2:
        return False
    if not (W.flags.c_contiguous or W.flags.f_contiguous):
        return False
    if not all(db.dtype == np.float32 and db.flags.c_contiguous for db in dbs):
        return False
    return most_rows(starts) <= MAX_ROWS  # (offsets checked once and kept: NumPy's diff cost more)


def _row_product(a, B):
    """a @ B by the row kernels, B C-ordered or a transposed view (the same sums either way)."""
    a = cp.ascontiguousarray(a)
    return rows_times(a, B) if B.flags.c_contiguous else rows_times_t(a, B.T)


def dense_forward(x, W, b, act):
    """a = act(x @ W + b); x (batch, in), W (in, out), b (out,). Returns a new array."""
    return _forward(x, W, b, act, _by_rows(x, W, (0, x.shape[0])))


def _forward(x, W, b, act, by_rows):
    check_act(act)
    _check_shapes(x, W, b)
    z = _row_product(x, W) if by_rows else matmul(x, W)
    _BIAS_ACT[act](b.astype(z.dtype, copy=False), z)
    return z


def dense_backward(da, x, W, a, act, dW, db, need_dx=True):
    """Backward of :func:`dense_forward` from its output ``a``.

    Adds x.T @ dz into ``dW`` and the column sums of dz into ``db`` (caller-zeroed),
    with dz = da * act'(a). Returns dx = dz @ W.T, or None when ``need_dx`` is false.
    """
    _check_backward_shapes(da, x, W, a, dW, db)
    dx, dz = dense_backward_factors(da, x, W, a, act, db, need_dx)
    matmul(x.T, dz, out=dW, accumulate=True)
    return dx


def dense_backward_factors(da, x, W, a, act, db, need_dx=True):
    """:func:`dense_backward` without its weight product: adds into ``db``, returns
    (dx or None, dz) with the W gradient x.T @ dz (see kernels.ref.dense)."""
    check_act(act)
    _check_backward_shapes(da, x, W, a, W, db)
    dz = _dz_and_bias(da, a, act, db)
    if not need_dx:
        return None, dz
    return (_row_product(dz, W.T) if _by_rows(dz, W, (0, dz.shape[0])) else matmul(dz, W.T)), dz


def dense_forward_blocks(x, W, b, act, starts):
    """:func:`dense_forward` of each block, stacked (see kernels.ref.dense): where every
    block would take the row kernels alone, one call for all."""
    if len(starts) > 2 and _by_rows(x, W, starts):
        check_starts("dense blocks", x.shape[0], starts)
        return _forward(x, W, b, act, True)
    return forward_by_block(dense_forward, cp, x, W, b, act, starts)


def dense_backward_blocks(da, x, W, a, act, dbs, starts, need_dx=True):
    """:func:`dense_backward_factors` of each block, stacked (see kernels.ref.dense): where
    every block would take the row kernels alone, one launch for all blocks' dz and bias
    gradients (each block's sums its own) and one for dx."""
    if len(starts) > 2 and _by_rows(da, W, starts, dbs) and len(dbs) == len(starts) - 1 and da.size:
        check_act(act)
        starts = check_starts("dense blocks", x.shape[0], starts)
        _check_backward_shapes(da, x, W, a, W, dbs[0])
        if any(db.shape != dbs[0].shape for db in dbs):
            raise ValueError(f"dense blocks: bias gradients of shapes {[db.shape for db in dbs]}")
        da, a = cp.ascontiguousarray(da), cp.ascontiguousarray(a.astype(da.dtype, copy=False))
        dz = cp.empty_like(da)
        cols = da.shape[1]
        _dz_kernels[da.dtype, "_blocks"]((-(-cols // 8), len(dbs)), (1024,), (
            da, a, dz, on_device(tuple(map(int, starts)), np.int64), np.int32(cols), np.int32(_ACT_CODE[act]),
            on_device(tuple(db.data.ptr for db in dbs), np.uint64)))
        return (_row_product(dz, W.T) if need_dx else None), dz
    return backward_by_block(dense_backward_factors, cp, da, x, W, a, act, dbs, starts, need_dx)


# The tied autoencoder's step (tied_ae_update): after each product, one kernel takes a layer's
# columns as _DZ_SOURCE does and also steps that layer's bias (its gradient is the column
# sums, and no later kernel of the step reads it). mode 0, the output: y = sigmoid(z + b)
# against the target t, dz = scale (y - t) y (1 - y), and each column's squared error into
# ecol; mode 1: sigmoid code units a, dz = z a (1 - a); mode 2: identity code units, dz = z.
# dz is written over z.
_AE_COLS_SOURCE = r"""
#define COLS 8
#define STRIDES 128
extern "C" __global__ void aepar_tied_ae_cols_NAME(T *z, const T *t, const T *a, long long rows, int cols,
        int mode, double scale, T *b, T *vel, double lr, double momentum, double *ecol) {
    __shared__ double part[2][STRIDES][COLS + 1];
    const int col = threadIdx.x % COLS, row = threadIdx.x / COLS;
    const int j = blockIdx.x * COLS + col;
    double g = 0.0, e = 0.0;
    if (j < cols) {
        const T bj = b[j];
        for (long long r = row; r < rows; r += STRIDES) {
            const long long i = r * cols + j;
            T d;
            if (mode == 0) {
                const T v = z[i] + bj;
                const T ex = exp(-fabs(v));
                const T s = (T)1 / ((T)1 + ex);
                const T y = v >= (T)0 ? s : ex * s;
                const double diff = (double)y - (double)t[i];
                e += diff * diff;
                const T dy = (T)scale * (y - t[i]);
                d = dy * y * ((T)1 - y);
            } else if (mode == 1) {
                d = z[i] * a[i] * ((T)1 - a[i]);
            } else {
                d = z[i];
            }
            z[i] = d;
            g += (double)d;
        }
    }
    part[0][row][col] = g;
    part[1][row][col] = e;
    __syncthreads();
    if (row == 0 && j < cols) {
        for (int k = 1; k < STRIDES; ++k) { g += part[0][k][col]; e += part[1][k][col]; }
        const T v = (T)momentum * vel[j] - (T)(lr * g);
        vel[j] = v;
        b[j] += v;
        if (mode == 0) ecol[j] = e;
    }
}
"""
_ae_cols = {dt: cp.RawKernel(f"typedef {name} T;" + _AE_COLS_SOURCE.replace("NAME", name),
                             f"aepar_tied_ae_cols_{name}")
            for dt, name in C_TYPE.items()}
# W's step from its two gradient parts, without adding them into an array first
_sgd_two_parts = cp.ElementwiseKernel(
    "T g1, T g2, T lr, T momentum, T decay", "T p, T v",
    "v = momentum * v - lr * ((g1 + g2) + decay * p); p += v;", "aepar_tied_ae_step_w")


def _columns(z, t, a, mode, scale, b, vel, lr, momentum, ecol):
    rows, cols = z.shape
    _ae_cols[z.dtype]((-(-cols // 8),), (1024,), (z, t, a, np.int64(rows), np.int32(cols), np.int32(mode),
                                                   np.float64(scale), b, vel, np.float64(lr),
                                                   np.float64(momentum), ecol))


def tied_ae_update(x, W, bv, bh, code_act, vW, vbv, vbh, lr, momentum, weight_cost):
    """:func:`kernels.ref.dense.tied_ae_update` in ten launches: five products, the code
    units' bias and activation, two column kernels (each steps its bias), W's step and the
    error's sum, a 0-d float64 device array (no wait for the GPU); the blocked trainer's
    step took about twenty. Odd layouts or dtypes take the reference's order with this
    set's kernels."""
    check_tied_ae(x, W, bv, bh, code_act, vW, vbv, vbh)
    dt = W.dtype
    if dt.kind != "f" or not all(p.dtype == dt and p.flags.c_contiguous for p in (W, bv, bh, vW, vbv, vbh)):
        return tied_ae_update_via(sys.modules[__package__], x, W, bv, bh, code_act, vW, vbv, vbh,
                                  lr, momentum, weight_cost)
    x = cp.ascontiguousarray(x, dtype=dt)
    batch = x.shape[0]
    h = matmul(x, W)
    _BIAS_ACT[code_act](bh, h)  # h = act(x W + bh)
    dz2 = matmul(h, W.T)  # z2; the output kernel leaves dz2 there
    ecol = cp.empty(W.shape[0], dtype=cp.float64)
    _columns(dz2, x, dz2, 0, 1.0 / batch, bv, vbv, lr, momentum, ecol)
    dz1 = matmul(dz2, W)  # dh (W before its step); the code kernel leaves dz1 there
    _columns(dz1, dz1, h, 1 if code_act == "sigmoid" else 2, 1.0, bh, vbh, lr, momentum, ecol)
    t = dt.type
    _sgd_two_parts(matmul(x.T, dz1), matmul(dz2.T, h), t(lr), t(momentum), t(weight_cost), W, vW)
    return _scaled_sum(ecol, 1.0)  # the columns' errors (double), summed


def tied_ae_update_blocks(x, W, bv, bh, code_act, starts, merges, vW, vbv, vbh, lr, momentum, weight_cost, scale):
    """The blocks' step of a tied autoencoder layer, in place; see
    :func:`kernels.ref.dense.tied_ae_update_blocks`: this set's kernels one after the other."""
    return tied_ae_update_blocks_via(sys.modules[__package__], cp, x, W, bv, bh, code_act, starts, merges, vW, vbv,
                                     vbh, lr, momentum, weight_cost, scale)


def tied_ae_factors_blocks(x, W, bv, bh, code_act, dbvs, dbhs, starts, scale):
    """:func:`kernels.ref.dense.tied_ae_factors_blocks` with this set's block kernels."""
    return tied_ae_factors_blocks_via(sys.modules[__package__], x, W, bv, bh, code_act, dbvs, dbhs, starts, scale)
