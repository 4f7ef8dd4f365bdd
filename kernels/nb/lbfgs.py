"""The L-BFGS two-loop recursion (Numba), float64 on the host (see kernels.ref.lbfgs).

Each dot product keeps eight partial sums (element i in sum i % 8, one 8-lane vector)
added in a fixed tree at the end (:func:`.simd.vtreesum`), then the last n % 8 products
one by one: the same bits on AVX-512 and AVX2, where one running sum would be a chain
of n dependent adds. Products and sums are rounded one by one (no FMA), as NumPy's
``d - a * y`` is. The two loops go over the pairs with each update of d and the next
pair's product with d in one pass, so d streams once per pair, not twice."""
import numpy as np
from numba import njit

from ..ref.lbfgs import check_two_loop
from .simd import LANES, vadd, vload, vmul, vsplat, vstore, vsub, vtreesum

__all__ = ["two_loop", "direction", "dot", "step_to", "keep_pair", "max_abs"]

# no fastmath "contract": a * y + d must round the product first, as the reference does
_JIT = dict(cache=True, nogil=True, error_model="numpy")


@njit(**_JIT)
def _dot(a, b):
    n = a.size
    full = n - n % LANES
    acc = vsplat(0.0)
    for i in range(0, full, LANES):
        acc = vadd(acc, vmul(vload(a, i), vload(b, i)))
    total = vtreesum(acc)
    for i in range(full, n):
        total += a[i] * b[i]
    return total


@njit(**_JIT)
def _update_dot(d, c, u, scale, w):
    """d = (d + c u) * scale, then w·d (the new d), in one pass. d - a y is d + (-a) y and
    x * 1.0 is x, bit for bit, so both loops' updates and the scaling by the initial H
    are this one pass."""
    n = d.size
    full = n - n % LANES
    vc, vs, acc = vsplat(c), vsplat(scale), vsplat(0.0)
    for i in range(0, full, LANES):
        v = vmul(vadd(vload(d, i), vmul(vc, vload(u, i))), vs)
        vstore(d, i, v)
        acc = vadd(acc, vmul(vload(w, i), v))
    total = vtreesum(acc)
    for i in range(full, n):
        d[i] = (d[i] + c * u[i]) * scale
    for i in range(full, n):
        total += w[i] * d[i]
    return total


@njit(**_JIT)
def _two_loop(S, Y, rho, count, g, d):
    m, n = S.shape
    k = min(count, m)
    for i in range(n):
        d[i] = -g[i]
    if k == 0:
        return
    alpha = np.empty(k)
    newest, oldest = (count - 1) % m, (count - k) % m
    gamma = _dot(S[newest], Y[newest]) / _dot(Y[newest], Y[newest])  # the initial H, (s·y)/(y·y)
    # newest pair first: alpha_j = rho S_j·d, d -= alpha_j Y_j, each pass taking the next
    # older S·d; the last one scales d by the initial H and takes the oldest Y·d
    product = _dot(S[newest], d)
    for j in range(k):
        r = (count - 1 - j) % m
        alpha[j] = rho[r] * product
        if j + 1 < k:
            product = _update_dot(d, -alpha[j], Y[r], 1.0, S[(count - 2 - j) % m])
        else:
            product = _update_dot(d, -alpha[j], Y[r], gamma, Y[oldest])
    # oldest pair first: d += (alpha_j - rho Y_j·d) S_j, each pass taking the next newer Y·d
    # (after the newest pair the product is not needed, but the pass is)
    for j in range(k - 1, -1, -1):
        r = (count - 1 - j) % m
        product = _update_dot(d, alpha[j] - rho[r] * product, S[r], 1.0, Y[(count - j) % m])


def two_loop(S, Y, rho, count, g, d):
    """See :func:`kernels.ref.lbfgs.two_loop` (float64, C-contiguous arrays)."""
    check_two_loop(S, Y, rho, count, g, d)
    for name, a in (("S", S), ("Y", Y), ("g", g), ("d", d)):
        if a.dtype != np.float64 or not a.flags.c_contiguous:
            raise ValueError(f"two_loop: {name} must be a C-contiguous float64 array, got {a.dtype}")
    _two_loop(S, Y, rho, int(count), g, d)


dot = _dot  # the line search's products, with the same partial sums


@njit(**_JIT)
def step_to(x, t, d, out):
    """out = x + t d (t d rounded first, as NumPy's x + t * d: the point the step reaches
    is the point that was evaluated)."""
    for i in range(x.size):
        out[i] = x[i] + t * d[i]


@njit(**_JIT)
def keep_pair(x, t, d, g, g_new, S, Y, rho, pairs):
    """The step: x += s, g = g_new, and the pair s = t d, y = g_new - g kept in row
    ``pairs`` % m of S and Y with rho = 1 / (s·y) where s·y > 1e-10 (a pair with less
    would break H's positive definiteness: dropped). Returns the pairs kept so far.
    s·y is summed first, without storing s and y, so a dropped pair leaves its row alone."""
    n = x.size
    full = n - n % LANES
    vt, acc = vsplat(t), vsplat(0.0)
    for i in range(0, full, LANES):
        acc = vadd(acc, vmul(vmul(vt, vload(d, i)), vsub(vload(g_new, i), vload(g, i))))
    s_y = vtreesum(acc)
    for i in range(full, n):
        s_y += (t * d[i]) * (g_new[i] - g[i])
    keep = s_y > 1e-10
    r = pairs % S.shape[0]
    for i in range(n):
        s = t * d[i]
        if keep:
            S[r, i] = s
            Y[r, i] = g_new[i] - g[i]
        x[i] += s
        g[i] = g_new[i]
    if keep:
        rho[r] = 1.0 / s_y
        return pairs + 1
    return pairs


@njit(**_JIT)
def max_abs(a):
    """The largest |a_i| (NaN if any a_i is NaN), for the gradient's stopping test."""
    top = 0.0
    for i in range(a.size):
        v = abs(a[i])
        if not v <= top:  # NaN wins, as in NumPy's max
            top = v
            if v != v:
                return v
    return top


@njit(**_JIT)
def direction(S, Y, rho, count, g, d, gtol):
    """An iteration's start in one call (the root's serial step, which every other rank
    waits for): the largest |g_i| and, unless that is at most ``gtol`` (converged), the
    direction d = -H g of :func:`two_loop` and its slope g·d. A d that is no descent
    direction (rounding) becomes -g, the pairs forgotten. Returns (largest |g_i|, g·d
    (0 where converged), the pairs kept)."""
    top = max_abs(g)
    if top <= gtol:
        return top, 0.0, count
    _two_loop(S, Y, rho, count, g, d)
    slope = _dot(g, d)
    if not slope < 0:
        count = 0
        for i in range(g.size):
            d[i] = -g[i]
        slope = -_dot(g, g)
    return top, slope, count
