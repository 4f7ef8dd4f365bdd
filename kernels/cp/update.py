"""Parameter updates in place (CuPy): one element-wise kernel per step and parameter, or
one for all the parameters (``adam_update_many``)."""
import cupy as cp
import numpy as np

from ..ref.update import check_many, check_step, check_update
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


def adam_update(p, g, m, v, t, lr, beta1=0.9, beta2=0.999, eps=1e-8):
    """One Adam step with bias correction at step t = 1, 2, ..., in place. Returns None.
    The kernel of :func:`adam_update_many` (so that both give the same bits)."""
    adam_update_many([p], [g], [m], [v], t, lr, beta1, beta2, eps)


# Adam over every parameter at once: thread i finds its parameter k in the running ends of
# the sizes, then its element j there (a model has a few dozen parameters at most). 1 - beta
# comes from the host in double: 1 - (float)0.999 is off by 1e-5 relative.
_ADAM_MANY_SOURCE = r"""
template <typename T>
__global__ void adam_many(const unsigned long long* arrays, const long long* ends, const long long total,
                          const T lr, const T beta1, const T c1, const T beta2, const T c2, const T eps,
                          const T bc1, const T bc2) {
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
        p[j] -= lr * (mj / bc1) / (sqrt(vj / bc2) + eps);
    }
}
"""
_ADAM_MANY = cp.RawModule(code=_ADAM_MANY_SOURCE, options=("-std=c++14",),
                          name_expressions=[f"adam_many<{t}>" for t in C_TYPE.values()])
_tables = {}  # (the arrays' addresses and sizes) -> (their table on the device, its ends, total)


def adam_update_many(ps, gs, ms, vs, t, lr, beta1=0.9, beta2=0.999, eps=1e-8):
    """:func:`adam_update` on each parameter's (p, g, m, v) of the four lists, in place, in
    one launch per dtype (a table of the arrays' addresses, made once per set of arrays)."""
    check_many("adam_update_many", ps, gs, ms, vs)
    check_step(t)
    quads = [(p, cp.ascontiguousarray(g, dtype=p.dtype), m, v) for p, g, m, v in zip(ps, gs, ms, vs) if p.size]
    if any(not a.flags.c_contiguous for q in quads for a in (q[0], q[2], q[3])):
        # updated in contiguous copies, then written back: one arithmetic for every layout
        copies = [(cp.ascontiguousarray(p), g, cp.ascontiguousarray(m), cp.ascontiguousarray(v)) for p, g, m, v in quads]
        adam_update_many(*map(list, zip(*copies)), t, lr, beta1, beta2, eps)
        for q, c in zip(quads, copies):
            for a, b in zip((q[0], q[2], q[3]), (c[0], c[2], c[3])):
                if a is not b:
                    a[...] = b
        return
    for dt in {q[0].dtype for q in quads}:
        if dt not in C_TYPE:
            raise ValueError(f"adam_update_many: float32 or float64 parameters, not {dt}")
        _adam_launch([q for q in quads if q[0].dtype == dt], dt, t, lr, beta1, beta2, eps)


def _adam_launch(quads, dt, t, lr, beta1, beta2, eps):
    key = tuple(a.data.ptr for q in quads for a in q) + tuple(q[0].size for q in quads)
    if key not in _tables:
        if len(_tables) > 64:  # models come and go: keep the tables few
            _tables.clear()
        ends = np.cumsum([q[0].size for q in quads], dtype=np.int64)
        _tables[key] = (cp.asarray(np.array(key[:4 * len(quads)], dtype=np.uint64)), cp.asarray(ends), int(ends[-1]))
    table, ends, total = _tables[key]
    # bias corrections in double on the host, then cast once
    bc1 = 1.0 - float(beta1) ** int(t)
    bc2 = 1.0 - float(beta2) ** int(t)
    d = dt.type
    fn = _ADAM_MANY.get_function(f"adam_many<{C_TYPE[dt]}>")
    fn((max(1, min((total + 255) // 256, 4096)),), (256,),
       (table, ends, np.int64(total), d(lr), d(beta1), d(1.0 - float(beta1)), d(beta2), d(1.0 - float(beta2)),
        d(eps), d(bc1), d(bc2)))
