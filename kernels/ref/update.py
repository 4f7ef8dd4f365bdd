"""Parameter updates, in place (NumPy reference). Every array is updated where it lies."""
import numpy as np

__all__ = ["sgd_momentum_update", "sgd_momentum_update_many", "adam_update", "adam_update_many"]


def check_update(name, p, *others):
    for a in others:
        if a.shape != p.shape:
            raise ValueError(f"{name}: every array must have the parameter's shape {p.shape}, got {a.shape}")


def check_many(name, ps, *others):
    """The parameter lists of a ``*_many`` update: the same length, each array its parameter's shape."""
    for a in others:
        if len(a) != len(ps):
            raise ValueError(f"{name}: {len(ps)} parameters but a list of {len(a)} arrays")
    for arrays in zip(ps, *others):
        check_update(name, *arrays)


def check_step(t):
    if int(t) != t or t < 1:
        raise ValueError(f"adam_update: step t counts from 1, got {t!r}")


def sgd_momentum_update(p, g, v, lr, momentum, weight_decay=0.0):
    """v = momentum * v - lr * (g + weight_decay * p); p += v. Returns None. The weight
    decay is sparsity's weight_decay_backward folded in: g itself is left as it was."""
    check_update("sgd_momentum_update", p, g, v)
    if weight_decay:
        g = g + weight_decay * p
    v *= momentum
    v -= lr * g
    p += v


def sgd_momentum_update_many(ps, gs, vs, lrs, momentum, weight_decays=None):
    """:func:`sgd_momentum_update` on each parameter's (p, g, v) of the three lists, at its
    own rate of ``lrs``, in place; ``weight_decays``: each parameter's (default none)."""
    sgd_each(sgd_momentum_update, ps, gs, vs, lrs, momentum, weight_decays)


def sgd_each(update, ps, gs, vs, lrs, momentum, weight_decays=None):
    """A set's ``sgd_momentum_update_many`` as its ``update`` called on each parameter: the
    bits of one call each (a CPU set's; the cupy set's is one launch for all)."""
    for p, g, v, lr, c in zip(ps, gs, vs, lrs, check_sgd_many(ps, gs, vs, lrs, weight_decays)):
        update(p, g, v, lr, momentum, c)


def check_sgd_many(ps, gs, vs, lrs, weight_decays) -> list:
    """The lists of a ``sgd_momentum_update_many`` checked (every set's); returns each
    parameter's weight decay as a float."""
    check_many("sgd_momentum_update_many", ps, gs, vs)
    if len(lrs) != len(ps):
        raise ValueError(f"sgd_momentum_update_many: {len(ps)} parameters but {len(lrs)} rates")
    return decays_of(ps, weight_decays, "sgd_momentum_update_many")


def adam_update(p, g, m, v, t, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0):
    """One Adam step (Kingma & Ba, Algorithm 1) at step ``t`` (1, 2, ...), in place.

    m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2;
    p -= lr * m_hat / (sqrt(v_hat) + eps), m_hat = m / (1 - beta1^t), v_hat = v / (1 - beta2^t).
    ``weight_decay`` is decoupled from the gradient (AdamW, Loshchilov & Hutter): p is first
    shrunk by the factor 1 - lr * weight_decay, whatever Adam's scaling of g.
    """
    check_update("adam_update", p, g, m, v)
    check_step(t)
    if weight_decay:
        p *= p.dtype.type(1.0 - lr * weight_decay)
    m *= beta1
    m += (1 - beta1) * g
    v *= beta2
    v += (1 - beta2) * (g * g)
    m_hat = m / (1 - beta1 ** t)
    v_hat = v / (1 - beta2 ** t)
    p -= lr * m_hat / (np.sqrt(v_hat) + eps)


def adam_update_many(ps, gs, ms, vs, t, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decays=None):
    """:func:`adam_update` on each parameter's (p, g, m, v) of the four lists, in place;
    ``weight_decays``: each parameter's ``weight_decay`` (default none)."""
    adam_each(adam_update, ps, gs, ms, vs, t, lr, beta1, beta2, eps, weight_decays)


def decays_of(ps, weight_decays, name="adam_update_many") -> list:
    """Each parameter's weight decay as a float: ``weight_decays`` checked against ``ps``,
    or zeros when it is None."""
    if weight_decays is None:
        return [0.0] * len(ps)
    if len(weight_decays) != len(ps):
        raise ValueError(f"{name}: {len(ps)} parameters but {len(weight_decays)} weight decays")
    return [float(c) for c in weight_decays]


def adam_each(update, ps, gs, ms, vs, t, lr, beta1, beta2, eps, weight_decays=None):
    """A set's ``adam_update_many`` as its ``update`` called on each parameter: the bits of
    one call each (a CPU set's; the cupy set's is one launch for all)."""
    check_many("adam_update_many", ps, gs, ms, vs)
    check_step(t)
    for p, g, m, v, c in zip(ps, gs, ms, vs, decays_of(ps, weight_decays)):
        update(p, g, m, v, t, lr, beta1, beta2, eps, c)
