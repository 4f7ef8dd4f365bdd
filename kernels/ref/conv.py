"""2-D convolution, transposed convolution and 2x2 max-pooling, NCHW (NumPy reference).

Convolution is cross-correlation with zero padding, as in PyTorch's Conv2d:
y[n, o, h, w] = b[o] + sum_{c,i,j} xpad[n, c, h*stride + i, w*stride + j] * W[o, c, i, j].

The transposed convolution is the adjoint of that map (in x) plus a bias; its weight is
laid out (Cin, Cout, kh, kw) like PyTorch's ConvTranspose2d, which is exactly the conv2d
weight of the convolution it is the adjoint of. So three primitives serve all four kernels:
``_conv`` (the map), ``_conv_adjoint`` (its adjoint in x) and ``_conv_wgrad`` (its adjoint in W).

Max-pooling's ``argmax`` holds, per output, the position of the maximum in its 2x2 window
as ``2*di + dj`` (int8); ties go to the first position in that order.
"""
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .blocksum import check_starts

__all__ = ["conv2d_forward", "conv2d_backward", "conv2d_transpose_forward",
           "conv2d_transpose_backward", "maxpool2x2_forward", "maxpool2x2_backward",
           "conv2d_forward_blocks", "conv2d_backward_blocks", "conv2d_transpose_forward_blocks",
           "conv2d_transpose_backward_blocks"]


def conv2d_forward(x, W, b, stride=1, pad=0):
    """y = conv2d(x, W) + b.

    Parameters
    ----------
    x : ndarray (N, Cin, H, W)
    W : ndarray (Cout, Cin, kh, kw)
    b : ndarray (Cout,)
    stride, pad : int
        Zero padding ``pad`` on every side.

    Returns
    -------
    ndarray (N, Cout, (H + 2 pad - kh) // stride + 1, (W + 2 pad - kw) // stride + 1)
    """
    conv_geometry(x.shape, W.shape, stride, pad)
    check_bias(b, W.shape[0])
    y = _conv(x, W, stride, pad)
    y += b.reshape(1, -1, 1, 1)
    return y


def conv2d_backward(dy, x, W, stride, pad, dW, db, need_dx=True):
    """Backward of :func:`conv2d_forward`.

    Adds dL/dW into ``dW`` and dL/db into ``db`` (arrays the caller zeroed).

    Returns
    -------
    ndarray (N, Cin, H, W): dL/dx, a new array; None when ``need_dx`` is false (a
    network's first layer: its input gradient is not wanted, and every set then skips it).
    """
    Ho, Wo = conv_geometry(x.shape, W.shape, stride, pad)
    check_grad_shapes(dy, (x.shape[0], W.shape[0], Ho, Wo), W, dW, db, W.shape[0])
    dW += _conv_wgrad(x, dy, W.shape, stride, pad)
    db += dy.sum(axis=(0, 2, 3))
    return _conv_adjoint(dy, W, x.shape, stride, pad) if need_dx else None


def conv2d_transpose_forward(x, W, b, stride=1, pad=0):
    """y = conv2d_transpose(x, W) + b, the adjoint of conv2d in its input, plus a bias.

    Parameters
    ----------
    x : ndarray (N, Cin, H, W)
    W : ndarray (Cin, Cout, kh, kw)  (PyTorch ConvTranspose2d layout)
    b : ndarray (Cout,)

    Returns
    -------
    ndarray (N, Cout, (H - 1) stride - 2 pad + kh, (W - 1) stride - 2 pad + kw)
    """
    yshape = transpose_geometry(x.shape, W.shape, stride, pad)
    check_bias(b, W.shape[1])
    y = _conv_adjoint(x, W, yshape, stride, pad)
    y += b.reshape(1, -1, 1, 1)
    return y


def conv2d_transpose_backward(dy, x, W, stride, pad, dW, db):
    """Backward of :func:`conv2d_transpose_forward`.

    Adds dL/dW into ``dW`` and dL/db into ``db``; returns dL/dx (a new array).
    """
    yshape = transpose_geometry(x.shape, W.shape, stride, pad)
    check_grad_shapes(dy, yshape, W, dW, db, W.shape[1])
    # y = A^T x with A = conv2d(., W): dW pairs like conv2d's with the roles of x and dy swapped
    dW += _conv_wgrad(dy, x, W.shape, stride, pad)
    db += dy.sum(axis=(0, 2, 3))
    return _conv(dy, W, stride, pad)


def maxpool2x2_forward(x):
    """2x2 max-pooling with stride 2; an odd last row/column is dropped.

    Returns
    -------
    y : ndarray (N, C, H // 2, W // 2)
    argmax : int8 ndarray (N, C, H // 2, W // 2), 2*di + dj of the maximum in each window.
    """
    check_nchw(x.shape, "maxpool2x2 input")
    win = _windows2x2(x)
    argmax = win.argmax(axis=-1).astype(np.int8)
    y = np.take_along_axis(win, argmax[..., None].astype(np.intp), axis=-1)[..., 0]
    return y, argmax


def maxpool2x2_backward(dy, argmax, x_shape):
    """Backward of :func:`maxpool2x2_forward`: dy goes to each window's maximum.

    Returns
    -------
    ndarray ``x_shape``: dL/dx, zero off the maxima and in a dropped odd row/column.
    """
    check_nchw(x_shape, "maxpool2x2 x_shape")
    N, C, H, W = x_shape
    Ho, Wo = H // 2, W // 2
    if dy.shape != (N, C, Ho, Wo) or argmax.shape != dy.shape:
        raise ValueError(f"maxpool2x2_backward: dy {dy.shape} and argmax {argmax.shape} must be "
                         f"{(N, C, Ho, Wo)} for x_shape {tuple(x_shape)}")
    dwin = np.zeros((N, C, Ho, Wo, 4), dtype=dy.dtype)
    np.put_along_axis(dwin, argmax[..., None].astype(np.intp), dy[..., None], axis=-1)
    dx = np.zeros(x_shape, dtype=dy.dtype)
    dx[:, :, :2 * Ho, :2 * Wo] = (dwin.reshape(N, C, Ho, Wo, 2, 2).transpose(0, 1, 2, 4, 3, 5)
                                  .reshape(N, C, 2 * Ho, 2 * Wo))
    return dx


# ---- the three linear maps -------------------------------------------------------------

def _windows(x, kh, kw, stride, pad, Ho, Wo):
    """(N, C, Ho, Wo, kh, kw) view of the zero-padded input: the im2col matrix, uncopied."""
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad))) if pad else x
    win = sliding_window_view(xp, (kh, kw), axis=(2, 3))
    return win[:, :, :(Ho - 1) * stride + 1:stride, :(Wo - 1) * stride + 1:stride]


def _conv(x, W, stride, pad):
    """conv2d without bias: (N, Cin, H, W) -> (N, Cout, Ho, Wo)."""
    Ho, Wo = conv_geometry(x.shape, W.shape, stride, pad)
    win = _windows(x, W.shape[2], W.shape[3], stride, pad, Ho, Wo)
    y = np.tensordot(win, W, axes=([1, 4, 5], [1, 2, 3]))          # (N, Ho, Wo, Cout)
    return np.ascontiguousarray(y.transpose(0, 3, 1, 2))


def _conv_adjoint(dy, W, xshape, stride, pad):
    """Adjoint of ``_conv`` in x (col2im): (N, Cout, Ho, Wo) -> xshape (N, Cin, H, W)."""
    N, Cin, H, Wd = xshape
    _, _, kh, kw = W.shape
    Ho, Wo = dy.shape[2], dy.shape[3]
    dxp = np.zeros((N, Cin, H + 2 * pad, Wd + 2 * pad), dtype=np.result_type(dy, W))
    for i in range(kh):
        for j in range(kw):
            contrib = np.tensordot(dy, W[:, :, i, j], axes=([1], [0]))  # (N, Ho, Wo, Cin)
            dxp[:, :, i:i + (Ho - 1) * stride + 1:stride, j:j + (Wo - 1) * stride + 1:stride] += \
                contrib.transpose(0, 3, 1, 2)
    return np.ascontiguousarray(dxp[:, :, pad:pad + H, pad:pad + Wd])


def _conv_wgrad(x, dy, wshape, stride, pad):
    """Adjoint of ``_conv`` in W: sum over n, h, w of dy[n, o, h, w] * xpad windows."""
    _, _, kh, kw = wshape
    win = _windows(x, kh, kw, stride, pad, dy.shape[2], dy.shape[3])
    return np.tensordot(dy, win, axes=([0, 2, 3], [0, 2, 3]))        # (Cout, Cin, kh, kw)


def _windows2x2(x):
    N, C, H, W = x.shape
    Ho, Wo = H // 2, W // 2
    return (x[:, :, :2 * Ho, :2 * Wo].reshape(N, C, Ho, 2, Wo, 2).transpose(0, 1, 2, 4, 3, 5)
            .reshape(N, C, Ho, Wo, 4))


# ---- several blocks of images stacked: each block's own bits -----------------------------

def conv2d_forward_blocks(x, W, b, stride, pad, starts):
    """:func:`conv2d_forward` of the stacked blocks of images ``x[starts[k]:starts[k + 1]]``:
    block k's rows of the result are the bits of the same call on that block alone
    (aepar.rows' blocks: the same weights on any number of ranks). Here and in the numba
    set that is :func:`conv2d_forward` on the block; the cupy set may take small blocks
    another way (its row kernels), whose bits are then the block's in any call."""
    return forward_by_block(conv2d_forward, np, x, W, b, stride, pad, starts)


def conv2d_backward_blocks(dy, x, W, stride, pad, dWs, dbs, starts, need_dx=True):
    """:func:`conv2d_backward` of the stacked blocks: block k's weight and bias gradients
    added into ``dWs[k]`` and ``dbs[k]``, dx stacked (None without ``need_dx``); every
    block's bits those of the same call on that block alone (see
    :func:`conv2d_forward_blocks`)."""
    return backward_by_block(conv2d_backward, np, dy, x, W, stride, pad, dWs, dbs, starts, need_dx)


def conv2d_transpose_forward_blocks(x, W, b, stride, pad, starts):
    """:func:`conv2d_transpose_forward` of the stacked blocks (see :func:`conv2d_forward_blocks`)."""
    return forward_by_block(conv2d_transpose_forward, np, x, W, b, stride, pad, starts)


def conv2d_transpose_backward_blocks(dy, x, W, stride, pad, dWs, dbs, starts):
    """:func:`conv2d_transpose_backward` of the stacked blocks (see :func:`conv2d_backward_blocks`)."""
    return backward_by_block(conv2d_transpose_backward, np, dy, x, W, stride, pad, dWs, dbs, starts)


def forward_by_block(forward, xp, x, W, b, stride, pad, starts):
    """``forward`` (a set's convolution) block by block, the results stacked by ``xp``."""
    s = check_conv_starts(x, starts)
    if len(s) == 2:
        return forward(x, W, b, stride, pad)
    return xp.concatenate([forward(x[lo:hi], W, b, stride, pad) for lo, hi in zip(s[:-1], s[1:])])


def backward_by_block(backward, xp, dy, x, W, stride, pad, dWs, dbs, starts, need_dx=True):
    """``backward`` (a set's convolution backward) block by block, dx stacked by ``xp``
    (``need_dx`` false: ``backward`` takes it too, and None is returned)."""
    s = check_conv_starts(x, starts, dWs, dbs)
    more = () if need_dx else (False,)  # the transposed convolution's backward has no need_dx
    if len(s) == 2:
        return backward(dy, x, W, stride, pad, dWs[0], dbs[0], *more)
    parts = [backward(dy[lo:hi], x[lo:hi], W, stride, pad, dW, db, *more)
             for lo, hi, dW, db in zip(s[:-1], s[1:], dWs, dbs)]
    return xp.concatenate(parts) if need_dx else None


def check_conv_starts(x, starts, dWs=None, dbs=None) -> list:
    """The blocks' offsets (a list of ints) from 0 to every image of ``x``, never back; one
    weight and one bias gradient per block."""
    s = check_starts("conv blocks", x.shape[0], starts).tolist()
    for what, grads in (("weight", dWs), ("bias", dbs)):
        if grads is not None and len(grads) != len(s) - 1:
            raise ValueError(f"conv blocks: {len(grads)} {what} gradients for {len(s) - 1} blocks")
    return s


# ---- shape checks shared with the numba and cupy sets ----------------------------------

def check_nchw(shape, what):
    if len(shape) != 4:
        raise ValueError(f"{what} must be 4-D (N, C, H, W), got shape {tuple(shape)}")


def conv_geometry(xshape, wshape, stride, pad):
    """(Ho, Wo) of conv2d(x, W); raises ValueError on shapes that do not fit."""
    check_nchw(xshape, "conv2d input")
    check_nchw(wshape, "conv2d weight")
    if stride < 1 or pad < 0:
        raise ValueError(f"conv2d needs stride >= 1 and pad >= 0, got stride={stride} pad={pad}")
    if xshape[1] != wshape[1]:
        raise ValueError(f"conv2d: input has {xshape[1]} channels, weight {tuple(wshape)} "
                         f"expects {wshape[1]}")
    Ho = (xshape[2] + 2 * pad - wshape[2]) // stride + 1
    Wo = (xshape[3] + 2 * pad - wshape[3]) // stride + 1
    if Ho < 1 or Wo < 1:
        raise ValueError(f"conv2d: kernel {tuple(wshape[2:])} larger than padded input "
                         f"{(xshape[2] + 2 * pad, xshape[3] + 2 * pad)}")
    return Ho, Wo


def transpose_geometry(xshape, wshape, stride, pad):
    """Output shape of conv2d_transpose(x, W); raises ValueError on shapes that do not fit."""
    check_nchw(xshape, "conv2d_transpose input")
    check_nchw(wshape, "conv2d_transpose weight")
    if stride < 1 or pad < 0:
        raise ValueError(f"conv2d_transpose needs stride >= 1 and pad >= 0, got stride={stride} "
                         f"pad={pad}")
    if xshape[1] != wshape[0]:
        raise ValueError(f"conv2d_transpose: input has {xshape[1]} channels, weight "
                         f"{tuple(wshape)} expects {wshape[0]}")
    Ho = (xshape[2] - 1) * stride - 2 * pad + wshape[2]
    Wo = (xshape[3] - 1) * stride - 2 * pad + wshape[3]
    if Ho < 1 or Wo < 1:
        raise ValueError(f"conv2d_transpose: padding {pad} leaves no output for input "
                         f"{tuple(xshape[2:])}")
    return (xshape[0], wshape[1], Ho, Wo)


def check_bias(b, n):
    if b.shape != (n,):
        raise ValueError(f"bias must have shape ({n},), got {tuple(b.shape)}")


def check_grad_shapes(dy, yshape, W, dW, db, nbias):
    if tuple(dy.shape) != tuple(yshape):
        raise ValueError(f"dy has shape {tuple(dy.shape)}, the layer's output is {tuple(yshape)}")
    if dW.shape != W.shape or db.shape != (nbias,):
        raise ValueError(f"dW {tuple(dW.shape)} / db {tuple(db.shape)} must match "
                         f"W {tuple(W.shape)} / ({nbias},)")
