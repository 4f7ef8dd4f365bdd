"""Activation functions, forward and backward (NumPy reference).

Backward takes the upstream gradient ``da`` and the forward *output* ``a`` (never the
pre-activation): every activation here has a derivative that is a function of its output,
so layers keep one array per layer, not two.
"""
import numpy as np

__all__ = ["sigmoid_forward", "sigmoid_backward", "relu_forward", "relu_backward",
           "identity_forward", "identity_backward"]


def sigmoid_forward(z):
    """Logistic sigmoid 1 / (1 + exp(-z)), stable for any z.

    Parameters
    ----------
    z : ndarray
        Pre-activations, any shape, float32 or float64.

    Returns
    -------
    ndarray
        New array of ``z``'s shape and dtype.
    """
    # exp(-|z|) never overflows; the two branches are the same function.
    e = np.exp(-np.abs(z))
    s = 1 / (1 + e)
    return np.where(z >= 0, s, e * s)


def sigmoid_backward(da, a):
    """dz = da * a * (1 - a), with ``a`` the sigmoid output."""
    return da * a * (1 - a)


def relu_forward(z):
    """max(z, 0) as a new array (NaN propagates)."""
    return np.maximum(z, 0)


def relu_backward(da, a):
    """dz = da where a > 0, else 0 (the derivative at 0 taken as 0)."""
    return np.where(a > 0, da, 0).astype(da.dtype, copy=False)


def identity_forward(z):
    """A copy of z (callers may write into the output)."""
    return np.array(z, copy=True)


def identity_backward(da, a):
    """A copy of da."""
    return np.array(da, copy=True)


# by name, for the dense layer (private: not star-exported)
FORWARD = {"sigmoid": sigmoid_forward, "relu": relu_forward, "identity": identity_forward}
BACKWARD = {"sigmoid": sigmoid_backward, "relu": relu_backward, "identity": identity_backward}


def check_act(act):
    """Raise ValueError for an activation name no kernel set knows."""
    if act not in FORWARD:
        raise ValueError(f"unknown activation {act!r}; choose from {', '.join(FORWARD)}")
