"""2-D convolution, transposed convolution and 2x2 max-pooling, NCHW (CuPy).

im2col/col2im, the moves between NCHW and the GEMMs' layout, the bias gradients' sums and
pooling are RawKernels from the sibling ``conv.cu``; the GEMMs are one cuBLAS call per
chunk of images (:func:`.gemm.matmul`). A chunk's columns are laid out
``cols[(c*kh + i)*kw + j, b*P + p]`` so W2 (Cout, Cin*kh*kw) @ cols covers the whole chunk.
Chunks bound cols to 2**26 elements. Semantics, shapes and argmax encoding are those of the
reference, :mod:`kernels.ref.conv`.

The *_blocks kernels (the CAE's training step: a batch's blocks stacked) take a float32
block of at most :data:`MAX_IMAGES` images through aepar's row kernels
(:mod:`.rowprod`) instead: every output element an FMA chain of its own, so all blocks'
products go in one launch and still give each block the bits it has alone, where cuBLAS
takes a call per block (it may pick another algorithm for another column count). Each
image's weight gradient is the chain over its pixels, and a block's the sum of its images'
in order, added into the block's gradient by one launch for all blocks, as are the bias
gradients. Larger blocks, and float64, keep cuBLAS a call each.
"""
import functools
import os

import cupy as cp
import numpy as np

from ..ref.blocksum import most_rows
from ..ref.conv import (backward_by_block, check_bias, check_conv_starts, check_grad_shapes, check_nchw,
                        conv_geometry, forward_by_block, transpose_geometry)
from .c_types import C_TYPE
from .gemm import matmul
from .rowprod import on_device, rows_times, rows_times_t

__all__ = ["conv2d_forward", "conv2d_backward", "conv2d_transpose_forward",
           "conv2d_transpose_backward", "maxpool2x2_forward", "maxpool2x2_backward",
           "conv2d_forward_blocks", "conv2d_backward_blocks", "conv2d_transpose_forward_blocks",
           "conv2d_transpose_backward_blocks"]

_NAMES = [f"{k}<{t}>" for k in ("im2col", "col2im", "pack_maps", "unpack_maps", "channel_sums",
                                 "block_channel_sums", "image_sums", "maxpool_fwd", "maxpool_bwd")
          for t in C_TYPE.values()]
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "conv.cu")) as _f:
    _MODULE = cp.RawModule(code=_f.read(), options=("-std=c++14",), name_expressions=_NAMES)
_COLS_ELEMENTS = 1 << 26
_BLOCK = 256
_SUM_THREADS = 512  # conv.cu's SUM_THREADS
# a block of at most this many float32 images takes the row kernels in the *_blocks calls,
# as the dense blocks do up to rowprod.MAX_ROWS rows. On an H200 (bench/results/gpu/
# gpu_epoch.csv, 2026-12-04, 0.8.28 with a bound of 64) the CAE's epoch at batch 100 took
# 0.82 s in 8 blocks, every product of the batch's 100 images one row-kernel launch,
# against 0.93 s as one block through cuBLAS: one block of 100 now takes those launches too
MAX_IMAGES = 128


def conv2d_forward(x, W, b, stride=1, pad=0):
    """y = conv2d(x, W) + b; see :func:`kernels.ref.conv.conv2d_forward`."""
    Ho, Wo = conv_geometry(x.shape, W.shape, stride, pad)
    check_bias(b, W.shape[0])
    x, W2, dt = _prep(x, W)
    y = cp.empty((x.shape[0], W.shape[0], Ho, Wo), dtype=dt)
    _conv(x, W2, cp.ascontiguousarray(b, dtype=dt), W.shape[2], W.shape[3], stride, pad, y, matmul)
    return y


def conv2d_backward(dy, x, W, stride, pad, dW, db, need_dx=True):
    """Backward of :func:`conv2d_forward`: adds into ``dW``, ``db``; returns dx (None
    without ``need_dx``: its products and col2im are not made)."""
    Ho, Wo = conv_geometry(x.shape, W.shape, stride, pad)
    check_grad_shapes(dy, (x.shape[0], W.shape[0], Ho, Wo), W, dW, db, W.shape[0])
    x, W2, dt = _prep(x, W)
    dy = cp.ascontiguousarray(dy, dtype=dt)
    dx = cp.empty(x.shape, dtype=dt) if need_dx else None
    _cublas_grads(x, dy, W2, W.shape[2], W.shape[3], stride, pad, dW, dx, transpose=False)
    _channel_sums(dy, db)
    return dx


def conv2d_transpose_forward(x, W, b, stride=1, pad=0):
    """y = conv2d_transpose(x, W) + b; see :func:`kernels.ref.conv.conv2d_transpose_forward`."""
    yshape = transpose_geometry(x.shape, W.shape, stride, pad)
    check_bias(b, W.shape[1])
    x, W2, dt = _prep(x, W)
    y = cp.empty(yshape, dtype=dt)
    _conv_adjoint(x, W2, cp.ascontiguousarray(b, dtype=dt), W.shape[2], W.shape[3], stride, pad, y, matmul)
    return y


def conv2d_transpose_backward(dy, x, W, stride, pad, dW, db):
    """Backward of :func:`conv2d_transpose_forward`: adds into ``dW``, ``db``; returns dx."""
    yshape = transpose_geometry(x.shape, W.shape, stride, pad)
    check_grad_shapes(dy, yshape, W, dW, db, W.shape[1])
    x, W2, dt = _prep(x, W)
    dy = cp.ascontiguousarray(dy, dtype=dt)
    dx = cp.empty(x.shape, dtype=dt)
    # the adjoint's gradients are conv2d's with dy in the role of the convolved input
    _cublas_grads(dy, x, W2, W.shape[2], W.shape[3], stride, pad, dW, dx, transpose=True)
    _channel_sums(dy, db)
    return dx


# Several blocks of images: small float32 blocks all at once through the row kernels (each
# block's bits those of its call alone), others block by block through cuBLAS, as the
# reference does.
def conv2d_forward_blocks(x, W, b, stride, pad, starts):
    """See :func:`kernels.ref.conv.conv2d_forward_blocks`."""
    return _forward_blocks(conv2d_forward, False, x, W, b, stride, pad, starts)


def conv2d_backward_blocks(dy, x, W, stride, pad, dWs, dbs, starts, need_dx=True):
    """See :func:`kernels.ref.conv.conv2d_backward_blocks`."""
    return _backward_blocks(conv2d_backward, False, dy, x, W, stride, pad, dWs, dbs, starts, need_dx)


def conv2d_transpose_forward_blocks(x, W, b, stride, pad, starts):
    """See :func:`kernels.ref.conv.conv2d_transpose_forward_blocks`."""
    return _forward_blocks(conv2d_transpose_forward, True, x, W, b, stride, pad, starts)


def conv2d_transpose_backward_blocks(dy, x, W, stride, pad, dWs, dbs, starts):
    """See :func:`kernels.ref.conv.conv2d_transpose_backward_blocks`."""
    return _backward_blocks(conv2d_transpose_backward, True, dy, x, W, stride, pad, dWs, dbs, starts)


def _in_rows(dtype, most: int) -> bool:
    """Whether blocks of at most ``most`` images take the row kernels (each block decides
    alone)."""
    return np.dtype(dtype) == np.float32 and most <= MAX_IMAGES


def _forward_blocks(cublas, transpose, x, W, b, stride, pad, starts):
    s = check_conv_starts(x, starts)
    dt = np.result_type(x.dtype, W.dtype)
    if _in_rows(dt, most_rows(s)):
        return _forward_rows(transpose, x, W, b, stride, pad)

    def one(x, W, b, stride, pad):
        return _forward_rows(transpose, x, W, b, stride, pad) if _in_rows(dt, x.shape[0]) else \
            cublas(x, W, b, stride, pad)
    return forward_by_block(one, cp, x, W, b, stride, pad, s)


def _backward_blocks(cublas, transpose, dy, x, W, stride, pad, dWs, dbs, starts, need_dx=True):
    s = check_conv_starts(x, starts, dWs, dbs)
    dt = np.result_type(x.dtype, W.dtype)
    if _in_rows(dt, most_rows(s)):
        return _backward_rows(transpose, dy, x, W, stride, pad, dWs, dbs, s, need_dx)

    def one(dy, x, W, stride, pad, dW, db, *need):  # need: (need_dx,) where it is false
        return _backward_rows(transpose, dy, x, W, stride, pad, [dW], [db], [0, x.shape[0]], *need) \
            if _in_rows(dt, x.shape[0]) else cublas(dy, x, W, stride, pad, dW, db, *need)
    return backward_by_block(one, cp, dy, x, W, stride, pad, dWs, dbs, s, need_dx)


def _forward_rows(transpose, x, W, b, stride, pad):
    """conv2d_forward (or the transpose's) with the row kernels' products: every element
    of y its own chain, whatever images share the call."""
    yshape = _out_shape(transpose, x, W, stride, pad)
    check_bias(b, yshape[1])
    x, W2, dt = _prep(x, W)
    y = cp.empty(yshape, dtype=dt)
    bias = cp.ascontiguousarray(b, dtype=dt)
    (_conv_adjoint if transpose else _conv)(x, W2, bias, W.shape[2], W.shape[3], stride, pad, y, rows_times)
    return y


def _out_shape(transpose, x, W, stride, pad) -> tuple:
    """y's shape, (N, C, H, W), of conv2d(x, W) or its transpose."""
    if transpose:
        return tuple(transpose_geometry(x.shape, W.shape, stride, pad))
    return (x.shape[0], W.shape[0], *conv_geometry(x.shape, W.shape, stride, pad))


def _backward_rows(transpose, dy, x, W, stride, pad, dWs, dbs, starts, need_dx=True):
    """The backward of :func:`_forward_rows` on blocks of images (offsets ``starts``):
    dx (None without ``need_dx``), and block k's weight and bias gradients added into
    dWs[k] and dbs[k], each image's weight gradient a chain over its pixels and a block's
    the sum of its images' in order (one launch for all blocks), so a block's bits are its
    own in any call."""
    yshape = _out_shape(transpose, x, W, stride, pad)
    channels = yshape[1]
    for dW, db in zip(dWs, dbs):
        check_grad_shapes(dy, yshape, W, dW, db, channels)
    x, W2, dt = _prep(x, W)
    dy = cp.ascontiguousarray(dy, dtype=dt)
    dx = cp.empty(x.shape, dtype=dt) if need_dx else None
    parts = cp.empty((x.shape[0],) + W2.shape, dtype=dt)

    def into_parts(G, cols, n0, nb):  # image by image: (nb, rows, pixels) views of both
        P = G.shape[1] // nb
        rows_times_t(G.reshape(G.shape[0], nb, P).transpose(1, 0, 2),
                     cols.reshape(cols.shape[0], nb, P).transpose(1, 0, 2), out=parts[n0:n0 + nb])
    # the adjoint's gradients are conv2d's with dy in the role of the convolved input
    a, g = (dy, x) if transpose else (x, dy)
    _conv_grads(a, g, W2, W.shape[2], W.shape[3], stride, pad, dx, transpose, into_parts, rows_times)
    blocks = len(starts) - 1
    on_blocks = on_device(tuple(starts), np.int64)  # (starts: Python ints, check_conv_starts')
    dW_into, dW_later = _writable(dWs, dt, (W2.size,))
    if parts.size and blocks:
        _launch("image_sums", dt, blocks * W2.size, parts, dW_into, on_blocks, np.int32(blocks), np.int64(W2.size))
    db_into, db_later = _writable(dbs, dt, (channels,))
    if channels and blocks:
        fn = _function(f"block_channel_sums<{C_TYPE[np.dtype(dt)]}>", cp.cuda.Device().id)
        fn((channels, blocks), (_SUM_THREADS,), (dy, db_into, on_blocks, np.int32(channels),
                                                np.int64(yshape[2] * yshape[3])))
    for grad, stand_in in dW_later + db_later:
        _add_back(grad, stand_in)
    return dx


def _writable(grads, dtype, shape):
    """(a device array of the addresses the gradients are added at, [(gradient, its
    stand-in)] for those that take :func:`_into`'s stand-ins). The addresses' copy is kept
    (the trainer's gradients are the same arrays every step)."""
    intos = [_into(grad, dtype, shape) for grad in grads]
    addresses = tuple(int(target.data.ptr) for target, _ in intos)
    return on_device(addresses, np.uint64), [(g, s) for g, (_, s) in zip(grads, intos) if s is not None]


def _into(grad, dtype, shape):
    """(where a kernel adds into ``grad``, the stand-in or None): ``grad`` itself as a view
    of ``shape`` where it is C-contiguous and of ``dtype``, else a zeroed stand-in of
    ``shape``, which :func:`_add_back` adds into it afterwards (0 + s is s: the same bits)."""
    if grad.flags.c_contiguous and grad.dtype == dtype:
        return grad.reshape(shape), None
    stand_in = cp.zeros(shape, dtype)
    return stand_in, stand_in


def _add_back(grad, stand_in):
    """grad += :func:`_into`'s stand-in (nothing where there is none)."""
    if stand_in is not None:
        grad += stand_in.reshape(grad.shape).astype(grad.dtype, copy=False)


def maxpool2x2_forward(x):
    """2x2/stride-2 max-pooling; returns (y, argmax) as :func:`kernels.ref.conv.maxpool2x2_forward`."""
    check_nchw(x.shape, "maxpool2x2 input")
    N, C, H, W = x.shape
    x = cp.ascontiguousarray(x)
    y = cp.empty((N, C, H // 2, W // 2), dtype=x.dtype)
    argmax = cp.empty(y.shape, dtype=cp.int8)
    if y.size:
        _launch("maxpool_fwd", x.dtype, y.size, x, y, argmax, np.int64(y.size),
                np.int32(H), np.int32(W), np.int32(H // 2), np.int32(W // 2))
    return y, argmax


def maxpool2x2_backward(dy, argmax, x_shape):
    """Backward of :func:`maxpool2x2_forward`; returns dx of shape ``x_shape``."""
    check_nchw(x_shape, "maxpool2x2 x_shape")
    N, C, H, W = x_shape
    if dy.shape != (N, C, H // 2, W // 2) or argmax.shape != dy.shape:
        raise ValueError(f"maxpool2x2_backward: dy {dy.shape} and argmax {argmax.shape} must be "
                         f"{(N, C, H // 2, W // 2)} for x_shape {tuple(x_shape)}")
    dy = cp.ascontiguousarray(dy)
    dx = cp.zeros(tuple(x_shape), dtype=dy.dtype)
    if dy.size:
        _launch("maxpool_bwd", dy.dtype, dy.size, dy, cp.ascontiguousarray(argmax, dtype=cp.int8),
                dx, np.int64(dy.size), np.int32(H), np.int32(W), np.int32(H // 2), np.int32(W // 2))
    return dx


# ---- helpers ---------------------------------------------------------------------------

def _prep(x, W):
    dt = np.result_type(x.dtype, W.dtype)
    if dt not in C_TYPE:
        raise ValueError(f"conv kernels run in float32 or float64, not {dt}")
    W = cp.ascontiguousarray(W, dtype=dt)
    return cp.ascontiguousarray(x, dtype=dt), W.reshape(W.shape[0], -1), dt


def _zeros(n, dtype):
    """A zero bias of ``n`` channels, made once per device (never written: col2im and
    _unpack only read it)."""
    return _zeros_on(n, np.dtype(dtype), cp.cuda.Device().id)


@functools.lru_cache(maxsize=None)
def _zeros_on(n, dtype, device):
    return cp.zeros(n, dtype=dtype)


def _launch(name, dtype, n, *args):
    fn = _function(f"{name}<{C_TYPE[np.dtype(dtype)]}>", cp.cuda.Device().id)
    blocks = max(1, min((n + _BLOCK - 1) // _BLOCK, 1 << 16))
    fn((blocks,), (_BLOCK,), args)


@functools.lru_cache(maxsize=None)
def _function(name, device):
    """The module's kernel ``name`` on ``device``, looked up once: a lookup per launch is
    a visible share of a CAE step's host time (bench/results/gpu/gpu_train_step_profile.txt)."""
    return _MODULE.get_function(name)


def _chunks(N, rows_per_image):
    step = max(1, _COLS_ELEMENTS // max(1, rows_per_image))
    for n0 in range(0, N, step):
        yield n0, min(step, N - n0)


def _im2col(x, n0, nb, kh, kw, stride, pad, Ho, Wo):
    C, H, W = x.shape[1:]
    cols = cp.empty((C * kh * kw, nb * Ho * Wo), dtype=x.dtype)
    _launch("im2col", x.dtype, cols.size, x, cols, *_int32s((n0, nb, C, H, W, kh, kw, stride, pad, Ho, Wo)))
    return cols


def _col2im(dcols, n0, nb, kh, kw, stride, pad, Ho, Wo, bias, dx):
    """dx[n0:n0+nb] = bias + scatter-add of dcols (a gather per dx element on the device)."""
    C, H, W = dx.shape[1:]
    _launch("col2im", dx.dtype, nb * C * H * W, dcols, bias, dx,
            *_int32s((n0, nb, C, H, W, kh, kw, stride, pad, Ho, Wo)))


@functools.lru_cache(maxsize=256)
def _int32s(values: tuple) -> tuple:
    """A launch's integer arguments as NumPy int32s, made once per set of values: a step
    repeats them, and making eleven NumPy integers for every im2col is host time a GPU
    step waits for."""
    return tuple(np.array(values, np.int32))


def _pack(g, n0, nb):
    """(Co, nb*P) matrix G[o, b*P + p] = g[n0 + b, o, p] (g C-contiguous)."""
    Co, P = g.shape[1], g.shape[2] * g.shape[3]
    G = cp.empty((Co, nb * P), dtype=g.dtype)
    if G.size:
        _launch("pack_maps", g.dtype, G.size, g, G, np.int32(n0), np.int32(nb), np.int32(Co), np.int64(P))
    return G


def _unpack(Y, n0, nb, bias, y):
    """y[n0 + b, o] = Y[o, b*P:(b+1)*P] + bias[o] (Y, y C-contiguous)."""
    Co, P = y.shape[1], y.shape[2] * y.shape[3]
    if Y.size:
        _launch("unpack_maps", y.dtype, Y.size, Y, bias, y, np.int32(n0), np.int32(nb), np.int32(Co), np.int64(P))


def _channel_sums(dy, db):
    """db += dy summed over images and pixels (dy C-contiguous), taken in double."""
    N, C = dy.shape[:2]
    into, stand_in = _into(db, dy.dtype, (C,))
    if C:
        fn = _function(f"channel_sums<{C_TYPE[np.dtype(dy.dtype)]}>", cp.cuda.Device().id)
        fn((C,), (_SUM_THREADS,), (dy, into, np.int32(N), np.int32(C), np.int64(dy.shape[2] * dy.shape[3])))
    _add_back(db, stand_in)


def _conv(x, W2, bias, kh, kw, stride, pad, y, times):
    """y = bias + W2 @ im2col(x), chunk by chunk; ``times``: the product (cuBLAS's, or
    :func:`.rowprod.rows_times`)."""
    Ho, Wo = y.shape[2:]
    for n0, nb in _chunks(x.shape[0], W2.shape[1] * Ho * Wo):
        cols = _im2col(x, n0, nb, kh, kw, stride, pad, Ho, Wo)
        _unpack(times(W2, cols), n0, nb, bias, y)


def _conv_adjoint(g, W2, bias, kh, kw, stride, pad, y, times):
    """y = bias + col2im(W2.T @ g's maps), chunk by chunk (``times`` as :func:`_conv`'s)."""
    Ho, Wo = g.shape[2:]
    for n0, nb in _chunks(g.shape[0], W2.shape[1] * Ho * Wo):
        _col2im(times(W2.T, _pack(g, n0, nb)), n0, nb, kh, kw, stride, pad, Ho, Wo, bias, y)


def _conv_grads(a, g, W2, kh, kw, stride, pad, da, transpose, weight_grad, times):
    """The input gradient into ``da``: conv2d^T(g) (conv2d backward) or conv2d(a)
    (conv2d_transpose backward, where a is dy and g the input; ``da`` None: none);
    ``weight_grad(G, cols, n0, nb)`` takes each chunk's factors of the weight gradient,
    G @ cols(a).T."""
    Ho, Wo = g.shape[2:]
    zero = None if da is None else _zeros(da.shape[1], da.dtype)
    for n0, nb in _chunks(g.shape[0], W2.shape[1] * Ho * Wo):
        cols = _im2col(a, n0, nb, kh, kw, stride, pad, Ho, Wo)
        G = _pack(g, n0, nb)
        weight_grad(G, cols, n0, nb)
        if da is None:
            continue
        if transpose:
            _unpack(times(W2, cols), n0, nb, zero, da)
        else:
            _col2im(times(W2.T, G), n0, nb, kh, kw, stride, pad, Ho, Wo, zero, da)


def _cublas_grads(a, g, W2, kh, kw, stride, pad, dW, da, transpose):
    """dW += G @ cols(a).T, each chunk's product added straight into dW by its GEMM (beta
    = 1), and the input gradient into ``da`` (:func:`_conv_grads`)."""
    dW2, stand_in = _into(dW, W2.dtype, W2.shape)
    _conv_grads(a, g, W2, kh, kw, stride, pad, da, transpose,
                lambda G, cols, n0, nb: matmul(G, cols.T, out=dW2, accumulate=True), matmul)
    _add_back(dW, stand_in)
