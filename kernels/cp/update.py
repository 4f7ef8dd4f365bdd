"""Parameter updates in place (CuPy): one element-wise kernel per step and parameter, or
one for all the parameters (``adam_update_many``)."""
import cupy as cp
import numpy as np

from ..ref.update import check_many, check_step, check_update, decays_of
from .c_types import C_TYPE

__all__ = ["sgd_momentum_update", "adam_update", "adam_update_many"]

# p and v are outputs that are also read: updated where they lie
_sgd = cp.ElementwiseKernel(
    "T g, T lr, T momentum, T decay", "T p, T v",
    "v = momentum * v - lr * (g + decay * p); p += v;", "aepar_sgd_momentum")


def sgd_momentum_update(p, g, v, lr, momentum, weight_decay=0.0):
    """v = momentum * v - lr * (g + weight_decay * p); p += v, in place. Returns None."""
    check_update("sgd_momentum_update", p, g, v)
    t = p.dtype.type
    _sgd(g.astype(p.dtype, copy=False), t(lr), t(momentum), t(weight_decay), p, v)


def adam_update(p, g, m, v, t, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0):
    """One Adam step with bias correction at step t = 1, 2, ..., in place, with decoupled
    ``weight_decay`` (AdamW: p shrinks by 1 - lr * weight_decay). Returns None. The kernel
    of :func:`adam_update_many` (so that both give the same bits)."""
    adam_update_many([p], [g], [m], [v], t, lr, beta1, beta2, eps, [weight_decay])


# Adam over every parameter at once: thread i finds its parameter k in the running ends of
# the sizes, then its element j there (a model has a few dozen parameters at most). 1 - beta
# comes from the host in double: 1 - (float)0.999 is off by 1e-5 relative. keeps[k] is
# parameter k's 1 - lr * weight decay (1 leaves the bits of no decay: one rounding either way).
_ADAM_MANY_SOURCE = r"""
template <typename T>
__global__ void adam_many(const unsigned long long* arrays, const long long* ends, const T* keeps,
                          const long long total, const T lr, const T beta1, const T c1, const T beta2,
                          const T c2, const T eps, const T bc1, const T bc2) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        int k = 0;
        while (ends[k] <= i) ++k;
        const long long j = i - (k > 0 ? ends[k - 1] : 0);
        T* p = reinterpret_cast<T*>(arrays[4 * k]);
        const T* g = reinterpret_cast<const T*>(arrays[4 * k + 1]);
        T* m = reinterpret_cast<T*>(arrays[4 * k + 2]);
        T* v = reinterpret_cast<T*>(arrays[4 * k + 3]);
        const T gj = g[j];
        const T mj = beta1 * m[j] + c1 * gj;
        const T vj = beta2 * v[j] + c2 * gj * gj;
        m[j] = mj;
        v[j] = vj;
        p[j] = keeps[k] * p[j] - lr * (mj / bc1) / (sqrt(vj / bc2) + eps);
    }
}
"""
_ADAM_MANY = cp.RawModule(code=_ADAM_MANY_SOURCE, options=("-std=c++14",),
                          name_expressions=[f"adam_many<{t}>" for t in C_TYPE.values()])
_tables = {}  # (the arrays' addresses, sizes and keeps) -> (their table on the device, its ends, keeps, total)


def adam_update_many(ps, gs, ms, vs, t, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decays=None):
    """:func:`adam_update` on each parameter's (p, g, m, v) of the four lists, in place, in
    one launch per dtype (a table of the arrays' addresses, made once per set of arrays and
    rate); ``weight_decays``: each parameter's ``weight_decay`` (default none)."""
    check_many("adam_update_many", ps, gs, ms, vs)
    check_step(t)
    decays = decays_of(ps, weight_decays)
    quads = [(p, cp.ascontiguousarray(g, dtype=p.dtype), m, v) for p, g, m, v in zip(ps, gs, ms, vs) if p.size]
    decays = [c for p, c in zip(ps, decays) if p.size]
    if any(not a.flags.c_contiguous for q in quads for a in (q[0], q[2], q[3])):
        # updated in contiguous copies, then written back: one arithmetic for every layout
        copies = [(cp.ascontiguousarray(p), g, cp.ascontiguousarray(m), cp.ascontiguousarray(v)) for p, g, m, v in quads]
        adam_update_many(*map(list, zip(*copies)), t, lr, beta1, beta2, eps, decays)
        for q, c in zip(quads, copies):
            for a, b in zip((q[0], q[2], q[3]), (c[0], c[2], c[3])):
                if a is not b:
                    a[...] = b
        return
    for dt in {q[0].dtype for q in quads}:
        if dt not in C_TYPE:
            raise ValueError(f"adam_update_many: float32 or float64 parameters, not {dt}")
        same = [i for i, q in enumerate(quads) if q[0].dtype == dt]
        _adam_launch([quads[i] for i in same], [decays[i] for i in same], dt, t, lr, beta1, beta2, eps)


def _adam_launch(quads, decays, dt, t, lr, beta1, beta2, eps):
    keeps = tuple(1.0 - lr * c for c in decays)  # a rate's keeps stay for its epoch: cached with the table
    key = (dt.str,) + tuple(a.data.ptr for q in quads for a in q) + tuple(q[0].size for q in quads) + keeps
    if key not in _tables:
        if len(_tables) > 64:  # models and rates come and go: keep the tables few
            _tables.clear()
        ends = np.cumsum([q[0].size for q in quads], dtype=np.int64)
        _tables[key] = (cp.asarray(np.array(key[1:1 + 4 * len(quads)], dtype=np.uint64)), cp.asarray(ends),
                        cp.asarray(np.array(keeps, dtype=dt)), int(ends[-1]))
    table, ends, keep, total = _tables[key]
    # bias corrections in double on the host, then cast once
    bc1 = 1.0 - float(beta1) ** int(t)
    bc2 = 1.0 - float(beta2) ** int(t)
    d = dt.type
    fn = _ADAM_MANY.get_function(f"adam_many<{C_TYPE[dt]}>")
    fn((max(1, min((total + 255) // 256, 4096)),), (256,),
       (table, ends, keep, np.int64(total), d(lr), d(beta1), d(1.0 - float(beta1)), d(beta2), d(1.0 - float(beta2)),
        d(eps), d(bc1), d(bc2)))
