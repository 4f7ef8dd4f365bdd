"""Fully connected layer a = act(x @ W + b), forward and backward (NumPy reference)."""
import numpy as np

from .activation import BACKWARD, FORWARD, check_act

__all__ = ["dense_forward", "dense_backward", "dense_backward_factors"]


def dense_forward(x, W, b, act):
    """a = act(x @ W + b).

    Parameters
    ----------
    x : ndarray (batch, in)
    W : ndarray (in, out)
    b : ndarray (out,)
    act : {"sigmoid", "relu", "identity"}

    Returns
    -------
    ndarray (batch, out), a new array.
    """
    check_act(act)
    _check_shapes(x, W, b)
    z = x @ W
    z += b
    return FORWARD[act](z)


def dense_backward(da, x, W, a, act, dW, db, need_dx=True):
    """Backward of :func:`dense_forward` from its output ``a``.

    Adds x.T @ dz into ``dW`` and the column sums of dz into ``db`` (arrays the caller
    zeroed), where dz = da * act'(a).

    Returns
    -------
    ndarray (batch, in) or None
        dx = dz @ W.T, or None when ``need_dx`` is false (the first layer).
    """
    _check_backward_shapes(da, x, W, a, dW, db)
    dx, dz = dense_backward_factors(da, x, W, a, act, db, need_dx)
    dW += x.T @ dz
    return dx


def dense_backward_factors(da, x, W, a, act, db, need_dx=True):
    """:func:`dense_backward` without its weight product, for a caller that adds many
    blocks' products at once (``block_outer_sum``): adds the column sums of dz into ``db``
    and returns (dx or None, dz), the W gradient being x.T @ dz."""
    check_act(act)
    _check_backward_shapes(da, x, W, a, W, db)
    dz = BACKWARD[act](da, a)
    db += dz.sum(axis=0, dtype=np.float64)
    return (dz @ W.T if need_dx else None), dz


def _check_shapes(x, W, b):
    if x.ndim != 2 or W.ndim != 2 or x.shape[1] != W.shape[0]:
        raise ValueError(f"dense: x {x.shape} and W {W.shape} do not chain as (batch, in) @ (in, out)")
    if b.shape != (W.shape[1],):
        raise ValueError(f"dense: b has shape {b.shape}, expected ({W.shape[1]},)")


def _check_backward_shapes(da, x, W, a, dW, db):
    """Shared by every kernel set (the compiled ones index without bounds checks)."""
    _check_shapes(x, W, db)
    want = (x.shape[0], W.shape[1])
    if da.shape != want or a.shape != want:
        raise ValueError(f"dense_backward: da {da.shape} and a {a.shape} must both be {want}")
    if dW.shape != W.shape:
        raise ValueError(f"dense_backward: dW has shape {dW.shape}, expected {W.shape}")
