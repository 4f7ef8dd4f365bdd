"""Scalar math the Numba kernels share: sigmoids that vectorise, and bit casts.

libm's exp is scalar (a call per element: much slower than these in the RBM passes, and
in the sparse autoencoder as costly as its matrix products), so exp is built here from
a polynomial and 2^n written into the exponent bits. Loops over these functions
vectorise when compiled with ``error_model="numpy"`` (Python's error model tests each
division for zero, a branch that kept LLVM's loops scalar) and ``fastmath={"contract"}``
(FMAs, no reassociation, so the rounding trick below survives).

Kernels in other files inline these: the package keys Numba's cache on a hash of every
file here (kernels/nb/__init__.py), so a change in this file recompiles them.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

__all__ = ["sigmoid64", "sigmoid32", "sigmoid32_capped", "sig", "exp_parts", "log1p_unit", "bits_as_f64",
           "bits_as_f32", "f64_bits"]


@intrinsic
def bits_as_f64(typingctx, bits):
    """Reinterpret an int64 as the float64 with the same bits (builds 2^n without libm);
    other integers are converted to int64 first."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(types.int64), codegen


@intrinsic
def f64_bits(typingctx, x):
    """The bits of a float64 as an int64 (the integer a shifter left in the low bits)."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return types.int64(types.float64), codegen


@intrinsic
def bits_as_f32(typingctx, bits):
    """Reinterpret an int32 as the float32 with the same bits (Numba's integer arithmetic
    gives int64: converted to int32 first)."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.int32), codegen


LOG2E = 1.4426950408889634
SHIFTER = 6755399441055744.0  # 1.5 * 2**52: adding it rounds to an integer in the low bits
LN2_HI = 6.93147180369123816490e-01  # fdlibm's split of ln 2: n * LN2_HI is exact
LN2_LO = 1.90821492927058770002e-10
# Padé [6/6] of exp: exp(r) ~ P(r)/P(-r), P(r) = E(r²) + r O(r²); relative error < 1e-18
# for |r| <= ln2/2
C1, C2, C3, C4, C5, C6 = 1 / 2, 5 / 44, 1 / 66, 1 / 792, 1 / 15840, 1 / 665280
# n + SHIFTER's bits less this are n's biased exponent: an integer subtraction, which AVX2
# has for four lanes, where converting a double to an int64 it has not
_SHIFTER_BITS_LESS_BIAS = int(np.float64(SHIFTER).view(np.int64)) - 1023
# log1p(e) = 2 atanh(u), u = e / (2 + e) <= 1/3 for e in [0, 1]: the series' terms 1/(2k+1)
# u^(2k+1) to k = 16, beyond which they are below 2e-18 of the sum
A1, A2, A3, A4, A5, A6, A7, A8, A9, A10, A11, A12, A13, A14, A15, A16 = (1 / (2 * k + 1) for k in range(1, 17))

_JIT = dict(inline="always", error_model="numpy", fastmath={"contract"})


@njit(**_JIT)
def exp_parts(t):
    """exp(t) = 2^n P(r) / P(-r) for |t| <= 708, r = t - n ln 2: returns (P(r), P(-r), 2^n),
    so that callers choose where the one division goes."""
    shifted = t * LOG2E + SHIFTER
    n = shifted - SHIFTER
    r = (t - n * LN2_HI) - n * LN2_LO
    s = r * r
    even = ((C6 * s + C4) * s + C2) * s + 1.0
    odd = ((C5 * s + C3) * s + C1) * r
    return even + odd, even - odd, bits_as_f64((f64_bits(shifted) - _SHIFTER_BITS_LESS_BIAS) << 52)


@njit(**_JIT)
def sigmoid64(z):
    """1 / (1 + exp(-z)) in float64 to ~2 ulp, branch-free: exp(-z) = 2^n P(r)/P(-r), and
    then σ = P(-r) / (P(-r) + 2^n P(r)) costs a single division. |z| is clamped at 708
    (σ is then 1 or below 1e-307 anyway)."""
    p, q, two_n = exp_parts(min(max(-z, -708.0), 708.0))
    return q / (q + p * two_n)


@njit(**_JIT)
def log1p_unit(e):
    """log(1 + e) for e in [0, 1] to ~1 ulp, from one division and an odd series (libm's
    log1p is a scalar call per element)."""
    u = e / (2.0 + e)
    w = u * u
    p = ((((((((((((((A16 * w + A15) * w + A14) * w + A13) * w + A12) * w + A11) * w + A10) * w + A9) * w
                + A8) * w + A7) * w + A6) * w + A5) * w + A4) * w + A3) * w + A2) * w + A1
    return 2.0 * u + (2.0 * u) * (w * p)


_F = np.float32
_LOG2E_F = _F(LOG2E)
_LN2_HI_F, _LN2_LO_F = _F(0.693359375), _F(-2.12194440e-4)       # Cody-Waite split in float32
# exp(r) = 1 + r + r^2 P(r) on |r| <= ln2/2 (Cephes expf's minimax polynomial, ~1 ulp)
_P_F = tuple(_F(c) for c in (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
                              1.6666665459e-1, 5.0000001201e-1))


@njit(**_JIT)
def _exp32_parts(x):
    """exp(x) = q 2^n for -104 <= x <= 0 in float32 arithmetic: (q, n), q within ~1 ulp
    (Cephes expf's polynomial), n an int32."""
    # n as a float32 and then an int32: math.floor's int64 has no vector conversion on
    # AVX2, which took each lane through a scalar register
    nf = np.floor(x * _LOG2E_F + _F(0.5))
    r = (x - nf * _LN2_HI_F) - nf * _LN2_LO_F
    p = _P_F[0]
    p = p * r + _P_F[1]
    p = p * r + _P_F[2]
    p = p * r + _P_F[3]
    p = p * r + _P_F[4]
    p = p * r + _P_F[5]
    return p * (r * r) + r + _F(1.0), np.int32(nf)


@njit(**_JIT)
def _pow2_32(n):
    """2^n as a float32 for -126 <= n <= 127 (its exponent bits)."""
    return bits_as_f32((n + np.int32(127)) << np.int32(23))


@njit(**_JIT)
def sigmoid32(z):
    """1 / (1 + exp(-z)) in float32 arithmetic to ~2.5 ulp (twice the lanes of the float64
    one, half its polynomial), down to the smallest subnormal: |z| is capped at 104
    (exp(-104) rounds to 0) and 2^n, n >= -150, applied as two normal halves, so that a
    result below the normal range is rounded once (a normal one is exact either way, as
    one product by 2^n). A NaN stays NaN."""
    q, n = _exp32_parts(-min(abs(z), _F(104.0)))
    half = n >> np.int32(1)
    e = (q * _pow2_32(half)) * _pow2_32(n - half)
    return (_F(1.0) if z >= 0 else e) / (_F(1.0) + e)


@njit(**_JIT)
def sigmoid32_capped(z):
    """:func:`sigmoid32` with |z| capped at 72 (one product by 2^n, no subnormal result),
    for passes that store every value below 2**-100 as 0 anyway (the RBM's: σ(-72) is
    5e-32): the same bits as sigmoid32 above that, in fewer operations."""
    q, n = _exp32_parts(-min(abs(z), _F(72.0)))
    e = q * _pow2_32(n)
    return (_F(1.0) if z >= 0 else e) / (_F(1.0) + e)


def sig(z):
    """Sigmoid in the precision of ``z`` for passes that flush tiny values: float32
    arithmetic for float32 (:func:`sigmoid32_capped`), else float64."""


@overload(sig, inline="always")
def _sig_impl(z):
    if z == types.float32:
        return lambda z: sigmoid32_capped(z)
    return lambda z: sigmoid64(np.float64(z))
