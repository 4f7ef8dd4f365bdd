"""The L-BFGS two-loop recursion (Numba), float64 on the host (see kernels.ref.lbfgs).

Each dot product keeps eight partial sums (element i in sum i % 8) added in a fixed order
at the end: eight times fewer dependent adds than one running sum, and the same bits
whatever vector width the compiler picks (it may not reorder the adds of one sum)."""
import numpy as np
from numba import njit

from ..ref.lbfgs import check_two_loop

__all__ = ["two_loop", "dot", "step_to", "keep_pair"]


@njit(cache=True, nogil=True)
def _dot(a, b):
    n = a.size
    full = n - n % 8
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = 0.0
    for i in range(0, full, 8):
        s0 += a[i] * b[i]
        s1 += a[i + 1] * b[i + 1]
        s2 += a[i + 2] * b[i + 2]
        s3 += a[i + 3] * b[i + 3]
        s4 += a[i + 4] * b[i + 4]
        s5 += a[i + 5] * b[i + 5]
        s6 += a[i + 6] * b[i + 6]
        s7 += a[i + 7] * b[i + 7]
    total = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))
    for i in range(full, n):
        total += a[i] * b[i]
    return total


@njit(cache=True, nogil=True)
def _two_loop(S, Y, rho, count, g, d):
    m, n = S.shape
    k = min(count, m)
    alpha = np.empty(k)
    for i in range(n):
        d[i] = -g[i]
    for j in range(k):
        r = (count - 1 - j) % m
        a = rho[r] * _dot(S[r], d)
        alpha[j] = a
        for i in range(n):
            d[i] -= a * Y[r, i]
    if k:
        r = (count - 1) % m
        gamma = _dot(S[r], Y[r]) / _dot(Y[r], Y[r])
        for i in range(n):
            d[i] *= gamma
    for j in range(k - 1, -1, -1):
        r = (count - 1 - j) % m
        c = alpha[j] - rho[r] * _dot(Y[r], d)
        for i in range(n):
            d[i] += c * S[r, i]


def two_loop(S, Y, rho, count, g, d):
    """See :func:`kernels.ref.lbfgs.two_loop`."""
    check_two_loop(S, Y, rho, count, g, d)
    _two_loop(S, Y, rho, int(count), g, d)


dot = _dot  # the line search's products, with the same partial sums


@njit(cache=True, nogil=True)
def step_to(x, t, d, out):
    """out = x + t d (t d rounded first, as NumPy's x + t * d: the point the step reaches
    is the point that was evaluated)."""
    for i in range(x.size):
        out[i] = x[i] + t * d[i]


@njit(cache=True, nogil=True)
def keep_pair(x, t, d, g, g_new, S, Y, rho, pairs):
    """The step: x += s, g = g_new, and the pair s = t d, y = g_new - g kept in row
    ``pairs`` % m of S and Y with rho = 1 / (s·y) where s·y > 1e-10 (a pair with less
    would break H's positive definiteness: dropped). Returns the pairs kept so far."""
    n = x.size
    s, y = np.empty(n), np.empty(n)
    for i in range(n):
        s[i] = t * d[i]
        y[i] = g_new[i] - g[i]
    s_y = _dot(s, y)
    keep = s_y > 1e-10
    r = pairs % S.shape[0]
    for i in range(n):
        if keep:
            S[r, i] = s[i]
            Y[r, i] = y[i]
        x[i] += s[i]
        g[i] = g_new[i]
    if keep:
        rho[r] = 1.0 / s_y
        return pairs + 1
    return pairs
