"""Losses, forward and backward (CuPy): reductions accumulate in double.

Same conventions as the reference: ``scale`` defaults to 1/batch, arrays keep the input
dtype. Scalar losses stay on the device as 0-d float64 arrays (the kernel contract): reading
one waits for the GPU, so a training step that reads its loss cannot queue the next step
behind it. ``float(loss)`` reads it.
"""
import cupy as cp

from ..ref.loss import check_same_shape, default_scale
from .activation import _sigmoid

__all__ = ["mse_forward", "mse_backward", "softmax_xent_forward", "softmax_xent_backward",
           "sigmoid_xent_forward", "sigmoid_xent_backward"]

# A whole-array ReductionKernel runs in one thread block (1.8 ms for a 5000x784 batch on an
# H200), so the scalar losses take two: one sum per row, then the rows' sums, scaled.
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


def _by_rows(y):
    """y as (rows, rest): the first stage of a loss sums along axis 1."""
    return y.reshape(y.shape[0], -1) if y.ndim >= 2 else y.reshape(1, -1)


def _scaled_total(rows_kernel, y, t, scale):
    """scale * (the sum over every element of ``rows_kernel``'s map), a 0-d float64 array."""
    return _scaled_sum(rows_kernel(_by_rows(y), _by_rows(t), axis=1), scale)


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
    return _scaled_total(_sq_diff_rows, y, t, 0.5 * default_scale(y, scale))


def mse_backward(y, t, scale=None):
    """scale * (y - t) as a new array."""
    check_same_shape("mse_backward", y, t)
    return _scaled_diff(y, t.astype(y.dtype, copy=False), y.dtype.type(default_scale(y, scale)))


def softmax_xent_forward(z, labels, scale=None):
    """Softmax cross-entropy from logits z (batch, classes) and int labels (batch,).

    Returns (loss, probs) as the reference, the loss a 0-d float64 array.
    """
    labels = cp.asarray(labels)
    _check_labels("softmax_xent_forward", z, labels)
    m = z.max(axis=1, keepdims=True)
    probs = cp.exp(z - m)
    s = probs.sum(axis=1, keepdims=True, dtype=cp.float64)
    probs /= s.astype(z.dtype)
    rows = cp.arange(z.shape[0])
    logp = (z[rows, labels].astype(cp.float64) - m[:, 0]) - cp.log(s[:, 0])
    return logp.sum() * -default_scale(z, scale), probs


def softmax_xent_backward(probs, labels, scale=None):
    """dz = scale * (probs - onehot(labels))."""
    labels = cp.asarray(labels)
    _check_labels("softmax_xent_backward", probs, labels)
    scale = default_scale(probs, scale)
    dz = probs * probs.dtype.type(scale)
    dz[cp.arange(probs.shape[0]), labels] -= scale
    return dz


def sigmoid_xent_forward(z, t, scale=None):
    """Pixel cross-entropy of targets t in [0, 1] against y = sigmoid(z), from logits.

    Returns (loss, y) as the reference, the loss a 0-d float64 array.
    """
    check_same_shape("sigmoid_xent_forward", z, t)
    return _scaled_total(_sigmoid_xent_rows, z, t, default_scale(z, scale)), _sigmoid(z)


def sigmoid_xent_backward(y, t, scale=None):
    """d loss / d z from y = sigmoid(z): scale * (y - t)."""
    check_same_shape("sigmoid_xent_backward", y, t)
    return _scaled_diff(y, t.astype(y.dtype, copy=False), y.dtype.type(default_scale(y, scale)))
