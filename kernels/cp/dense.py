"""Fully connected layer a = act(x @ W + b), forward and backward (CuPy).

Products go to cuBLAS through cupy.matmul; bias + activation is one element-wise kernel
applied in place on the matmul output (b broadcast along the rows).
"""
import cupy as cp

from ..ref.activation import check_act
from ..ref.dense import _check_backward_shapes, _check_shapes, backward_by_block, forward_by_block
from .activation import RELU_BODY, SIGMOID_BODY, _relu_grad, _sigmoid_grad

__all__ = ["dense_forward", "dense_backward", "dense_backward_factors", "dense_forward_blocks",
           "dense_backward_blocks"]

# z is read and written: an output argument of an ElementwiseKernel may be read
_BIAS_ACT = {
    "sigmoid": cp.ElementwiseKernel("T b", "T z", "T v = z + b; " + SIGMOID_BODY.format(out="z"),
                                    "aepar_bias_sigmoid"),
    "relu": cp.ElementwiseKernel("T b", "T z", "T v = z + b; " + RELU_BODY.format(out="z"),
                                 "aepar_bias_relu"),
    "identity": cp.ElementwiseKernel("T b", "T z", "z += b", "aepar_bias_identity"),
}
_ACT_GRAD = {"sigmoid": _sigmoid_grad, "relu": _relu_grad}


def dense_forward(x, W, b, act):
    """a = act(x @ W + b); x (batch, in), W (in, out), b (out,). Returns a new array."""
    check_act(act)
    _check_shapes(x, W, b)
    z = cp.matmul(x, W)
    _BIAS_ACT[act](b.astype(z.dtype, copy=False), z)
    return z


def dense_backward(da, x, W, a, act, dW, db, need_dx=True):
    """Backward of :func:`dense_forward` from its output ``a``.

    Adds x.T @ dz into ``dW`` and the column sums of dz into ``db`` (caller-zeroed),
    with dz = da * act'(a). Returns dx = dz @ W.T, or None when ``need_dx`` is false.
    """
    _check_backward_shapes(da, x, W, a, dW, db)
    dx, dz = dense_backward_factors(da, x, W, a, act, db, need_dx)
    dW += cp.matmul(x.T, dz)
    return dx


def dense_backward_factors(da, x, W, a, act, db, need_dx=True):
    """:func:`dense_backward` without its weight product: adds into ``db``, returns
    (dx or None, dz) with the W gradient x.T @ dz (see kernels.ref.dense)."""
    check_act(act)
    _check_backward_shapes(da, x, W, a, W, db)
    dz = da if act == "identity" else _ACT_GRAD[act](da, a)
    db += dz.sum(axis=0, dtype=cp.float64).astype(db.dtype, copy=False)
    return (cp.matmul(dz, W.T) if need_dx else None), dz


def dense_forward_blocks(x, W, b, act, starts):
    """:func:`dense_forward` block by block, stacked (see kernels.ref.dense)."""
    return forward_by_block(dense_forward, cp, x, W, b, act, starts)


def dense_backward_blocks(da, x, W, a, act, dbs, starts, need_dx=True):
    """:func:`dense_backward_factors` block by block, stacked (see kernels.ref.dense)."""
    return backward_by_block(dense_backward_factors, cp, da, x, W, a, act, dbs, starts, need_dx)
