"""Regularisers of the sparse autoencoder, forward and backward (Numba)."""
import math

import numpy as np
from numba import njit, prange

from ..ref import sparsity as _ref
from .activation import _flat

__all__ = ["kl_sparsity_forward", "kl_sparsity_backward", "weight_decay_forward",
           "weight_decay_backward"]


# rho_hat has one entry per hidden unit (tens to a thousand): serial loops, no threads
# kl_sum and kl_grad_into are also called from the sparse autoencoder's kernels
@njit(cache=True, nogil=True)
def kl_sum(rho_hat, rho, beta):
    s = 0.0
    for j in range(rho_hat.size):
        r = np.float64(rho_hat[j])
        s += rho * math.log(rho / r) + (1.0 - rho) * math.log((1.0 - rho) / (1.0 - r))
    return beta * s


@njit(cache=True, nogil=True)
def kl_grad_into(rho_hat, rho, beta, out):
    for j in range(rho_hat.size):
        r = rho_hat[j]
        out[j] = beta * (-rho / r + (1.0 - rho) / (1.0 - r))


@njit(cache=True, nogil=True, parallel=True)
def _sum_sq(w):
    s = 0.0
    for i in prange(w.size):
        v = np.float64(w[i])
        s += v * v
    return s


@njit(cache=True, nogil=True, parallel=True)
def _axpy(lam, w, dw):
    for i in prange(w.size):
        dw[i] += lam * w[i]


def kl_sparsity_forward(rho_hat, rho, beta):
    """beta * sum_j KL(rho || rho_hat_j) as a Python float."""
    return float(kl_sum(_flat(rho_hat), float(rho), float(beta)))


def kl_sparsity_backward(rho_hat, rho, beta):
    """beta * (-rho/rho_hat + (1-rho)/(1-rho_hat)), a new array of rho_hat's dtype."""
    out = np.empty(rho_hat.shape, dtype=rho_hat.dtype)
    kl_grad_into(_flat(rho_hat), float(rho), float(beta), out.reshape(-1))
    return out


def weight_decay_forward(W, lam):
    """lam / 2 * sum(W**2) as a Python float."""
    return 0.5 * float(lam) * float(_sum_sq(_flat(W)))


def weight_decay_backward(W, lam, dW):
    """dW += lam * W in place (returns None)."""
    if dW.shape != W.shape:
        raise ValueError(f"weight_decay_backward: dW {dW.shape} and W {W.shape} differ in shape")
    if not (dW.flags.c_contiguous and dW.flags.writeable):
        return _ref.weight_decay_backward(W, lam, dW)  # a flat view of dW would be a copy
    _axpy(dW.dtype.type(lam), _flat(W), dW.reshape(-1))  # float32 arithmetic for float32 dW, as NumPy's
