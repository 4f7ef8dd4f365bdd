"""Parameter updates in place (CuPy): one element-wise kernel per step and parameter."""
import cupy as cp

from ..ref.update import check_step, check_update

__all__ = ["sgd_momentum_update", "adam_update"]

# p and v are outputs that are also read: updated where they lie
_sgd = cp.ElementwiseKernel(
    "T g, T lr, T momentum, T decay", "T p, T v",
    "v = momentum * v - lr * (g + decay * p); p += v;", "aepar_sgd_momentum")
# 1 - beta comes from the host in double: 1 - (float)0.999 is off by 1e-5 relative
_adam = cp.ElementwiseKernel(
    "T g, T lr, T beta1, T c1, T beta2, T c2, T eps, T bc1, T bc2", "T p, T m, T v",
    """m = beta1 * m + c1 * g;
    v = beta2 * v + c2 * g * g;
    p -= lr * (m / bc1) / (sqrt(v / bc2) + eps);""", "aepar_adam")


def sgd_momentum_update(p, g, v, lr, momentum, weight_decay=0.0):
    """v = momentum * v - lr * (g + weight_decay * p); p += v, in place. Returns None."""
    check_update("sgd_momentum_update", p, g, v)
    t = p.dtype.type
    _sgd(g.astype(p.dtype, copy=False), t(lr), t(momentum), t(weight_decay), p, v)


def adam_update(p, g, m, v, t, lr, beta1=0.9, beta2=0.999, eps=1e-8):
    """One Adam step with bias correction at step t = 1, 2, ..., in place. Returns None."""
    check_update("adam_update", p, g, m, v)
    check_step(t)
    # bias corrections in double on the host, then cast once
    bc1 = 1.0 - float(beta1) ** int(t)
    bc2 = 1.0 - float(beta2) ** int(t)
    d = p.dtype.type
    _adam(g.astype(p.dtype, copy=False), d(lr), d(beta1), d(1.0 - float(beta1)), d(beta2),
          d(1.0 - float(beta2)), d(eps), d(bc1), d(bc2), p, m, v)
