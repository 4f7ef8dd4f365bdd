"""Parameter updates in place (Numba): one fused pass over each parameter (parallel over a large one)."""
import math

import numpy as np
from numba import njit, prange

from ..ref import update as _ref
from .codegen import compiled_as

__all__ = ["sgd_momentum_update", "sgd_momentum_update_many", "adam_update", "adam_update_many"]


# arrays of fewer elements than this take the loops compiled without ``parallel``: a
# parallel region's start (about 2 µs) is more than a layer's biases take, and aepar runs
# Numba on one thread inside its own threads unless the user sets NUMBA_NUM_THREADS
PARALLEL_ELEMENTS = 1 << 16


def _sgd_loop(p, g, v, lr, momentum):
    """lr and momentum in the arrays' dtype: float32 arithmetic for float32 parameters, the
    same roundings as NumPy's, and faster than with float64 scalars."""
    for i in prange(p.size):
        vi = momentum * v[i] - lr * g[i]
        v[i] = vi
        p[i] += vi


@njit(cache=True, nogil=True)
def _sgd_decay(p, g, v, lr, momentum, decay):
    """:func:`_sgd_loop` of g + decay * p: the roundings of weight_decay_backward (float32 dW +=
    decay * W, no contraction) then the step, in one pass over W instead of two."""
    for i in range(p.size):
        gi = g[i] + decay * p[i]
        vi = momentum * v[i] - lr * gi
        v[i] = vi
        p[i] += vi


def _adam_loop(p, g, m, v, beta1, rest1, beta2, rest2, step, root_bc2, eps, keep):
    """The scalars come in the arrays' dtype, so float32 parameters are updated in float32
    arithmetic: with float64 scalars the division and square root ran in float64 and made
    this pass compute-bound, several times slower. ``keep`` = 1 - lr * weight decay shrinks
    p in the same pass (1 leaves the bits of no decay: 1 * p is p).

    Compiled without contraction: every operation rounds on its own, as NumPy's. Which
    products a compiler fuses into FMAs depends on the target and on the loop's form (on
    AArch64 the vector loop left keep * p - s unfused, which NEON has no one instruction
    for, where the scalar loop and x86 fused it), so the bits had depended on the CPU and
    on whether the parameter was large enough for the parallel loop."""
    for i in prange(p.size):
        gi = g[i]
        mi = beta1 * m[i] + rest1 * gi
        vi = beta2 * v[i] + rest2 * gi * gi
        m[i] = mi
        v[i] = vi
        p[i] = keep * p[i] - step * mi / (np.sqrt(vi) * root_bc2 + eps)


# each loop with prange over a large array, and as a plain loop (prange runs as range)
# over a small one: the same arithmetic element by element, so the same bits
_sgd, _sgd_serial = compiled_as(_sgd_loop, "_par", parallel=True), compiled_as(_sgd_loop, "_serial")
_adam = compiled_as(_adam_loop, "_par", parallel=True)
_adam_serial = compiled_as(_adam_loop, "_serial")


def _flat_views(*arrays):
    """1-D views of C-contiguous writable arrays of one dtype, else None."""
    dtype = arrays[0].dtype
    if all(a.flags.c_contiguous and a.dtype == dtype for a in arrays):
        return [a.reshape(-1) for a in arrays]
    return None


def sgd_momentum_update(p, g, v, lr, momentum, weight_decay=0.0):
    """v = momentum * v - lr * (g + weight_decay * p); p += v, in place. Returns None."""
    _ref.check_update("sgd_momentum_update", p, g, v)
    flat = _flat_views(p, g, v)
    if flat is None or not (p.flags.writeable and v.flags.writeable):
        return _ref.sgd_momentum_update(p, g, v, lr, momentum, weight_decay)  # odd layouts: same math
    dt = p.dtype.type
    if weight_decay:
        _sgd_decay(flat[0], flat[1], flat[2], dt(lr), dt(momentum), dt(weight_decay))
    else:
        (_sgd if p.size >= PARALLEL_ELEMENTS else _sgd_serial)(flat[0], flat[1], flat[2], dt(lr), dt(momentum))


def sgd_momentum_update_many(ps, gs, vs, lrs, momentum, weight_decays=None):
    """:func:`sgd_momentum_update` on each parameter's (p, g, v) of the three lists, at its
    own rate of ``lrs``, in place; ``weight_decays``: each parameter's (default none)."""
    _ref.sgd_each(sgd_momentum_update, ps, gs, vs, lrs, momentum, weight_decays)


def adam_update(p, g, m, v, t, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0):
    """One Adam step with bias correction at step t = 1, 2, ..., in place, with decoupled
    ``weight_decay`` (AdamW: p shrinks by 1 - lr * weight_decay). Returns None."""
    _ref.check_update("adam_update", p, g, m, v)
    _ref.check_step(t)
    flat = _flat_views(p, g, m, v)
    if flat is None or not (p.flags.writeable and m.flags.writeable and v.flags.writeable):
        return _ref.adam_update(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay)
    bc1 = 1.0 - float(beta1) ** int(t)
    bc2 = 1.0 - float(beta2) ** int(t)
    # lr m / bc1 / (sqrt(v / bc2) + eps), the bias corrections folded into two scalars
    dt = p.dtype.type
    adam = _adam if p.size >= PARALLEL_ELEMENTS else _adam_serial
    adam(*flat, dt(beta1), dt(1.0 - beta1), dt(beta2), dt(1.0 - beta2), dt(lr / bc1), dt(1.0 / math.sqrt(bc2)),
         dt(eps), dt(1.0 - lr * weight_decay))


def adam_update_many(ps, gs, ms, vs, t, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decays=None):
    """:func:`adam_update` on each parameter's (p, g, m, v) of the four lists, in place;
    ``weight_decays``: each parameter's ``weight_decay`` (default none)."""
    _ref.adam_each(adam_update, ps, gs, ms, vs, t, lr, beta1, beta2, eps, weight_decays)
