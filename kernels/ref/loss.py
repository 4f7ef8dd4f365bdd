"""Losses, forward and backward (NumPy reference).

``scale`` multiplies the summed loss and its gradient; it defaults to 1/batch
(1 / first dimension), so the loss is a per-example mean. Data-parallel callers pass
1/global_batch so that summing the ranks' results gives the global mean. Scalar losses
are summed in float64 and returned as Python floats; arrays keep the input dtype.
"""
import numpy as np

from .activation import sigmoid_forward
from .blocksum import check_starts

__all__ = ["mse_forward", "mse_forward_blocks", "mse_backward", "softmax_xent_forward", "softmax_xent_forward_blocks",
           "softmax_xent_backward",
           "sigmoid_xent_forward", "sigmoid_xent_forward_blocks", "sigmoid_xent_backward"]


def default_scale(y, scale):
    """1/batch unless the caller chose (private helper, shared with the other sets)."""
    if scale is not None:
        return float(scale)
    if y.ndim == 0 or y.shape[0] == 0:
        raise ValueError(f"loss: cannot take a per-example mean over an array of shape {y.shape}")
    return 1.0 / y.shape[0]


def check_same_shape(name, y, t):
    if y.shape != t.shape:
        raise ValueError(f"{name}: prediction {y.shape} and target {t.shape} differ in shape")


def check_labels(name, z, labels):
    """Labels must be one int per row of ``z``, each in [0, classes)."""
    if z.ndim != 2:
        raise ValueError(f"{name}: logits must be (batch, classes), not {z.shape}")
    if labels.shape != (z.shape[0],) or labels.dtype.kind not in "iu":
        raise ValueError(f"{name}: labels must be {z.shape[0]} integers, got {labels.dtype} {labels.shape}")
    if labels.size and (labels.min() < 0 or labels.max() >= z.shape[1]):
        raise ValueError(f"{name}: labels must lie in [0, {z.shape[1]}), "
                         f"got [{labels.min()}, {labels.max()}]")


def mse_forward(y, t, scale=None):
    """scale * 0.5 * sum((y - t)**2) as a Python float."""
    check_same_shape("mse_forward", y, t)
    d = y.astype(np.float64) - t
    return default_scale(y, scale) * 0.5 * float(np.vdot(d, d))


def mse_forward_blocks(y, t, starts, scale=None):
    """:func:`mse_forward` of each block of rows starts[b]:starts[b + 1], one loss per block
    (``scale`` defaults to each block's 1/rows)."""
    return mse_forward_blocks_via(mse_forward, y, t, starts, scale)


def mse_forward_blocks_via(mse_forward, y, t, starts, scale=None):
    """:func:`mse_forward_blocks` as a call of a set's ``mse_forward`` per block (the
    reference's and the GPU set's way)."""
    check_same_shape("mse_forward_blocks", y, t)
    s = check_starts("mse_forward_blocks", y.shape[0], starts).tolist()
    return [mse_forward(y[lo:hi], t[lo:hi], scale) for lo, hi in zip(s[:-1], s[1:])]


def mse_backward(y, t, scale=None):
    """d/dy of :func:`mse_forward`: scale * (y - t)."""
    check_same_shape("mse_backward", y, t)
    return default_scale(y, scale) * (y - t)


def softmax_xent_forward(z, labels, scale=None):
    """Softmax cross-entropy from logits.

    Parameters
    ----------
    z : ndarray (batch, classes)
    labels : int ndarray (batch,)

    Returns
    -------
    loss : float
        -scale * sum_i log softmax(z_i)[labels_i], by log-sum-exp (no overflow).
    probs : ndarray (batch, classes)
        softmax(z), z's dtype, for the backward.
    """
    labels = np.asarray(labels)
    check_labels("softmax_xent_forward", z, labels)
    m = z.max(axis=1, keepdims=True)
    e = np.exp(z - m)
    s = e.sum(axis=1, keepdims=True, dtype=np.float64)
    probs = (e / s).astype(z.dtype, copy=False)
    rows = np.arange(z.shape[0])
    # log p[label] = (z[label] - max) - log(sum exp(z - max)), in float64
    logp = (z[rows, labels].astype(np.float64) - m[:, 0]) - np.log(s[:, 0])
    return -default_scale(z, scale) * float(logp.sum()), probs


def softmax_xent_forward_blocks(z, labels, starts, scale=None):
    """:func:`softmax_xent_forward` of each block of rows starts[b]:starts[b + 1]: ([one loss
    per block], probs of every row), the bits of a call per block (``scale`` defaults to
    each block's 1/rows)."""
    labels = np.asarray(labels)
    check_labels("softmax_xent_forward_blocks", z, labels)
    s = check_starts("softmax_xent_forward_blocks", z.shape[0], starts).tolist()
    each = [softmax_xent_forward(z[lo:hi], labels[lo:hi], scale) for lo, hi in zip(s[:-1], s[1:])]
    return [loss for loss, _ in each], np.concatenate([probs for _, probs in each])


def softmax_xent_backward(probs, labels, scale=None):
    """dz = scale * (probs - onehot(labels))."""
    labels = np.asarray(labels)
    check_labels("softmax_xent_backward", probs, labels)
    scale = default_scale(probs, scale)
    dz = scale * probs
    dz[np.arange(probs.shape[0]), labels] -= scale
    return dz


def sigmoid_xent_forward(z, t, scale=None):
    """Pixel cross-entropy of targets ``t`` in [0, 1] against y = sigmoid(z).

    loss = -scale * sum(t log y + (1 - t) log(1 - y)), computed from the logits as
    sum(max(z, 0) - z t + log1p(exp(-|z|))), which neither overflows nor takes log(0).

    Returns
    -------
    loss : float
    y : ndarray, sigmoid(z) in z's dtype
    """
    check_same_shape("sigmoid_xent_forward", z, t)
    zd = z.astype(np.float64)
    terms = np.maximum(zd, 0) - zd * t + np.log1p(np.exp(-np.abs(zd)))
    return default_scale(z, scale) * float(terms.sum()), sigmoid_forward(z)


def sigmoid_xent_forward_blocks(z, t, starts, scale=None):
    """:func:`sigmoid_xent_forward` of each block of rows starts[b]:starts[b + 1]: ([one
    loss per block], y = sigmoid(z) of every row), the bits of a call per block (``scale``
    defaults to each block's 1/rows)."""
    return sigmoid_xent_forward_blocks_via(sigmoid_xent_forward, sigmoid_forward, z, t, starts, scale)


def sigmoid_xent_forward_blocks_via(sigmoid_xent_forward, sigmoid, z, t, starts, scale=None):
    """:func:`sigmoid_xent_forward_blocks` as a call of a set's ``sigmoid_xent_forward`` per
    block for the losses and one of its ``sigmoid`` for y (element-wise: the bits of the
    blocks' calls)."""
    check_same_shape("sigmoid_xent_forward_blocks", z, t)
    s = check_starts("sigmoid_xent_forward_blocks", z.shape[0], starts).tolist()
    return [sigmoid_xent_forward(z[lo:hi], t[lo:hi], scale)[0] for lo, hi in zip(s[:-1], s[1:])], sigmoid(z)


def sigmoid_xent_backward(y, t, scale=None):
    """d loss / d z of :func:`sigmoid_xent_forward`, from y = sigmoid(z): scale * (y - t)."""
    check_same_shape("sigmoid_xent_backward", y, t)
    return default_scale(y, scale) * (y - t)
