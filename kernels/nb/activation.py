"""Activation functions, forward and backward (Numba).

One compiled loop per direction serves all activations (``code`` picks one); the scalar
helpers here are shared with the fused dense kernels. ``one`` is 1 in the array's dtype:
a Python literal would promote float32 arithmetic to float64 inside the loop.
"""

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from ..ref.activation import check_act
from .nbmath import sigmoid32, sigmoid64

__all__ = ["sigmoid_forward", "sigmoid_backward", "relu_forward", "relu_backward",
           "identity_forward", "identity_backward"]

SIGMOID, RELU, IDENTITY = 0, 1, 2
CODES = {"sigmoid": SIGMOID, "relu": RELU, "identity": IDENTITY}


def act_code(act):
    check_act(act)
    return CODES[act]


def sigmoid(v, one):
    """The logistic sigmoid of one value in compiled loops: nbmath's, which vectorise
    (libm's exp is a scalar call per element, which kept these loops slow), float32
    arithmetic for float32 (twice the lanes; ~2.5 ulp, the tails down to the smallest
    subnormal), float64 otherwise (below -708 exactly 0). A NaN stays NaN (the divergence
    guard looks for it)."""


@overload(sigmoid, inline="always")
def _sigmoid_impl(v, one):
    if v == types.float32:
        return lambda v, one: sigmoid32(v)

    def impl(v, one):
        s = sigmoid64(np.float64(v))
        return s if v > -708.0 else (0.0 if v <= -708.0 else np.float64(v))
    return impl


@njit(cache=True, nogil=True)
def relu(v, zero):
    return zero if v < zero else v  # NaN propagates, as np.maximum


@njit(cache=True, nogil=True)
def relu_grad(da, a, zero):
    return da if a > zero else zero


@njit(cache=True, nogil=True, parallel=True, error_model="numpy", fastmath={"contract"})
def _forward(z, out, code, one):
    zero = one - one
    if code == SIGMOID:
        for i in prange(z.size):
            out[i] = sigmoid(z[i], one)
    else:
        for i in prange(z.size):
            out[i] = relu(z[i], zero)


@njit(cache=True, nogil=True, parallel=True)
def _backward(da, a, out, code, one):
    zero = one - one
    if code == SIGMOID:
        for i in prange(da.size):
            out[i] = da[i] * a[i] * (one - a[i])
    else:
        for i in prange(da.size):
            out[i] = relu_grad(da[i], a[i], zero)


def _flat(a):
    """C-contiguous 1-D view (copies only a non-contiguous input)."""
    return np.ascontiguousarray(a).reshape(-1)


def _apply(z, code):
    out = np.empty(z.shape, dtype=z.dtype)
    _forward(_flat(z), out.reshape(-1), code, z.dtype.type(1))
    return out


def sigmoid_forward(z):
    """Logistic sigmoid, stable for any z; a new array of z's shape and dtype."""
    return _apply(z, SIGMOID)


def _apply_backward(da, a, code):
    if da.shape != a.shape:
        raise ValueError(f"activation backward: da {da.shape} and a {a.shape} differ in shape")
    dtype = np.result_type(da, a)
    out = np.empty(da.shape, dtype=dtype)
    _backward(_flat(da.astype(dtype, copy=False)), _flat(a.astype(dtype, copy=False)),
              out.reshape(-1), code, dtype.type(1))
    return out


def sigmoid_backward(da, a):
    """dz = da * a * (1 - a), with ``a`` the sigmoid output."""
    return _apply_backward(da, a, SIGMOID)


def relu_forward(z):
    """max(z, 0) as a new array."""
    return _apply(z, RELU)


def relu_backward(da, a):
    """dz = da where a > 0, else 0."""
    return _apply_backward(da, a, RELU)


def identity_forward(z):
    """A copy of z."""
    return np.array(z, copy=True)


def identity_backward(da, a):
    """A copy of da."""
    if da.shape != a.shape:
        raise ValueError(f"activation backward: da {da.shape} and a {a.shape} differ in shape")
    return np.array(da, copy=True)
