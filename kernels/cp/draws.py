"""NumPy's PCG64 float32 uniforms made on the GPU (see :mod:`kernels.ref.draws` for the math).

Drawing on the host and copying the draws over was most of a GPU CD-1 step at large
batches, and a visible part at batch 100. Here each generator's state goes to the
device (the first one's in the launch's parameters), thread t of a stream jumps to
output t and then strides by the grid's thread count T (s_{k+T} = A_T s_k + C_T), so
neighbouring threads write neighbouring pairs; the host then moves each generator on by
the same count. Same bits as the host draws.
"""
import cupy as cp
import numpy as np

from ..ref.draws import MULT, check_uniform_rows, pcg64_skip, pcg64_state, uniform_rows as _host_rows

__all__ = ["uniform_rows"]

_SOURCE = r"""
typedef unsigned long long u64;
struct u128 { u64 hi, lo; };
__device__ __forceinline__ u128 mul(u128 a, u128 b) {
    u128 r; r.lo = a.lo * b.lo; r.hi = __umul64hi(a.lo, b.lo) + a.lo * b.hi + a.hi * b.lo; return r;
}
__device__ __forceinline__ u128 add(u128 a, u128 b) {
    u128 r; r.lo = a.lo + b.lo; r.hi = a.hi + b.hi + (r.lo < a.lo ? 1ull : 0ull); return r;
}
// s_{k+n} = am * s_k + ap for the LCG s' = mult * s + plus
__device__ void jump(u64 n, u128 mult, u128 plus, u128 *am, u128 *ap) {
    u128 m = {0ull, 1ull}, p = {0ull, 0ull}, one = {0ull, 1ull};
    while (n) {
        if (n & 1ull) { m = mul(m, mult); p = add(mul(p, mult), plus); }
        plus = mul(add(mult, one), plus);
        mult = mul(mult, mult);
        n >>= 1;
    }
    *am = m; *ap = p;
}
// per stream: state hi, lo, inc hi, lo, first element, count, buffered (0/1), the
// buffered 32 bits. Stream 0's come as the launch's parameters (one stream, the usual
// case, needs no copy to the device: a copy from pageable memory is slow for its size);
// stream i > 0's are more[8(i-1)..8(i-1)+7].
extern "C" __global__ void pcg64_uniform_f32(u64 s0, u64 s1, u64 s2, u64 s3, u64 s4, u64 s5, u64 s6, u64 s7,
                                             const u64 *more, float *out, u64 mult_hi, u64 mult_lo) {
    const int i = blockIdx.y;
    const u64 stream0[8] = {s0, s1, s2, s3, s4, s5, s6, s7};
    const u64 *st = i == 0 ? stream0 : more + 8 * (i - 1);
    const long long first = (long long)st[4], count = (long long)st[5];
    const int buffered = (int)st[6];
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long T = (long long)gridDim.x * blockDim.x;
    const float scale = 1.0f / 16777216.0f;
    if (count <= 0) return;
    if (t == 0 && buffered) out[first] = (float)((unsigned)st[7] >> 8) * scale;
    const long long fresh = count - buffered, steps = (fresh + 1) / 2;
    if (t >= steps) return;
    const u128 mult = {mult_hi, mult_lo}, inc = {st[2], st[3]};
    u128 s = {st[0], st[1]}, a, c, aT, cT;
    jump((u64)(t + 1), mult, inc, &a, &c);
    s = add(mul(a, s), c);
    jump((u64)T, mult, inc, &aT, &cT);
    float *o = out + first + buffered;
    for (long long k = t; k < steps; k += T) {
        const u64 x = s.hi ^ s.lo;
        const unsigned r = (unsigned)(s.hi >> 58);
        const u64 v = (x >> r) | (x << ((64u - r) & 63u));
        o[2 * k] = (float)((unsigned)v >> 8) * scale;
        if (2 * k + 1 < fresh) o[2 * k + 1] = (float)(unsigned)(v >> 40) * scale;
        s = add(mul(aT, s), cT);
    }
}
"""
_KERNEL = cp.RawKernel(_SOURCE, "pcg64_uniform_f32")
# 64 outputs a thread: each thread first jumps to its place (about 40 128-bit products),
# a cost that fewer outputs a thread would pay more often (8 a thread was far slower)
_THREADS, _PER_THREAD = 256, 64
_M64 = (1 << 64) - 1


def uniform_rows(rngs, starts, out):
    """Rows ``starts[i]:starts[i+1]`` of ``out`` (a C-contiguous float32 CuPy matrix) with
    the uniforms ``rngs[i].random(dtype=np.float32)`` would give, each generator moved on
    as that call would; see :func:`kernels.ref.draws.uniform_rows`."""
    check_uniform_rows(rngs, starts, out)
    states = [pcg64_state(rng) for rng in rngs]
    if any(s is None for s in states):  # another bit generator: draw on the host
        host = _host_rows(rngs, starts, np.empty(out.shape, np.float32))
        out[...] = cp.asarray(host)
        return out
    width = out.shape[1]
    ends = [int(s) * width for s in starts]  # each stream's first element, and the end
    job = np.array([(state >> 64, state & _M64, inc >> 64, inc & _M64, lo, hi - lo, buffered if hi > lo else 0,
                     uinteger) for (state, inc, buffered, uinteger), lo, hi in zip(states, ends[:-1], ends[1:])],
                   dtype=np.uint64)
    most = max(((hi - lo + 1) // 2 for lo, hi in zip(ends[:-1], ends[1:])), default=0)
    if most:
        grid = (max(1, -(-most // (_THREADS * _PER_THREAD))), len(rngs))
        more = cp.asarray(job[1:]) if len(rngs) > 1 else out  # (one stream: not read)
        _KERNEL(grid, (_THREADS,), (*job[0], more, out, np.uint64(MULT >> 64), np.uint64(MULT & _M64)))
    for rng, state, lo, hi in zip(rngs, states, ends[:-1], ends[1:]):
        pcg64_skip(rng, hi - lo, state)  # each generator moved on as drawing its rows would
    return out
