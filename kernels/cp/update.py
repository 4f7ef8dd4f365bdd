"""Parameter updates in place (CuPy): one launch for several parameters (SGD: up to
:data:`SGD_SLOTS` a launch; Adam: all of them), which the single-parameter updates use too."""
import cupy as cp
import numpy as np

from ..ref.update import check_many, check_sgd_many, check_step, check_update, decays_of
from .c_types import C_TYPE

__all__ = ["sgd_momentum_update", "sgd_momentum_update_many", "adam_update", "adam_update_many"]

# SGD with momentum on up to SGD_SLOTS parameters a launch, each given by value (addresses,
# sizes, rate, decay: no table to copy to the device). Thread i finds its parameter k in the
# running ends of the sizes, then its element j there. Compiled with --fmad=false: each
# operation rounded on its own, as NumPy's (so one parameter or several, any launch, the
# same bits).
SGD_SLOTS = 4
_SGD_MANY_SOURCE = r"""
template <typename T>
__global__ void sgd_many(const unsigned long long p0, const unsigned long long g0, const unsigned long long v0,
                         const long long e0, const T lr0, const T c0,
                         const unsigned long long p1, const unsigned long long g1, const unsigned long long v1,
                         const long long e1, const T lr1, const T c1,
                         const unsigned long long p2, const unsigned long long g2, const unsigned long long v2,
                         const long long e2, const T lr2, const T c2,
                         const unsigned long long p3, const unsigned long long g3, const unsigned long long v3,
                         const long long e3, const T lr3, const T c3, const T momentum) {
    const unsigned long long ps[4] = {p0, p1, p2, p3}, gs[4] = {g0, g1, g2, g3}, vs[4] = {v0, v1, v2, v3};
    const long long ends[4] = {e0, e1, e2, e3};
    const T lrs[4] = {lr0, lr1, lr2, lr3}, cs[4] = {c0, c1, c2, c3};
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < e3;
         i += (long long)gridDim.x * blockDim.x) {
        int k = 0;
        while (ends[k] <= i) ++k;
        const long long j = i - (k > 0 ? ends[k - 1] : 0);
        T* p = reinterpret_cast<T*>(ps[k]);
        const T* g = reinterpret_cast<const T*>(gs[k]);
        T* v = reinterpret_cast<T*>(vs[k]);
        const T vj = momentum * v[j] - lrs[k] * (g[j] + cs[k] * p[j]);
        v[j] = vj;
        p[j] += vj;
    }
}
"""
_SGD_MANY = cp.RawModule(code=_SGD_MANY_SOURCE, options=("-std=c++14", "--fmad=false"),
                         name_expressions=[f"sgd_many<{t}>" for t in C_TYPE.values()])


def sgd_momentum_update(p, g, v, lr, momentum, weight_decay=0.0):
    """v = momentum * v - lr * (g + weight_decay * p); p += v, in place. Returns None. The
    kernel of :func:`sgd_momentum_update_many` (so that both give the same bits)."""
    check_update("sgd_momentum_update", p, g, v)
    sgd_momentum_update_many([p], [g], [v], [lr], momentum, [weight_decay])


def sgd_momentum_update_many(ps, gs, vs, lrs, momentum, weight_decays=None):
    """:func:`sgd_momentum_update` on each parameter's (p, g, v) of the three lists, at its
    own rate of ``lrs``, in place: one launch for every :data:`SGD_SLOTS` parameters of a
    dtype; ``weight_decays``: each parameter's (default none)."""
    decays = check_sgd_many(ps, gs, vs, lrs, weight_decays)
    items = [(p, cp.ascontiguousarray(g, dtype=p.dtype), v, float(lr), c)
             for p, g, v, lr, c in zip(ps, gs, vs, lrs, decays) if p.size]
    if any(not a.flags.c_contiguous for q in items for a in (q[0], q[2])):
        # stepped in contiguous copies, then written back: one arithmetic for every layout
        copies = [(cp.ascontiguousarray(p), g, cp.ascontiguousarray(v), lr, c) for p, g, v, lr, c in items]
        cps, cgs, cvs, clrs, cdecays = map(list, zip(*copies))
        sgd_momentum_update_many(cps, cgs, cvs, clrs, momentum, cdecays)
        for q, c in zip(items, copies):
            for a, b in ((q[0], c[0]), (q[2], c[2])):
                if a is not b:
                    a[...] = b
        return
    for dt in dict.fromkeys(q[0].dtype for q in items):
        if dt not in C_TYPE:
            raise ValueError(f"sgd_momentum_update_many: float32 or float64 parameters, not {dt}")
        same = [q for q in items if q[0].dtype == dt]
        for first in range(0, len(same), SGD_SLOTS):
            _sgd_launch(same[first:first + SGD_SLOTS], dt, momentum)


def _sgd_launch(items, dt, momentum):
    d = dt.type
    args, end = [], 0
    for p, g, v, lr, c in items:
        end += p.size
        args += [np.uint64(p.data.ptr), np.uint64(g.data.ptr), np.uint64(v.data.ptr), np.int64(end), d(lr), d(c)]
    args += [np.uint64(0), np.uint64(0), np.uint64(0), np.int64(end), d(0), d(0)] * (SGD_SLOTS - len(items))
    fn = _SGD_MANY.get_function(f"sgd_many<{C_TYPE[dt]}>")
    fn((max(1, min((end + 255) // 256, 4096)),), (256,), (*args, d(momentum)))


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
        copies = [(cp.ascontiguousarray(p), g, cp.ascontiguousarray(m), cp.ascontiguousarray(v))
                  for p, g, m, v in quads]
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
