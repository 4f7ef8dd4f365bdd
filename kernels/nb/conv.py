"""2-D convolution, transposed convolution and 2x2 max-pooling, NCHW (Numba).

im2col + BLAS GEMM. im2col fills ``cols[(c*kh + i)*kw + j, b*P + p]`` for a chunk of
images side by side (P = Ho*Wo output pixels), so that each product of a chunk is one
GEMM of the chunk's columns: W2 (Cout, Cin*kh*kw) @ cols for y, G @ cols.T for the weight
gradient, W2.T @ G for the input gradient, with G the chunk's dy (Cout, chunk*P), packed
from NCHW. One product per image instead, at these shapes (at most 64 channels, 49-784
pixels), ran well below BLAS's rate on the chunk. For LeNet-sized layers (3x3, 1-64
channels, 28x28, batch 100) this is many times faster than direct loops over (n, cout) on
one core. Chunks keep cols near 2**20 elements and never span two blocks of images (a
block's bits must not depend on the blocks beside it).

The GEMMs are NumPy's (its OpenBLAS, single-threaded like every BLAS here, and without
the GIL): at these shapes the faster of the two OpenBLAS builds installed (Numba's np.dot
calls the one scipy bundles; docs/performance-notes.md has the figures). The copies
(im2col, col2im) are compiled, and parallel over independent planes when that is safe
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
    return conv2d_forward_blocks(x, W, b, stride, pad, [0, x.shape[0]])


def conv2d_backward(dy, x, W, stride, pad, dW, db, need_dx=True):
    """Backward of :func:`conv2d_forward`: adds into ``dW``, ``db``; returns dx (None
    without ``need_dx``)."""
    return conv2d_backward_blocks(dy, x, W, stride, pad, [dW], [db], [0, x.shape[0]], need_dx)


def conv2d_backward_blocks(dy, x, W, stride, pad, dWs, dbs, starts, need_dx=True):
    """:func:`kernels.ref.conv.conv2d_backward_blocks` in one call: a block's weight
    gradient is its chunks' products added in order from its own first image, as alone,
    and dx chunk by chunk likewise (without ``need_dx`` neither its products nor its
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
    return conv2d_transpose_forward_blocks(x, W, b, stride, pad, [0, x.shape[0]])


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
    """:func:`kernels.ref.conv.conv2d_forward_blocks` in one call: each block's images in
    chunks from its own first image, as alone."""
    s = check_conv_starts(x, starts)
    Ho, Wo = conv_geometry(x.shape, W.shape, stride, pad)
    check_bias(b, W.shape[0])
    x, W2, dt = _prep(x, W)
    y = np.empty((x.shape[0], W.shape[0], Ho, Wo), dtype=dt)
    _conv(x, W2, b.astype(dt), W.shape[2], W.shape[3], stride, pad, y, _chunk(W2.shape[1], Ho * Wo), s)
    return y


def conv2d_transpose_forward_blocks(x, W, b, stride, pad, starts):
    """:func:`kernels.ref.conv.conv2d_transpose_forward_blocks` in one call (as
    :func:`conv2d_forward_blocks`)."""
    s = check_conv_starts(x, starts)
    yshape = transpose_geometry(x.shape, W.shape, stride, pad)
    check_bias(b, W.shape[1])
    x, W2, dt = _prep(x, W)
    y = np.empty(yshape, dtype=dt)
    _conv_adjoint(x, W2, b.astype(dt), W.shape[2], W.shape[3], stride, pad, y,
                  _chunk(W2.shape[1], x.shape[2] * x.shape[3]), s)
    return y


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


def _block_chunks(starts, chunk):
    """(first image, images) of each chunk: a block's images ``chunk`` at a time from its
    own first image, so that a block's products never depend on the blocks beside it
    (BLAS's kernels may sum otherwise for other sizes)."""
    for lo, hi in zip(starts[:-1], starts[1:]):
        for n0 in range(lo, hi, chunk):
            yield n0, min(chunk, hi - n0)


def _most_images(starts, chunk):
    """The most images a chunk of :func:`_block_chunks` has (0 without any)."""
    return min(chunk, max([hi - lo for lo, hi in zip(starts[:-1], starts[1:])], default=0))


def _pack(g2, n0, nb, packed):
    """Images n0.. of g2 (images, channels, pixels) side by side in ``packed``: (channels,
    nb * pixels), the operand of one product for the chunk."""
    _, C, P = g2.shape
    G = packed[:C * nb * P].reshape(C, nb * P)
    np.copyto(G.reshape(C, nb, P), g2[n0:n0 + nb].transpose(1, 0, 2))
    return G


def _unpack(G, n0, out2):
    """:func:`_pack` undone: G's images side by side (channels, nb * pixels) into images
    n0.. of out2 (images, channels, pixels)."""
    P = out2.shape[2]
    nb = G.shape[1] // P
    np.copyto(out2[n0:n0 + nb], G.reshape(G.shape[0], nb, P).transpose(1, 0, 2))


def _conv(x, W2, bias, kh, kw, stride, pad, y, chunk, starts):
    """y = conv2d(x) + bias: per chunk (:func:`_block_chunks`) the im2col of its images
    side by side, one product W2 @ cols, then each image's (Cout, P) with the bias added
    into y."""
    im2col, _ = _copies()
    N, (Ho, Wo) = x.shape[0], y.shape[2:]
    (Co, K), P = W2.shape, Ho * Wo
    y2 = y.reshape(N, Co, P)
    images = _most_images(starts, chunk)
    cols = _scratch("cols", (K * images * P,), x.dtype)
    outs = _scratch("packed", (Co * images * P,), x.dtype)
    bias2 = bias.reshape(Co, 1)
    for n0, nb in _block_chunks(starts, chunk):
        c = cols[:K * nb * P].reshape(K, nb * P)
        im2col(x, n0, nb, kh, kw, stride, pad, Ho, Wo, c)
        out = np.matmul(W2, c, out=outs[:Co * nb * P].reshape(Co, nb * P))
        out += bias2  # where out lies (the add with the copy, over its strides, took longer)
        _unpack(out, n0, y2)


def _conv_adjoint(g, W2, bias, kh, kw, stride, pad, y, chunk, starts):
    """y = conv2d^T(g) + bias (y has the convolved input's shape): per chunk
    (:func:`_block_chunks`) one product W2.T @ G of its images' g side by side, then
    col2im."""
    _, col2im = _copies()
    N, Co, Ho, Wo = g.shape
    K, P = W2.shape[1], Ho * Wo
    g2 = g.reshape(N, Co, P)
    images = _most_images(starts, chunk)
    packed = _scratch("packed", (Co * images * P,), g.dtype)
    dcols = _scratch("dcols", (K * images * P,), g.dtype)
    for n0, nb in _block_chunks(starts, chunk):
        d = np.matmul(W2.T, _pack(g2, n0, nb, packed), out=dcols[:K * nb * P].reshape(K, nb * P))
        col2im(d, n0, nb, kh, kw, stride, pad, Ho, Wo, bias, y)


def _conv_grads(a, g, W2, kh, kw, stride, pad, dWs, dbs, starts, da, transpose, chunk):
    """Gradients of conv2d(a) paired with g, block by block (images ``starts[k]`` to
    ``starts[k + 1]``), each chunk of a block's images (from its first image, as alone) in
    one product of their columns side by side: ``dWs[k]`` += the chunks' G @ cols(a)^T in
    order, G the chunk's g as (channels, images x pixels), and ``dbs[k]`` += the block's
    rows of dy (= g, or a with ``transpose``) summed as over the block alone; and the input
    gradient of every image into ``da``: conv2d^T(g) (conv2d backward) or, with
    ``transpose``, conv2d(a) (conv2d_transpose backward, where a is dy and g is the layer
    input), a chunk's images in one product too; ``da`` None: no input gradient. A
    product per image had run these shapes (at most 64 channels, 49-784 pixels) well
    below BLAS's rate on a longer one. What does not depend on the block is set up once."""
    im2col, col2im = _copies()
    N, Co, Ho, Wo = g.shape
    P, K = Ho * Wo, W2.shape[1]
    g2 = g.reshape(N, Co, P)
    need_dx = da is not None
    if need_dx:
        da2 = da.reshape(N, da.shape[1], da.shape[2] * da.shape[3])  # also for no images
        zero = np.zeros(da.shape[1], dtype=a.dtype)
    images = _most_images(starts, chunk)
    cols = _scratch("cols", (K * images * P,), a.dtype)
    packed = _scratch("packed", (Co * images * P,), a.dtype)
    rows = W2.shape[0] if transpose else K  # of the input gradient's product
    dcols = _scratch("dcols", (rows * images * P if need_dx else 0,), a.dtype)
    part = np.empty(W2.shape, a.dtype)
    dy = a if transpose else g
    for lo, hi, dW, db in zip(starts[:-1], starts[1:], dWs, dbs):
        dW2 = _wgrad_target(dW)
        for n0, nb in _block_chunks([lo, hi], chunk):
            c = cols[:K * nb * P].reshape(K, nb * P)
            im2col(a, n0, nb, kh, kw, stride, pad, Ho, Wo, c)
            G = _pack(g2, n0, nb, packed)
            dW2 += np.matmul(G, c.T, out=part)
            if not need_dx:
                continue
            d = dcols[:rows * nb * P].reshape(rows, nb * P)
            if transpose:
                _unpack(np.matmul(W2, c, out=d), n0, da2)
            else:
                np.matmul(W2.T, G, out=d)
                col2im(d, n0, nb, kh, kw, stride, pad, Ho, Wo, zero, da)
        _wgrad_done(dW, dW2)
        db += dy[lo:hi].sum(axis=(0, 2, 3))


# ---- compiled copies: prange over independent (image, channel) planes -------------------

@njit(cache=True, nogil=True)
def _valid(n_out, stride, off, n_in):
    """Range [lo, hi) of output positions o with 0 <= o*stride + off < n_in."""
    lo = -(off // stride) if off < 0 else 0       # ceil(-off / stride)
    hi = (n_in - 1 - off) // stride + 1 if n_in - 1 - off >= 0 else 0
    return lo, max(lo, min(hi, n_out))


def _im2col_py(x, n0, nb, kh, kw, stride, pad, Ho, Wo, cols):
    """cols[(c*kh + i)*kw + j, b*P + ho*Wo + wo] = xpad[n0 + b, c, ho*stride + i,
    wo*stride + j]: the chunk's images side by side in each row, (K, nb*P). One (image,
    channel) plane per task, so its kh*kw rows reuse the plane from cache. Flat indices:
    rows are short (Wo ~ 7-28), and 4-D indexing cost more than the copy."""
    C, H, W = x.shape[1], x.shape[2], x.shape[3]
    P = Ho * Wo
    xf, cf = x.reshape(-1), cols.reshape(-1)
    # "same" geometry (stride 1, Wo == W): a tap's row is the plane shifted by (i-pad)*W +
    # j-pad, so it is one contiguous copy, then the pad columns the shift wrapped are zeroed
    same = stride == 1 and Wo == W
    for r in prange(nb * C):
        b, c = r // C, r % C
        src0 = ((n0 + b) * C + c) * H * W
        for i in range(kh):
            for j in range(kw):
                dst0 = ((c * kh + i) * kw + j) * nb * P + b * P
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
                    # each wrapped column as one strided slice (a loop over the rows took longer)
                    for wo in range(lo):
                        cf[dst0 + hlo * Wo + wo:dst0 + hhi * Wo:Wo] = 0
                    for wo in range(hi, Wo):
                        cf[dst0 + hlo * Wo + wo:dst0 + hhi * Wo:Wo] = 0
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
    """dx[n0 + b] = bias + scatter-add of image b's columns of dcols (laid out as
    :func:`_im2col_py`'s ``cols``); one (image, channel) plane per task, so no two tasks
    write the same element."""
    C, H, W = dx.shape[1], dx.shape[2], dx.shape[3]
    P = Ho * Wo
    df, cf = dx.reshape(-1), dcols.reshape(-1)
    same = stride == 1 and Wo == W   # as in im2col: one contiguous add per tap
    for r in prange(nb * C):
        b, c = r // C, r % C
        dst0 = ((n0 + b) * C + c) * H * W
        for q in range(H * W):
            df[dst0 + q] = bias[c]
        for i in range(kh):
            for j in range(kw):
                src0 = ((c * kh + i) * kw + j) * nb * P + b * P
                lo, hi = _valid(Wo, stride, j - pad, W)
                if same:
                    hlo, hhi = _valid(Ho, 1, i - pad, H)
                    shift = (i - pad) * W + j - pad
                    # the columns that wrapped to a neighbouring row hold no tap: skip them
                    # by zeroing them in this scratch (adding 0 leaves dx as it was)
                    for wo in range(lo):
                        cf[src0 + hlo * Wo + wo:src0 + hhi * Wo:Wo] = 0
                    for wo in range(hi, Wo):
                        cf[src0 + hlo * Wo + wo:src0 + hhi * Wo:Wo] = 0
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
    """Each element of dx written once, row by row: dy's where argmax picked it, else 0
    (zeroing a plane, then scattering dy into it, took twice as long on 28x28 planes)."""
    N, C, Ho, Wo = dy.shape
    for r in prange(N * C):
        n, c = r // C, r % C
        g, picked, out = dy[n, c], argmax[n, c], dx[n, c]
        for h in range(Ho):
            for i in range(2):
                row = out[2 * h + i]
                for w in range(Wo):
                    a, v = picked[h, w], g[h, w]
                    row[2 * w] = v if a == 2 * i else 0
                    row[2 * w + 1] = v if a == 2 * i + 1 else 0
        if out.shape[0] > 2 * Ho:  # an odd height's last row is in no window
            out[2 * Ho] = 0
        if out.shape[1] > 2 * Wo:  # an odd width's last column
            for h in range(2 * Ho):
                out[h, 2 * Wo] = 0
