"""2-D convolution, transposed convolution and 2x2 max-pooling, NCHW (Numba).

im2col + BLAS GEMM. im2col fills ``cols[b, (c*kh + i)*kw + j, p]`` for a chunk of images
(P = Ho*Wo output pixels), so per image W2 (Cout, Cin*kh*kw) @ cols[b] lands directly in
NCHW y[n] (Cout, P) with no repacking, and dy[n] (Cout, P) is already the GEMM operand of
the backward. For LeNet-sized layers (3x3, 1-64 channels, 28x28, batch 100) this is many
times faster than direct loops over (n, cout) on one core. Chunks keep cols near 2**20 elements.

All GEMMs run inside @njit (numba's np.dot, i.e. scipy's BLAS) so one BLAS thread pool is
used; the copies (im2col, col2im) are parallel over independent planes when that is safe
(see ``_copies``).
Semantics, shapes and argmax encoding are those of the reference, :mod:`kernels.ref.conv`.
"""
import math
import os
import threading

import numpy as np
from numba import get_num_threads, njit, prange

from ..ref.conv import (check_bias, check_conv_starts, check_grad_shapes, check_nchw, conv_geometry,
                        transpose_geometry)
from .codegen import compiled_as

__all__ = ["conv2d_forward", "conv2d_backward", "conv2d_transpose_forward",
           "conv2d_transpose_backward", "maxpool2x2_forward", "maxpool2x2_backward",
           "conv2d_forward_blocks", "conv2d_backward_blocks", "conv2d_transpose_forward_blocks",
           "conv2d_transpose_backward_blocks"]

_COLS_ELEMENTS = 1 << 20   # target size of one chunk's im2col matrix (elements)


def conv2d_forward(x, W, b, stride=1, pad=0):
    """y = conv2d(x, W) + b; see :func:`kernels.ref.conv.conv2d_forward`."""
    Ho, Wo = conv_geometry(x.shape, W.shape, stride, pad)
    check_bias(b, W.shape[0])
    x, W2, dt = _prep(x, W)
    y = np.empty((x.shape[0], W.shape[0], Ho, Wo), dtype=dt)
    _conv(x, W2, b.astype(dt), W.shape[2], W.shape[3], stride, pad, y, _chunk(W2.shape[1], Ho * Wo))
    return y


def conv2d_backward(dy, x, W, stride, pad, dW, db, need_dx=True):
    """Backward of :func:`conv2d_forward`: adds into ``dW``, ``db``; returns dx (None
    without ``need_dx``)."""
    return conv2d_backward_blocks(dy, x, W, stride, pad, [dW], [db], [0, x.shape[0]], need_dx)


def conv2d_backward_blocks(dy, x, W, stride, pad, dWs, dbs, starts, need_dx=True):
    """:func:`kernels.ref.conv.conv2d_backward_blocks` in one call: a block's weight
    gradient is its images' products added in image order from its own first image, as
    alone; dx is image by image anyway (without ``need_dx`` neither its products nor its
    col2im are made: a network's first layer)."""
    s = check_conv_starts(x, starts, dWs, dbs)
    Ho, Wo = conv_geometry(x.shape, W.shape, stride, pad)
    for dW, db in zip(dWs, dbs):
        check_grad_shapes(dy, (x.shape[0], W.shape[0], Ho, Wo), W, dW, db, W.shape[0])
    x, W2, dt = _prep(x, W)
    dy = np.ascontiguousarray(dy, dtype=dt)
    dx = np.empty(x.shape, dtype=dt) if need_dx else None
    _conv_grads(x, dy, W2, W.shape[2], W.shape[3], stride, pad, dWs, dbs, s, dx, False, _chunk(W2.shape[1], Ho * Wo))
    return dx


def conv2d_transpose_forward(x, W, b, stride=1, pad=0):
    """y = conv2d_transpose(x, W) + b; see :func:`kernels.ref.conv.conv2d_transpose_forward`."""
    yshape = transpose_geometry(x.shape, W.shape, stride, pad)
    check_bias(b, W.shape[1])
    x, W2, dt = _prep(x, W)
    y = np.empty(yshape, dtype=dt)
    _conv_adjoint(x, W2, b.astype(dt), W.shape[2], W.shape[3], stride, pad, y,
                  _chunk(W2.shape[1], x.shape[2] * x.shape[3]))
    return y


def conv2d_transpose_backward(dy, x, W, stride, pad, dW, db):
    """Backward of :func:`conv2d_transpose_forward`: adds into ``dW``, ``db``; returns dx."""
    return conv2d_transpose_backward_blocks(dy, x, W, stride, pad, [dW], [db], [0, x.shape[0]])


def conv2d_transpose_backward_blocks(dy, x, W, stride, pad, dWs, dbs, starts):
    """:func:`kernels.ref.conv.conv2d_transpose_backward_blocks` in one call (see
    :func:`conv2d_backward_blocks`)."""
    s = check_conv_starts(x, starts, dWs, dbs)
    yshape = transpose_geometry(x.shape, W.shape, stride, pad)
    for dW, db in zip(dWs, dbs):
        check_grad_shapes(dy, yshape, W, dW, db, W.shape[1])
    x, W2, dt = _prep(x, W)
    dy = np.ascontiguousarray(dy, dtype=dt)
    dx = np.empty(x.shape, dtype=dt)
    # the adjoint's gradients are conv2d's with dy in the role of the convolved input
    _conv_grads(dy, x, W2, W.shape[2], W.shape[3], stride, pad, dWs, dbs, s, dx, True,
                 _chunk(W2.shape[1], x.shape[2] * x.shape[3]))
    return dx


def conv2d_forward_blocks(x, W, b, stride, pad, starts):
    """:func:`kernels.ref.conv.conv2d_forward_blocks`: one call, each image's output its
    own product here whatever the batch."""
    check_conv_starts(x, starts)
    return conv2d_forward(x, W, b, stride, pad)


def conv2d_transpose_forward_blocks(x, W, b, stride, pad, starts):
    """:func:`kernels.ref.conv.conv2d_transpose_forward_blocks`: one call (as
    :func:`conv2d_forward_blocks`)."""
    check_conv_starts(x, starts)
    return conv2d_transpose_forward(x, W, b, stride, pad)


def maxpool2x2_forward(x):
    """2x2/stride-2 max-pooling; returns (y, argmax) as :func:`kernels.ref.conv.maxpool2x2_forward`."""
    check_nchw(x.shape, "maxpool2x2 input")
    N, C, H, W = x.shape
    y = np.empty((N, C, H // 2, W // 2), dtype=x.dtype)
    argmax = np.empty((N, C, H // 2, W // 2), dtype=np.int8)
    _maxpool_fwd(np.ascontiguousarray(x), y, argmax)
    return y, argmax


def maxpool2x2_backward(dy, argmax, x_shape):
    """Backward of :func:`maxpool2x2_forward`; returns dx of shape ``x_shape``."""
    check_nchw(x_shape, "maxpool2x2 x_shape")
    N, C, H, W = x_shape
    if dy.shape != (N, C, H // 2, W // 2) or argmax.shape != dy.shape:
        raise ValueError(f"maxpool2x2_backward: dy {dy.shape} and argmax {argmax.shape} must be "
                         f"{(N, C, H // 2, W // 2)} for x_shape {tuple(x_shape)}")
    dx = np.empty(tuple(x_shape), dtype=dy.dtype)
    _maxpool_bwd(np.ascontiguousarray(dy), np.ascontiguousarray(argmax, dtype=np.int8), dx)
    return dx


# ---- host-side helpers -----------------------------------------------------------------

def _prep(x, W):
    dt = np.result_type(x, W)
    W = np.ascontiguousarray(W, dtype=dt)
    return np.ascontiguousarray(x, dtype=dt), W.reshape(W.shape[0], -1), dt


def _chunk(K, P):
    """Images per chunk so that one chunk's cols (K, chunk*P) is about _COLS_ELEMENTS."""
    return max(1, _COLS_ELEMENTS // max(1, K * P))


def _wgrad_target(dW):
    """A (rows, Cin*kh*kw) view of dW to add into, or a zeroed scratch when dW is strided."""
    if dW.flags.c_contiguous:
        return dW.reshape(dW.shape[0], -1)
    return np.zeros((dW.shape[0], dW[0].size), dtype=dW.dtype)


def _wgrad_done(dW, dW2):
    if not np.shares_memory(dW, dW2):
        dW += dW2.reshape(dW.shape)


# ---- drivers: chunks of images; copies, then one GEMM per image ------------------------

_SCRATCH = threading.local()


def _scratch(slot, shape, dtype):
    """An uninitialised array for the cols of one call, kept per thread and reused.

    A fresh 1-2 MB np.empty per call came from mmap and was paid for in page faults on
    first touch: conv2d_backward of the CAE's second layer (13 images, 16 -> 32 channels,
    14x14) spent longer in them than in its copies and GEMMs. Plain Python on the shape
    (math.prod, not np.prod): with eight blocks a CAE step makes some 50 of these calls."""
    dtype = np.dtype(dtype)
    size = math.prod(shape)
    bufs = getattr(_SCRATCH, "bufs", None)
    if bufs is None:
        bufs = _SCRATCH.bufs = {}
    key = (slot, dtype.str)
    buf = bufs.get(key)
    if buf is None or buf.size < size:
        buf = bufs[key] = np.empty(size, dtype=dtype)
    return buf[:size].reshape(shape)


def _copies():
    """(im2col, col2im) compiled with prange where that pays, else serial.

    Parallel copies need an OpenMP runtime that sleeps when idle: with GNU OpenMP's default
    spin-wait, each hand-over from a parallel region to a multithreaded GEMM is costly (the
    spinning workers starve OpenBLAS's threads). One thread: serial. The environment is
    read first: Numba's get_num_threads costs more than the two lookups, on every call.
    """
    if ((os.environ.get("OMP_WAIT_POLICY", "").lower() == "passive"
         or os.environ.get("NUMBA_THREADING_LAYER", "") in ("tbb", "workqueue")) and get_num_threads() > 1):
        return _im2col_par, _col2im_par
    return _im2col, _col2im


def _conv(x, W2, bias, kh, kw, stride, pad, y, chunk):
    """y = conv2d(x) + bias: im2col a chunk, then y[n] (Cout, P) = W2 @ cols[n] per image."""
    im2col, _ = _copies()
    N, (Ho, Wo) = x.shape[0], y.shape[2:]
    y2 = y.reshape(N, W2.shape[0], Ho * Wo)
    cols = _scratch("cols", (min(chunk, N), W2.shape[1], Ho * Wo), x.dtype)
    for n0 in range(0, N, chunk):
        nb = min(chunk, N - n0)
        im2col(x, n0, nb, kh, kw, stride, pad, Ho, Wo, cols)
        _gemm_forward(W2, cols, nb, bias, y2[n0:n0 + nb])


def _conv_adjoint(g, W2, bias, kh, kw, stride, pad, y, chunk):
    """y = conv2d^T(g) + bias (y has the convolved input's shape): GEMM per image, col2im."""
    _, col2im = _copies()
    N, Co, Ho, Wo = g.shape
    g2 = g.reshape(N, Co, Ho * Wo)
    dcols = _scratch("dcols", (min(chunk, N), W2.shape[1], Ho * Wo), g.dtype)
    for n0 in range(0, N, chunk):
        nb = min(chunk, N - n0)
        _gemm_adjoint(W2, g2[n0:n0 + nb], dcols)
        col2im(dcols, n0, nb, kh, kw, stride, pad, Ho, Wo, bias, y)


def _conv_grads(a, g, W2, kh, kw, stride, pad, dWs, dbs, starts, da, transpose, chunk):
    """Gradients of conv2d(a) paired with g, block by block (images ``starts[k]`` to
    ``starts[k + 1]``): ``dWs[k]`` += sum over the block's n of g[n] @ cols(a)[n]^T, in
    image order from the block's first image, as alone, and ``dbs[k]`` += the block's
    rows of dy (= g, or a with ``transpose``) summed as over the block alone; and the input
    gradient of every image into ``da``: conv2d^T(g) (conv2d backward) or, with
    ``transpose``, conv2d(a) (conv2d_transpose backward, where a is dy and g is the layer
    input); ``da`` None: no input gradient. What does not depend on the block is set up
    once."""
    im2col, col2im = _copies()
    N, Co, Ho, Wo = g.shape
    P, K = Ho * Wo, W2.shape[1]
    g2 = g.reshape(N, Co, P)
    need_dx = da is not None
    if need_dx:
        da2 = da.reshape(N, da.shape[1], da.shape[2] * da.shape[3])  # also for no images
        zero = np.zeros(da.shape[1], dtype=a.dtype)
    else:  # the compiled loop's arrays of the same types, never touched
        da2 = np.empty((0, 0, 0), a.dtype)
    images = min(chunk, max(hi - lo for lo, hi in zip(starts[:-1], starts[1:])))
    cols = _scratch("cols", (images, K, P), a.dtype)
    dcols = _scratch("dcols", (1 if transpose or not need_dx else images, K, P), a.dtype)
    dy = a if transpose else g
    for lo, hi, dW, db in zip(starts[:-1], starts[1:], dWs, dbs):
        dW2 = _wgrad_target(dW)
        for n0 in range(lo, hi, chunk):
            nb = min(chunk, hi - n0)
            im2col(a, n0, nb, kh, kw, stride, pad, Ho, Wo, cols)
            _gemm_grads(W2, g2[n0:n0 + nb], cols, dW2, transpose, need_dx, da2[n0:n0 + nb], dcols)
            if need_dx and not transpose:
                col2im(dcols, n0, nb, kh, kw, stride, pad, Ho, Wo, zero, da)
        _wgrad_done(dW, dW2)
        db += dy[lo:hi].sum(axis=(0, 2, 3))


# ---- compiled GEMM blocks (BLAS; serial loops over the chunk's images) ------------------

@njit(cache=True, nogil=True)
def _gemm_forward(W2, cols, nb, bias, y2):
    for b in range(nb):
        np.dot(W2, cols[b], y2[b])
        for o in range(y2.shape[1]):
            for p in range(y2.shape[2]):
                y2[b, o, p] += bias[o]


@njit(cache=True, nogil=True)
def _gemm_adjoint(W2, g2, dcols):
    for b in range(g2.shape[0]):
        np.dot(W2.T, g2[b], dcols[b])


@njit(cache=True, nogil=True)
def _gemm_grads(W2, g2, cols, dW2, transpose, need_dx, da2, dcols):
    part = np.empty(dW2.shape, dtype=cols.dtype)
    for b in range(g2.shape[0]):
        np.dot(g2[b], cols[b].T, part)
        dW2 += part
        if not need_dx:
            continue
        if transpose:
            np.dot(W2, cols[b], da2[b])
        else:
            np.dot(W2.T, g2[b], dcols[b])


# ---- compiled copies: prange over independent (image, channel) planes -------------------

@njit(cache=True, nogil=True)
def _valid(n_out, stride, off, n_in):
    """Range [lo, hi) of output positions o with 0 <= o*stride + off < n_in."""
    lo = -(off // stride) if off < 0 else 0       # ceil(-off / stride)
    hi = (n_in - 1 - off) // stride + 1 if n_in - 1 - off >= 0 else 0
    return lo, max(lo, min(hi, n_out))


def _im2col_py(x, n0, nb, kh, kw, stride, pad, Ho, Wo, cols):
    """cols[b, (c*kh + i)*kw + j, ho*Wo + wo] = xpad[n0 + b, c, ho*stride + i, wo*stride + j];
    one (image, channel) plane per task, so its kh*kw rows reuse the plane from cache.
    Flat indices: rows are short (Wo ~ 7-28), and 4-D indexing cost more than the copy."""
    C, H, W = x.shape[1], x.shape[2], x.shape[3]
    P, K = Ho * Wo, C * kh * kw
    xf, cf = x.reshape(-1), cols.reshape(-1)
    # "same" geometry (stride 1, Wo == W): a tap's row is the plane shifted by (i-pad)*W +
    # j-pad, so it is one contiguous copy, then the pad columns the shift wrapped are zeroed
    same = stride == 1 and Wo == W
    for r in prange(nb * C):
        b, c = r // C, r % C
        src0 = ((n0 + b) * C + c) * H * W
        for i in range(kh):
            for j in range(kw):
                dst0 = (b * K + (c * kh + i) * kw + j) * P
                lo, hi = _valid(Wo, stride, j - pad, W)
                if same:
                    hlo, hhi = _valid(Ho, 1, i - pad, H)
                    shift = (i - pad) * W + j - pad
                    # the copy clipped to this plane; what it leaves out lies in pad columns
                    q0 = max(hlo * Wo, -shift)
                    q1 = max(q0, min(hhi * Wo, H * W - shift))
                    cf[dst0:dst0 + q0] = 0
                    cf[dst0 + q0:dst0 + q1] = xf[src0 + shift + q0:src0 + shift + q1]
                    cf[dst0 + q1:dst0 + P] = 0
                    for ho in range(hlo, hhi):
                        d = dst0 + ho * Wo
                        for wo in range(lo):
                            cf[d + wo] = 0
                        for wo in range(hi, Wo):
                            cf[d + wo] = 0
                    continue
                for ho in range(Ho):
                    h = ho * stride + i - pad
                    d = dst0 + ho * Wo
                    if h < 0 or h >= H:
                        for wo in range(Wo):
                            cf[d + wo] = 0
                        continue
                    for wo in range(lo):
                        cf[d + wo] = 0
                    s = src0 + h * W + j - pad
                    if stride == 1:   # unit-stride copy the compiler vectorises
                        for wo in range(lo, hi):
                            cf[d + wo] = xf[s + wo]
                    else:
                        for wo in range(lo, hi):
                            cf[d + wo] = xf[s + wo * stride]
                    for wo in range(hi, Wo):
                        cf[d + wo] = 0


def _col2im_py(dcols, n0, nb, kh, kw, stride, pad, Ho, Wo, bias, dx):
    """dx[n0 + b] = bias + scatter-add of dcols[b]; one (image, channel) plane per task,
    so no two tasks write the same element."""
    C, H, W = dx.shape[1], dx.shape[2], dx.shape[3]
    P, K = Ho * Wo, C * kh * kw
    df, cf = dx.reshape(-1), dcols.reshape(-1)
    same = stride == 1 and Wo == W   # as in im2col: one contiguous add per tap
    for r in prange(nb * C):
        b, c = r // C, r % C
        dst0 = ((n0 + b) * C + c) * H * W
        for q in range(H * W):
            df[dst0 + q] = bias[c]
        for i in range(kh):
            for j in range(kw):
                src0 = (b * K + (c * kh + i) * kw + j) * P
                lo, hi = _valid(Wo, stride, j - pad, W)
                if same:
                    hlo, hhi = _valid(Ho, 1, i - pad, H)
                    shift = (i - pad) * W + j - pad
                    # the columns that wrapped to a neighbouring row hold no tap: skip them
                    # by zeroing them in this scratch (adding 0 leaves dx as it was)
                    for ho in range(hlo, hhi):
                        s = src0 + ho * Wo
                        for wo in range(lo):
                            cf[s + wo] = 0
                        for wo in range(hi, Wo):
                            cf[s + wo] = 0
                    q0 = max(hlo * Wo, -shift)
                    q1 = min(hhi * Wo, H * W - shift)
                    dst, src = df[dst0 + shift + q0:dst0 + shift + q1], cf[src0 + q0:src0 + q1]
                    for q in range(src.size):
                        dst[q] += src[q]
                    continue
                for ho in range(Ho):
                    h = ho * stride + i - pad
                    if h < 0 or h >= H:
                        continue
                    s = src0 + ho * Wo
                    d = dst0 + h * W + j - pad
                    if stride == 1:
                        for wo in range(lo, hi):
                            df[d + wo] += cf[s + wo]
                    else:
                        for wo in range(lo, hi):
                            df[d + wo * stride] += cf[s + wo]


_im2col_par, _col2im_par = (compiled_as(f, "_par", parallel=True) for f in (_im2col_py, _col2im_py))
_im2col, _col2im = (compiled_as(f, "_serial") for f in (_im2col_py, _col2im_py))   # prange runs as range


@njit(cache=True, nogil=True, parallel=True)
def _maxpool_fwd(x, y, argmax):
    N, C, Ho, Wo = y.shape
    for r in prange(N * C):
        n, c = r // C, r % C
        for h in range(Ho):
            for w in range(Wo):
                # strict > keeps the first maximum, as numpy's argmax does
                best, a = x[n, c, 2 * h, 2 * w], 0
                if x[n, c, 2 * h, 2 * w + 1] > best:
                    best, a = x[n, c, 2 * h, 2 * w + 1], 1
                if x[n, c, 2 * h + 1, 2 * w] > best:
                    best, a = x[n, c, 2 * h + 1, 2 * w], 2
                if x[n, c, 2 * h + 1, 2 * w + 1] > best:
                    best, a = x[n, c, 2 * h + 1, 2 * w + 1], 3
                y[n, c, h, w] = best
                argmax[n, c, h, w] = a


@njit(cache=True, nogil=True, parallel=True)
def _maxpool_bwd(dy, argmax, dx):
    N, C, Ho, Wo = dy.shape
    for r in prange(N * C):
        n, c = r // C, r % C
        dx[n, c] = 0
        for h in range(Ho):
            for w in range(Wo):
                a = argmax[n, c, h, w]
                dx[n, c, 2 * h + a // 2, 2 * w + a % 2] = dy[n, c, h, w]
