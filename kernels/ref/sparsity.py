"""Regularisers of the sparse autoencoder, forward and backward (NumPy reference)."""
import numpy as np

__all__ = ["kl_sparsity_forward", "kl_sparsity_backward", "weight_decay_forward",
           "weight_decay_backward"]


def kl_sparsity_forward(rho_hat, rho, beta):
    """beta * sum_j KL(rho || rho_hat_j) for Bernoulli units, as a Python float.

    Parameters
    ----------
    rho_hat : ndarray (hidden,)
        Mean activation of each hidden unit over all examples, in (0, 1).
    rho : float
        Target activation, in (0, 1).
    beta : float
        Weight of the penalty.
    """
    r = rho_hat.astype(np.float64)
    kl = rho * np.log(rho / r) + (1 - rho) * np.log((1 - rho) / (1 - r))
    return float(beta * kl.sum())


def kl_sparsity_backward(rho_hat, rho, beta):
    """d/d rho_hat of :func:`kl_sparsity_forward`: beta * (-rho/rho_hat + (1-rho)/(1-rho_hat))."""
    return (beta * (-rho / rho_hat + (1 - rho) / (1 - rho_hat))).astype(rho_hat.dtype, copy=False)


def weight_decay_forward(W, lam):
    """lam / 2 * sum(W**2) as a Python float (summed in float64)."""
    w = W.reshape(-1).astype(np.float64)
    return 0.5 * lam * float(np.dot(w, w))


def weight_decay_backward(W, lam, dW):
    """dW += lam * W (in place; returns None)."""
    if dW.shape != W.shape:
        raise ValueError(f"weight_decay_backward: dW {dW.shape} and W {W.shape} differ in shape")
    dW += lam * W
