"""Restricted Boltzmann machine kernels (CuPy): cuBLAS GEMMs + fused element-wise kernels.

Same semantics as :mod:`kernels.ref.rbm`. Bias + nonlinearity + sampling is one kernel
per layer visit; the two statistics of the weight gradient are one GEMM over the stacked
batch [vk; v0]^T @ [hk; -h0], added into dW by one fused kernel (rbm_cd_backward). Both
bias gradients and the squared error are one kernel over the stacked chain; in
rbm_cd_update the same launch takes the biases' steps and W's velocity, weight cost and
step (a launch costs the host more time than a batch-100 kernel takes on the GPU).
Subnormal probabilities are kept (GPUs take no assists for them; the numba set zeroes
float32 ones below 2**-100).

sq_err comes back as a 0-d float64 array on the device, not a Python float: reading it
waits for the GPU, and a step that waited each time ran at the speed of its launches
plus its kernels instead of the larger of the two (the caller sums it where it lives).

CD-1 on float32 blocks of at most :data:`.rowprod.MAX_ROWS` rows (the data-parallel
trainer's 8 blocks of a batch of 100) takes the row kernels instead of cuBLAS: a row's
products do not depend on the rows beside it, so every block's chain goes through one
launch per product, and one launch stacks the blocks' factors with their bias gradients
and errors (``_stack_blocks``), where block by block a step was about ten launches a block.
"""
import sys

import cupy as cp
import numpy as np

from ..ref.rbm import cd_factors_by_block, cd_update_blocks_via, cd_update_via, check_cd, check_cd_blocks, check_rbm
from ..ref.blocksum import most_rows
from .rowprod import MAX_ROWS, on_device, rows_times, rows_times_t
from .c_types import C_TYPE
from .gemm import matmul
from .loss import _scaled_total

__all__ = ["rbm_hidden", "rbm_visible", "rbm_free_energy", "rbm_cd_backward", "rbm_cd_factors",
           "rbm_cd_factors_blocks", "rbm_cd_update", "rbm_cd_update_blocks"]

# sigmoid from exp of a non-positive argument only: no overflow in float32
_SIGMOID = "T e = exp(-fabs(a)); h = (a >= 0 ? (T)1 : e) / ((T)1 + e);"

_bern_hidden = cp.ElementwiseKernel(
    "T z, T b", "T h", f"T a = z + b; {_SIGMOID}", "aepar_rbm_bern_hidden")
_bern_hidden_sample = cp.ElementwiseKernel(
    "T z, T b, U u", "T h, T s", f"T a = z + b; {_SIGMOID} s = h > u ? (T)1 : (T)0;",
    "aepar_rbm_bern_hidden_sample")
# the chain's first visit: -h0 (the stacked statistics' sign) and the sampled states
_bern_first = cp.ElementwiseKernel(
    "T z, T b, U u", "T nh, T s", f"T a = z + b; T h; {_SIGMOID} nh = -h; s = h > u ? (T)1 : (T)0;",
    "aepar_rbm_bern_first")
_gauss_first = cp.ElementwiseKernel(
    "T z, T b, U eps", "T nh, T s", "T h = z + b; nh = -h; s = h + (T)eps;", "aepar_rbm_gauss_first")
_gauss_hidden = cp.ElementwiseKernel(
    "T z, T b", "T h", "h = z + b;", "aepar_rbm_gauss_hidden")
_gauss_hidden_sample = cp.ElementwiseKernel(
    "T z, T b, U eps", "T h, T s", "h = z + b; s = h + (T)eps;", "aepar_rbm_gauss_hidden_sample")
_visible = cp.ElementwiseKernel(
    "T z, T b", "T h", f"T a = z + b; {_SIGMOID}", "aepar_rbm_visible")
_axpy = cp.ElementwiseKernel("T g, T alpha", "T d", "d += alpha * g;", "aepar_rbm_axpy")


def _sq_err(v, v0):
    """sum (v - v0)^2 as a 0-d float64 array, by rows then the rows (cp/loss.py says why)."""
    return _scaled_total("sq_diff", v, v0, 1.0)


# The step's last kernel. Its first blocks take the biases: the column sums over the
# stacked chain vs = [vk; v0] (2b x nv), hs = [hk; -h0] (2b x nh), gv = sum_r (vk - v0)[r],
# gh = sum_r hs[r], and the squared error sum (vk - v0)^2. Such a block is 8 columns x 128
# row strides (a warp reads 4 rows of 32 bytes: whole sectors, and 2-4x more blocks than
# 32 columns would give); the strides' partial sums meet in shared memory in a fixed order,
# in double. Each visible block leaves its error in err[block]; the last to finish (a
# counter, reset by it) adds them in block order into err[tiles_v]: the same bits every
# run, no reduction kernel after it. mode 0 (a gradient): p += scale * g; mode 1 (a step,
# scale = lr / batch): vel = momentum * vel - scale * g; p += vel. The blocks after them
# (a step only) take W's momentum step, vel = momentum vel + a G - c W; W += vel (G: the
# stacked statistics vs.T @ hs, a = -lr / batch, c = lr * weight cost): one launch less.
_COLUMNS = r"""
#define COLS 8
#define STRIDES 128
typedef double Strides[2][STRIDES][COLS + 1];
// this thread's column of tile blockIdx.x (the visible units' tiles first, then the
// hidden's) and its first row stride
struct ColumnTile { int col, row, j, width; bool visible; };
__device__ ColumnTile aepar_rbm_tile(int nv, int nh, int tiles_v) {
    ColumnTile t;
    t.col = threadIdx.x % COLS; t.row = threadIdx.x / COLS;
    t.visible = (int)blockIdx.x < tiles_v;
    t.width = t.visible ? nv : nh;
    t.j = (t.visible ? blockIdx.x : blockIdx.x - tiles_v) * COLS + t.col;
    return t;
}
// the strides' partial sums g and e of a column, added in a fixed order (row 0's are then
// the column's)
__device__ void aepar_rbm_strides(Strides &part, double &g, double &e, int row, int col) {
    part[0][row][col] = g; part[1][row][col] = e;
    __syncthreads();
    if (row == 0)
        for (int k = 1; k < STRIDES; ++k) { g += part[0][k][col]; e += part[1][k][col]; }
}
// a visible tile's error (its columns' e, left in part[1][0][.]) into err[tile]; the last
// tile to finish (the counter, reset by it) adds them in tile order into err[tiles_v]
__device__ void aepar_rbm_errors(Strides &part, double *err, int tile, int tiles_v, unsigned int *done) {
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0.0;
        for (int k = 0; k < COLS; ++k) s += part[1][0][k];
        err[tile] = s;
        __threadfence();
        if (atomicAdd(done, 1u) == (unsigned)tiles_v - 1) {
            double total = 0.0;
            for (int k = 0; k < tiles_v; ++k) total += ((volatile double *)err)[k];
            err[tiles_v] = total;
            *done = 0u;
        }
    }
}
"""
_STEP_SOURCE = _COLUMNS + r"""
extern "C" __global__ void aepar_rbm_cd_step_NAME(const T *vs, const T *hs, long long b, int nv, int nh,
        T *pv, T *velv, T *ph, T *velh, double scale, double momentum, int mode, double *err, unsigned int *done,
        const T *G, T *W, T *velW, long long n_w, T a, T c) {
    __shared__ Strides part;
    const int tiles_v = (nv + COLS - 1) / COLS, tiles = tiles_v + (nh + COLS - 1) / COLS;
    if ((int)blockIdx.x >= tiles) {
        const T m = (T)momentum;
        const long long step = (long long)(gridDim.x - tiles) * blockDim.x;
        for (long long i = (long long)(blockIdx.x - tiles) * blockDim.x + threadIdx.x; i < n_w; i += step) {
            const T v = m * velW[i] + a * G[i] - c * W[i];
            velW[i] = v; W[i] += v;
        }
        return;
    }
    const ColumnTile t = aepar_rbm_tile(nv, nh, tiles_v);
    const int col = t.col, row = t.row, n = t.width, j = t.j;
    const bool visible = t.visible;
    double g = 0.0, e = 0.0;
    if (j < n) {
        if (visible) {
            for (long long r = row; r < b; r += STRIDES) {
                const double d = (double)vs[r * nv + j] - (double)vs[(r + b) * nv + j];
                g += d; e += d * d;
            }
        } else {
            for (long long r = row; r < 2 * b; r += STRIDES) g += (double)hs[r * nh + j];
        }
    }
    aepar_rbm_strides(part, g, e, row, col);
    if (row == 0) {
        if (j < n) {
            T *p = visible ? pv : ph, *vel = visible ? velv : velh;
            if (mode == 0) {
                p[j] += (T)(scale * g);
            } else {
                const T v = (T)momentum * vel[j] - (T)(scale * g);
                vel[j] = v; p[j] += v;
            }
        }
        part[1][0][col] = e;
    }
    if (visible)  // the same for the whole block
        aepar_rbm_errors(part, err, blockIdx.x, tiles_v, done);
}
"""
_step_kernels = {dt: cp.RawKernel(f"typedef {name} T;" + _STEP_SOURCE.replace("NAME", name),
                                  f"aepar_rbm_cd_step_{name}")
                 for dt, name in C_TYPE.items()}
_COLS, _THREADS, _W_PER_THREAD = 8, 1024, 4
_done_counters = {}  # per device: the step kernel's count of finished visible blocks (left at 0)

# Every block's chain stacked where rbm_cd_factors_blocks returns it (block b of rows
# lo..lo+n: rows 2 lo.. of vs [vk; v0] and of hs [hk; -h0]), with the block's bias
# gradients added into its own vectors (pointers pv[b], ph[b]) and its squared error into
# err[b * (tiles_v + 1) + tiles_v]: blockIdx.y is the block, blockIdx.x a tile of columns
# as in the step kernel, whose mode 0 sums these are, in the same order: a block has the
# bits it has alone, whatever blocks share the launch.
_STACK_SOURCE = _COLUMNS + r"""
extern "C" __global__ void aepar_rbm_stack_blocks_NAME(const T *v0, const T *vk, const T *nh0, const T *hk,
        const long long *starts, int nv, int nh, T *vs, T *hs, T *const *pv, T *const *ph, double scale,
        double *err, unsigned int *done) {
    __shared__ Strides part;
    const int tiles_v = (nv + COLS - 1) / COLS, blk = blockIdx.y;
    const long long lo = starts[blk], n = starts[blk + 1] - lo;
    const ColumnTile t = aepar_rbm_tile(nv, nh, tiles_v);
    const int col = t.col, row = t.row, width = t.width, j = t.j;
    const bool visible = t.visible;
    double g = 0.0, e = 0.0;
    if (j < width) {
        if (visible) {
            for (long long r = row; r < n; r += STRIDES) {
                const T last = vk[(lo + r) * nv + j], first = v0[(lo + r) * nv + j];
                vs[(2 * lo + r) * nv + j] = last;
                vs[(2 * lo + n + r) * nv + j] = first;
                const double d = (double)last - (double)first;
                g += d; e += d * d;
            }
        } else {
            for (long long r = row; r < 2 * n; r += STRIDES) {
                const T x = r < n ? hk[(lo + r) * nh + j] : nh0[(lo + r - n) * nh + j];
                hs[(2 * lo + r) * nh + j] = x;
                g += (double)x;
            }
        }
    }
    aepar_rbm_strides(part, g, e, row, col);
    if (row == 0) {
        if (j < width) (visible ? pv : ph)[blk][j] += (T)(scale * g);
        part[1][0][col] = e;
    }
    if (visible)  // the same for the whole block
        aepar_rbm_errors(part, err + (long long)blk * (tiles_v + 1), blockIdx.x, tiles_v, done + blk);
}
"""
_stack_kernels = {dt: cp.RawKernel(f"typedef {name} T;" + _STACK_SOURCE.replace("NAME", name),
                                   f"aepar_rbm_stack_blocks_{name}")
                  for dt, name in C_TYPE.items()}
_block_counters = {}  # per device: the stack kernel's counts, one per block (left at 0)


def _stack_blocks(v0, vk, nh0, hk, starts, scale, vs, hs, dbvs, dbhs):
    """One launch of the stack kernel; returns each block's sum (vk - v0)^2 as 0-d float64
    device arrays."""
    nv, nh, blocks = vs.shape[1], hs.shape[1], len(starts) - 1
    tiles_v = -(-nv // _COLS)
    device = cp.cuda.Device().id
    done = _block_counters.get(device)
    if done is None or done.size < blocks:
        done = _block_counters[device] = cp.zeros(max(blocks, 8), dtype=np.uint32)
    err = cp.empty((blocks, tiles_v + 1), dtype=np.float64)
    pointers = [on_device(tuple(a.data.ptr for a in arrays), np.uint64) for arrays in (dbvs, dbhs)]
    _stack_kernels[vs.dtype]((tiles_v - (-nh // _COLS), blocks), (_THREADS,), (
        v0, vk, nh0, hk, on_device(tuple(map(int, starts)), np.int64), np.int32(nv), np.int32(nh), vs, hs,
        pointers[0], pointers[1], np.float64(scale), err, done))
    return [err[b, tiles_v] for b in range(blocks)]


def _step(vs, hs, batch, pv, velv, ph, velh, scale, momentum, mode, G=None, W=None, velW=None, a=0.0, c=0.0):
    """One launch of the step kernel: the biases (mode 0: a gradient, ``velv``/``velh``
    not read; mode 1: their steps) and, given G, W's momentum step. Returns sum (vk - v0)^2
    as a 0-d float64 device array."""
    nv, nh, t = vs.shape[1], hs.shape[1], vs.dtype.type
    tiles_v = -(-nv // _COLS)
    device = cp.cuda.Device().id
    done = _done_counters.get(device)
    if done is None:
        done = _done_counters[device] = cp.zeros(1, dtype=np.uint32)
    n_w = 0 if G is None else W.size
    w_blocks = -(-n_w // (_THREADS * _W_PER_THREAD))
    err = cp.empty(tiles_v + 1, dtype=np.float64)
    if G is None:
        G = W = velW = vs  # (not read: no W blocks)
    _step_kernels[vs.dtype]((tiles_v - (-nh // _COLS) + w_blocks,), (_THREADS,), (
        vs, hs, np.int64(batch), np.int32(nv), np.int32(nh), pv, velv, ph, velh, np.float64(scale),
        np.float64(momentum), np.int32(mode), err, done, G, W, velW, np.int64(n_w), t(a), t(c)))
    return err[tiles_v]


def rbm_hidden(v, W, bh, hidden):
    """Hidden probabilities (bernoulli) or means (gaussian); see :func:`kernels.ref.rbm.rbm_hidden`."""
    check_rbm(v, W, bh=bh, hidden=hidden)
    v, W, dt = _prep(v, W)
    z = matmul(v, W)
    return (_bern_hidden if hidden == "bernoulli" else _gauss_hidden)(z, bh.astype(dt, copy=False))


def rbm_visible(h, W, bv):
    """Visible probabilities sigmoid(h @ W.T + bv); see :func:`kernels.ref.rbm.rbm_visible`."""
    if h.ndim != 2 or W.ndim != 2 or h.shape[1] != W.shape[1] or bv.shape != (W.shape[0],):
        raise ValueError(f"rbm_visible: h {h.shape}, W {W.shape}, bv {bv.shape} do not fit "
                         "(h: batch x n_hidden, W: n_visible x n_hidden, bv: n_visible)")
    h, W, dt = _prep(h, W)
    return _visible(matmul(h, W.T), bv.astype(dt, copy=False))


def rbm_free_energy(v, W, bv, bh, hidden):
    """F(v) per row, up to a constant; see :func:`kernels.ref.rbm.rbm_free_energy`."""
    check_rbm(v, W, bv=bv, bh=bh, hidden=hidden)
    v, W, dt = _prep(v, W)
    z = matmul(v, W) + bh.astype(dt, copy=False)
    hid = cp.logaddexp(0, z).sum(axis=1) if hidden == "bernoulli" else 0.5 * (z * z).sum(axis=1)
    return -(v @ bv.astype(dt, copy=False)) - hid


def rbm_cd_backward(v0, W, bv, bh, noise, hidden, dW, dbv, dbh, scale=None):
    """CD-k, k = noise.shape[0]; adds the negated CD update into dW, dbv, dbh.

    See :func:`kernels.ref.rbm.rbm_cd_backward` (``scale`` default 1/batch). Returns
    (h0, vk, sq_err) with sq_err a 0-d float64 device array.
    """
    check_rbm(v0, W, bv=bv, bh=bh, hidden=hidden)
    check_cd(v0, W, noise, dW, dbv, dbh)
    vs, hs, alpha, sq_err = rbm_cd_factors(v0, W, bv, bh, noise, hidden, dbv, dbh, scale)
    _axpy(matmul(vs.T, hs), vs.dtype.type(alpha), dW)
    batch = v0.shape[0]
    return -hs[batch:], vs[:batch], sq_err


def rbm_cd_factors(v0, W, bv, bh, noise, hidden, dbv, dbh, scale=None):
    """The chain of :func:`rbm_cd_backward` and its bias gradients (added into dbv, dbh);
    returns (vs, hs, alpha, sq_err) with the W gradient alpha * vs.T @ hs, vs = [vk; v0],
    hs = [hk; -h0], alpha = scale, sq_err a 0-d float64 device array. See
    :func:`kernels.ref.rbm.rbm_cd_factors`."""
    check_rbm(v0, W, bv=bv, bh=bh, hidden=hidden)
    check_cd(v0, W, noise, W, dbv, dbh, ("W", "dbv", "dbh"), "rbm_cd_factors")
    v0, W, dt = _prep(v0, W)
    batch = v0.shape[0]
    scale = 1.0 / batch if scale is None else float(scale)
    starts = np.array([0, batch], np.int64)
    if _by_rows(v0, W, noise, [dbv], [dbh], starts):
        vs, hs, alpha, errs = _factors_by_rows(v0, W, bv, bh, noise, hidden, [dbv], [dbh], starts, scale)
        return vs, hs, alpha, errs[0]
    vs, hs, first_err = _chain(v0, W, bv.astype(dt, copy=False), bh.astype(dt, copy=False), noise, hidden)
    if _fits(dt, dbv, dbh):
        err = _step(vs, hs, batch, dbv, dbv, dbh, dbh, scale, 0.0, 0)
    else:  # other dtypes or layouts: the same sums by CuPy
        v, h = vs[:batch], hs[:batch]
        dbv += (v.sum(axis=0) - vs[batch:].sum(axis=0)) * scale
        dbh += (h.sum(axis=0) + hs[batch:].sum(axis=0)) * scale
        err = None
    return vs, hs, scale, _sq_err_of(first_err, err, vs, batch)


def rbm_cd_factors_blocks(v0, W, bv, bh, noise, hidden, dbvs, dbhs, starts, scale=None):
    """:func:`rbm_cd_factors` of each block, stacked; see :func:`kernels.ref.rbm.rbm_cd_factors_blocks`.
    Where every block would take the row kernels alone, all blocks' chains take one
    launch per product; otherwise block by block (cuBLAS's rows may depend on the rows
    beside them)."""
    check_rbm(v0, W, bv=bv, bh=bh, hidden=hidden)
    starts = check_cd_blocks(v0, noise, dbvs, dbhs, starts)
    if _by_rows(v0, W, noise, dbvs, dbhs, starts):
        shapes = ((W.shape[0],), (W.shape[1],))
        for b, (dbv, dbh) in enumerate(zip(dbvs, dbhs)):  # the whole check once, then the shapes that differ
            if b == 0 or (dbv.shape, dbh.shape) != shapes:
                check_cd(v0, W, noise, W, dbv, dbh, ("W", "dbv", "dbh"), "rbm_cd_factors_blocks")
        scale = 1.0 / v0.shape[0] if scale is None else float(scale)
        return _factors_by_rows(v0, W, bv, bh, noise, hidden, dbvs, dbhs, starts, scale)
    return cd_factors_by_block(rbm_cd_factors, cp, v0, W, bv, bh, noise, hidden, dbvs, dbhs, starts, scale)


def rbm_cd_update_blocks(v0, W, bv, bh, noise, hidden, starts, merges, vW, vbv, vbh, lr, momentum, weight_cost,
                         scale=None):
    """The blocks' CD step, in place; see :func:`kernels.ref.rbm.rbm_cd_update_blocks`: this
    set's kernels one after another (each one launch or a few for all the blocks)."""
    return cd_update_blocks_via(sys.modules[__package__], cp, v0, W, bv, bh, noise, hidden, starts, merges,
                                vW, vbv, vbh, lr, momentum, weight_cost, scale)


def _by_rows(v0, W, noise, dbvs, dbhs, starts):
    """Whether CD on these blocks takes the row kernels: CD-1, float32 throughout (the bias
    gradients C-ordered), every block at most :data:`.rowprod.MAX_ROWS` rows."""
    if noise.shape[0] != 1 or not (v0.dtype == W.dtype == np.float32) or not len(dbvs):
        return False
    if not all(a.dtype == np.float32 and a.flags.c_contiguous for a in (*dbvs, *dbhs)):
        return False
    return most_rows(starts) <= MAX_ROWS


def _factors_by_rows(v0, W, bv, bh, noise, hidden, dbvs, dbhs, starts, scale):
    """:func:`rbm_cd_factors_blocks` of CD-1 by the row kernels: each product one launch
    for all blocks, each element-wise kernel one, and one to stack the factors."""
    bern = hidden == "bernoulli"
    v0, W = cp.ascontiguousarray(v0), cp.ascontiguousarray(W)
    bv, bh = bv.astype(np.float32, copy=False), bh.astype(np.float32, copy=False)
    M, (nv, nh) = v0.shape[0], W.shape
    nh0, state = cp.empty((M, nh), np.float32), cp.empty((M, nh), np.float32)
    (_bern_first if bern else _gauss_first)(rows_times(v0, W), bh, noise[0], nh0, state)
    vk = _visible(rows_times_t(state, W), bv)
    hk = (_bern_hidden if bern else _gauss_hidden)(rows_times(vk, W), bh)
    vs, hs = cp.empty((2 * M, nv), np.float32), cp.empty((2 * M, nh), np.float32)
    errs = _stack_blocks(v0, vk, nh0, hk, starts, scale, vs, hs, dbvs, dbhs)
    return vs, hs, scale, errs


def rbm_cd_update(v0, W, bv, bh, noise, hidden, vW, vbv, vbh, lr, momentum, weight_cost):
    """CD-k and its SGD-with-momentum step, in place; see :func:`kernels.ref.rbm.rbm_cd_update`.

    One GEMM for both statistics, then one kernel for the velocity, the weight cost and the
    step of W and the biases' gradients and steps. Returns sq_err, a 0-d float64 device
    array (no wait for the GPU).
    """
    check_rbm(v0, W, bv=bv, bh=bh, hidden=hidden)
    check_cd(v0, W, noise, vW, vbv, vbh, names=("vW", "vbv", "vbh"))
    dt = np.result_type(v0.dtype, W.dtype)
    dt = dt if dt.kind == "f" else np.dtype(np.float64)
    if not (_fits(dt, W, bv, bh, vW, vbv, vbh)):
        # odd layouts or dtypes: the same step through the gradient
        return cd_update_via(rbm_cd_backward, v0, W, bv, bh, noise, hidden, vW, vbv, vbh,
                             lr, momentum, weight_cost)
    v0 = cp.ascontiguousarray(v0, dtype=dt)
    batch = v0.shape[0]
    vs, hs, first_err = _chain(v0, W, bv, bh, noise, hidden)
    # vs.T @ hs = vk.T @ hk - v0.T @ h0 = batch * dW (without the weight cost)
    err = _step(vs, hs, batch, bv, vbv, bh, vbh, lr / batch, momentum, 1, G=matmul(vs.T, hs), W=W, velW=vW,
                a=-lr / batch, c=lr * weight_cost)
    return _sq_err_of(first_err, err, vs, batch)


def _fits(dt, *arrays):
    """Whether the fused kernels take these arrays as they are (dtype ``dt``, C order)."""
    return all(a.dtype == dt and a.flags.c_contiguous for a in arrays)


def _sq_err_of(first_err, bias_err, vs, batch):
    """sq_err of the first reconstruction: the bias kernel's when the chain is one step long
    (its vk is that reconstruction), else the chain's own (CD-k, k > 1)."""
    if first_err is not None:
        return first_err
    return bias_err if bias_err is not None else _sq_err(vs[:batch], vs[batch:])


def _chain(v0, W, bv, bh, noise, hidden):
    """The CD-k chain: (vs = [vk; v0], hs = [hk; -h0], sq_err of the first reconstruction
    on the device for k > 1, None for k = 1: the bias kernel sums it then); one GEMM
    vs.T @ hs then gives vk.T @ hk - v0.T @ h0."""
    bern = hidden == "bernoulli"
    first = _bern_first if bern else _gauss_first
    sample = _bern_hidden_sample if bern else _gauss_hidden_sample
    hid = _bern_hidden if bern else _gauss_hidden
    batch, k, dt = v0.shape[0], noise.shape[0], W.dtype
    vs = cp.empty((2 * batch, v0.shape[1]), dtype=dt)
    hs = cp.empty((2 * batch, W.shape[1]), dtype=dt)
    v, h = vs[:batch], hs[:batch]
    vs[batch:] = v0
    state = cp.empty((batch, W.shape[1]), dtype=dt)
    first(matmul(v0, W), bh, noise[0], hs[batch:], state)  # a kernel's outputs: all or none
    sq_err = None
    for i in range(k):
        _visible(matmul(state, W.T), bv, v)
        if i == 0 and k > 1:
            sq_err = _sq_err(v, v0)
        if i + 1 < k:
            h, state = sample(matmul(v, W), bh, noise[i + 1], h, state)
        else:
            hid(matmul(v, W), bh, h)
    return vs, hs, sq_err


def _prep(a, W):
    dt = np.result_type(a.dtype, W.dtype)
    if dt.kind != "f":
        dt = np.dtype(np.float64)
    return cp.ascontiguousarray(a, dtype=dt), cp.ascontiguousarray(W, dtype=dt), dt
