"""Activation functions, forward and backward (CuPy element-wise kernels).

The kernel bodies are shared with the fused dense kernels (cp/dense.py). Constants are
cast to T so float32 arrays are computed in float32.
"""
import cupy as cp

__all__ = ["sigmoid_forward", "sigmoid_backward", "relu_forward", "relu_backward",
           "identity_forward", "identity_backward"]

# exp(-|v|) never overflows; for v < 0, sigmoid(v) = e / (1 + e) = e * (1 / (1 + e))
SIGMOID_BODY = "T e = exp(-fabs(v)); T s = (T)1 / ((T)1 + e); {out} = v >= (T)0 ? s : e * s;"
RELU_BODY = "{out} = v < (T)0 ? (T)0 : v;"  # NaN propagates, as np.maximum

_sigmoid = cp.ElementwiseKernel("T z", "T a", "T v = z; " + SIGMOID_BODY.format(out="a"),
                                "aepar_sigmoid_forward")
_relu = cp.ElementwiseKernel("T z", "T a", "T v = z; " + RELU_BODY.format(out="a"),
                             "aepar_relu_forward")
_sigmoid_grad = cp.ElementwiseKernel("T da, T a", "T dz", "dz = da * a * ((T)1 - a)",
                                     "aepar_sigmoid_backward")
_relu_grad = cp.ElementwiseKernel("T da, T a", "T dz", "dz = a > (T)0 ? da : (T)0",
                                  "aepar_relu_backward")


def _check(da, a):
    if da.shape != a.shape:
        raise ValueError(f"activation backward: da {da.shape} and a {a.shape} differ in shape")


def sigmoid_forward(z):
    """Logistic sigmoid, stable for any z; a new array of z's shape and dtype."""
    return _sigmoid(z)


def sigmoid_backward(da, a):
    """dz = da * a * (1 - a), with ``a`` the sigmoid output."""
    _check(da, a)
    return _sigmoid_grad(da, a)


def relu_forward(z):
    """max(z, 0) as a new array."""
    return _relu(z)


def relu_backward(da, a):
    """dz = da where a > 0, else 0."""
    _check(da, a)
    return _relu_grad(da, a)


def identity_forward(z):
    """A copy of z."""
    return z.copy()


def identity_backward(da, a):
    """A copy of da."""
    _check(da, a)
    return da.copy()
