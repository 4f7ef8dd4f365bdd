"""Regularisers of the sparse autoencoder, forward and backward (CuPy)."""
import cupy as cp

__all__ = ["kl_sparsity_forward", "kl_sparsity_backward", "weight_decay_forward",
           "weight_decay_backward"]

_kl_sum = cp.ReductionKernel(
    "T rho_hat, float64 rho", "float64 s",
    "rho * log(rho / (double)rho_hat) + (1.0 - rho) * log((1.0 - rho) / (1.0 - (double)rho_hat))",
    "a + b", "s = a", "0", "aepar_kl_sum")
_kl_grad = cp.ElementwiseKernel(
    "T r, T rho, T beta", "T g", "g = beta * (-rho / r + ((T)1 - rho) / ((T)1 - r))",
    "aepar_kl_backward")
_sum_sq = cp.ReductionKernel("T w", "float64 s", "(double)w * (double)w", "a + b", "s = a", "0",
                             "aepar_sum_sq")
_axpy = cp.ElementwiseKernel("T w, T lam", "T dw", "dw += lam * w", "aepar_weight_decay_backward")


def kl_sparsity_forward(rho_hat, rho, beta):
    """beta * sum_j KL(rho || rho_hat_j) as a Python float."""
    return float(beta) * float(_kl_sum(rho_hat, float(rho)))


def kl_sparsity_backward(rho_hat, rho, beta):
    """beta * (-rho/rho_hat + (1-rho)/(1-rho_hat)), a new array of rho_hat's dtype."""
    t = rho_hat.dtype.type
    return _kl_grad(rho_hat, t(rho), t(beta))


def weight_decay_forward(W, lam):
    """lam / 2 * sum(W**2) as a Python float."""
    return 0.5 * float(lam) * float(_sum_sq(W))


def weight_decay_backward(W, lam, dW):
    """dW += lam * W in place (returns None)."""
    if dW.shape != W.shape:
        raise ValueError(f"weight_decay_backward: dW {dW.shape} and W {W.shape} differ in shape")
    _axpy(W.astype(dW.dtype, copy=False), dW.dtype.type(lam), dW)
