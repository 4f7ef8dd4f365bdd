"""Losses, forward and backward (Numba): one fused parallel pass each.

Same conventions as the reference: ``scale`` defaults to 1/batch, scalar losses are
summed in float64 and returned as Python floats, arrays keep the input dtype.
"""
import math

import numpy as np
from numba import njit, prange

from ..ref.blocksum import check_starts
from ..ref.loss import check_labels, check_same_shape, default_scale
from .activation import _flat
from .nbmath import exp_parts, log1p_unit

__all__ = ["mse_forward", "mse_forward_blocks", "mse_backward", "softmax_xent_forward", "softmax_xent_forward_blocks",
           "softmax_xent_backward",
           "sigmoid_xent_forward", "sigmoid_xent_forward_blocks", "sigmoid_xent_backward"]


@njit(cache=True, nogil=True, parallel=True)
def _sq_diff_sum(y, t):
    s = 0.0
    for i in prange(y.size):
        d = np.float64(y[i]) - np.float64(t[i])
        s += d * d
    return s


# the squares a group of blocks' sums take per pass (4 blocks x 1024 float64s: in L1)
SQ_CHUNK = 1024


@njit(cache=True, nogil=True, error_model="numpy")
def _sq_diff_sums(y, t, bounds, out):
    """out[b] = :func:`_sq_diff_sum` of y[bounds[b]:bounds[b + 1]] and t's, each block's
    terms added in index order as there (the same bits). Each sum is a chain of dependent
    adds, which one block at a time leaves the core waiting on, so four blocks' sums run
    side by side, a chunk at a time: the squares first, in a pass that vectorises, then the
    four chains (docs/performance-notes.md)."""
    blocks = bounds.size - 1
    lo, n = np.empty(4, np.int64), np.empty(4, np.int64)
    sq = np.empty((4, SQ_CHUNK))
    for g in range(0, blocks, 4):
        count = min(4, blocks - g)
        for i in range(4):  # a group of fewer than four repeats its first block (and drops it)
            b = g + i if i < count else g
            lo[i], n[i] = bounds[b], bounds[b + 1] - bounds[b]
        common = min(n[0], n[1], n[2], n[3])
        s0 = s1 = s2 = s3 = 0.0
        for c0 in range(0, common, SQ_CHUNK):
            m = min(SQ_CHUNK, common - c0)
            for i in range(4):
                yi, ti, qi = y[lo[i] + c0:lo[i] + c0 + m], t[lo[i] + c0:lo[i] + c0 + m], sq[i]
                for j in range(m):
                    d = np.float64(yi[j]) - np.float64(ti[j])
                    qi[j] = d * d
            q0, q1, q2, q3 = sq[0], sq[1], sq[2], sq[3]
            for j in range(m):
                s0 += q0[j]
                s1 += q1[j]
                s2 += q2[j]
                s3 += q3[j]
        sums = (s0, s1, s2, s3)
        for i in range(count):  # each block's own rest, on its own chain
            s = sums[i]
            for j in range(lo[i] + common, lo[i] + n[i]):
                d = np.float64(y[j]) - np.float64(t[j])
                s += d * d
            out[g + i] = s


@njit(cache=True, nogil=True, parallel=True)
def _scaled_diff(y, t, scale, out):
    for i in prange(y.size):
        out[i] = scale * (y[i] - t[i])


@njit(cache=True, nogil=True, parallel=True)
def _softmax_xent(z, labels, probs):
    """probs = softmax(z) row by row; returns -sum log p[label] (float64)."""
    n, k = z.shape
    total = 0.0
    for i in prange(n):
        # max() and the row's own variable: an `if` updating m, or the sum added in one
        # expression, made Numba 0.68.0 under Python 3.12 fail ("unexpected cycle in lookup()")
        m = z[i, 0]
        for j in range(1, k):
            m = max(m, z[i, j])
        s = 0.0
        for j in range(k):
            e = math.exp(z[i, j] - m)  # in z's dtype, as the reference
            probs[i, j] = e
            s += e
        for j in range(k):
            probs[i, j] = probs[i, j] / s
        row = math.log(s) - (np.float64(z[i, labels[i]]) - np.float64(m))
        total += row
    return total


@njit(cache=True, nogil=True, parallel=True)
def _softmax_xent_grad(probs, labels, scale, dz):
    n, k = probs.shape
    for i in prange(n):
        for j in range(k):
            dz[i, j] = scale * probs[i, j]
        dz[i, labels[i]] -= scale


@njit(cache=True, nogil=True, parallel=True, error_model="numpy", fastmath={"contract"})
def _sigmoid_xent(z, t, y):
    """y = sigmoid(z); returns sum(max(z,0) - z t + log1p(exp(-|z|))) in float64.

    One exp serves both: exp(-|z|) is the sigmoid's and the log1p's. Both are nbmath's,
    so the pass vectorises (libm's are a scalar call per element); the
    terms are then added in index order, the same sum on any number of threads.
    """
    terms = np.empty(z.size)
    for i in prange(z.size):
        v = np.float64(z[i])
        a = abs(v)
        p, q, two_n = exp_parts(-(708.0 if a > 708.0 else a))  # NaN stays NaN; e(708) is 3e-308
        e = p * two_n / q
        s = 1.0 / (1.0 + e)
        y[i] = s if v >= 0 else e * s
        terms[i] = max(v, 0.0) - v * np.float64(t[i]) + log1p_unit(e)
    total = 0.0
    for i in range(z.size):
        total += terms[i]
    return total


def mse_forward(y, t, scale=None):
    """scale * 0.5 * sum((y - t)**2) as a Python float (scale defaults to 1/batch)."""
    check_same_shape("mse_forward", y, t)
    return default_scale(y, scale) * 0.5 * float(_sq_diff_sum(_flat(y), _flat(t)))


def mse_forward_blocks(y, t, starts, scale=None):
    """:func:`mse_forward` of each block of rows starts[b]:starts[b + 1] (the same bits as
    a call per block), one Python float per block, in one call."""
    check_same_shape("mse_forward_blocks", y, t)
    s = check_starts("mse_forward_blocks", y.shape[0], starts)
    yf, tf = _flat(y), _flat(t)
    width = yf.size // y.shape[0] if y.shape[0] else 0
    sums = np.empty(s.size - 1)
    _sq_diff_sums(yf, tf, s * width, sums)
    rows = s[1:] - s[:-1]
    return [(float(scale) if scale is not None else default_scale(y[:r], None)) * 0.5 * float(total)
            for r, total in zip(rows.tolist(), sums.tolist())]


def mse_backward(y, t, scale=None):
    """scale * (y - t) as a new array."""
    check_same_shape("mse_backward", y, t)
    return _scaled(y, t, default_scale(y, scale))


def _scaled(y, t, scale):
    dtype = np.result_type(y, t)
    out = np.empty(y.shape, dtype=dtype)
    _scaled_diff(_flat(y.astype(dtype, copy=False)), _flat(t.astype(dtype, copy=False)),
                 scale, out.reshape(-1))
    return out


def softmax_xent_forward(z, labels, scale=None):
    """Softmax cross-entropy from logits z (batch, classes) and int labels (batch,).

    Returns (loss, probs): loss = -scale * sum log softmax(z)[label] by log-sum-exp,
    probs = softmax(z) in z's dtype.
    """
    labels = np.asarray(labels)
    check_labels("softmax_xent_forward", z, labels)  # the kernel indexes with them unchecked
    z = np.ascontiguousarray(z)
    probs = np.empty(z.shape, dtype=z.dtype)
    total = _softmax_xent(z, np.ascontiguousarray(labels, dtype=np.int64), probs)
    return default_scale(z, scale) * float(total), probs


def softmax_xent_forward_blocks(z, labels, starts, scale=None):
    """:func:`softmax_xent_forward` of each block of rows starts[b]:starts[b + 1]: ([one
    Python float per block], probs of every row), each block's sum a call of its own (the
    bits of a call per block)."""
    labels = np.asarray(labels)
    check_labels("softmax_xent_forward_blocks", z, labels)
    s = check_starts("softmax_xent_forward_blocks", z.shape[0], starts).tolist()
    z, labels = np.ascontiguousarray(z), np.ascontiguousarray(labels, dtype=np.int64)
    probs = np.empty(z.shape, dtype=z.dtype)
    losses = [(float(scale) if scale is not None else default_scale(z[lo:hi], None))
              * float(_softmax_xent(z[lo:hi], labels[lo:hi], probs[lo:hi])) for lo, hi in zip(s[:-1], s[1:])]
    return losses, probs


def softmax_xent_backward(probs, labels, scale=None):
    """dz = scale * (probs - onehot(labels))."""
    labels = np.asarray(labels)
    check_labels("softmax_xent_backward", probs, labels)
    probs = np.ascontiguousarray(probs)
    dz = np.empty(probs.shape, dtype=probs.dtype)
    _softmax_xent_grad(probs, np.ascontiguousarray(labels, dtype=np.int64),
                       default_scale(probs, scale), dz)
    return dz


def sigmoid_xent_forward(z, t, scale=None):
    """Pixel cross-entropy of targets t in [0, 1] against y = sigmoid(z), from logits.

    Returns (loss, y): loss = -scale * sum(t log y + (1 - t) log(1 - y)), y in z's dtype.
    """
    check_same_shape("sigmoid_xent_forward", z, t)
    y = np.empty(z.shape, dtype=z.dtype)
    total = _sigmoid_xent(_flat(z), _flat(t), y.reshape(-1))
    return default_scale(z, scale) * float(total), y


def sigmoid_xent_forward_blocks(z, t, starts, scale=None):
    """:func:`sigmoid_xent_forward` of each block of rows starts[b]:starts[b + 1]: ([one
    Python float per block], y of every row), each block's sum its own chain (the bits of
    a call per block)."""
    check_same_shape("sigmoid_xent_forward_blocks", z, t)
    s = check_starts("sigmoid_xent_forward_blocks", z.shape[0], starts).tolist()
    y = np.empty(z.shape, dtype=z.dtype)
    zf, tf, yf = _flat(z), _flat(t), y.reshape(-1)
    width = zf.size // z.shape[0] if z.shape[0] else 0
    losses = []
    for lo, hi in zip(s[:-1], s[1:]):
        total = _sigmoid_xent(zf[lo * width:hi * width], tf[lo * width:hi * width], yf[lo * width:hi * width])
        losses.append((float(scale) if scale is not None else default_scale(z[lo:hi], None)) * float(total))
    return losses, y


def sigmoid_xent_backward(y, t, scale=None):
    """d loss / d z from y = sigmoid(z): scale * (y - t)."""
    check_same_shape("sigmoid_xent_backward", y, t)
    return _scaled(y, t, default_scale(y, scale))
