"""Restricted Boltzmann machine kernels (Numba): BLAS GEMMs + fused element-wise passes.

Same semantics as :mod:`kernels.ref.rbm`. A CD-1 step on 784x1000, batch 100 is ~0.8 GFLOP
in five GEMMs, so the GEMMs are called through scipy's BLAS wrappers on row-major arrays
seen as their column-major transposes: results land in preallocated buffers, and the
weight gradient accumulates straight into ``dW`` (beta = 1) with no temporaries. Bias,
nonlinearity, sampling and the reconstruction error are one fused pass each, with a
sigmoid LLVM can vectorise (libm's exp is a scalar call: the passes were 2.5x slower).

The passes are serial on purpose: ~0.1 ms each at 100x1000, and a numba parallel region
between BLAS calls cost more than it saved. With 2 threads a CD-1 step took the same time
either way under OMP_WAIT_POLICY=passive, and with GNU OpenMP's default spinning each
parallel-region-then-GEMM hand-over cost ~5 ms (the spinning OpenMP workers starve
OpenBLAS's threads). scipy's BLAS is the one numba's np.dot uses too: one BLAS thread pool.
"""
import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic
from scipy.linalg import blas

from ..ref.rbm import check_cd, check_rbm

__all__ = ["rbm_hidden", "rbm_visible", "rbm_free_energy", "rbm_cd_backward"]


def rbm_hidden(v, W, bh, hidden):
    """Hidden probabilities (bernoulli) or means (gaussian); see :func:`kernels.ref.rbm.rbm_hidden`."""
    check_rbm(v, W, bh=bh, hidden=hidden)
    v, W, dt = _prep(v, W)
    h = np.empty((v.shape[0], W.shape[1]), dtype=dt)
    _vW(v, W, h)
    _hidden_pass(h, bh.astype(dt, copy=False), hidden == "gaussian", h, h, False)
    return h


def rbm_visible(h, W, bv):
    """Visible probabilities sigmoid(h @ W.T + bv); see :func:`kernels.ref.rbm.rbm_visible`."""
    if h.ndim != 2 or W.ndim != 2 or h.shape[1] != W.shape[1] or bv.shape != (W.shape[0],):
        raise ValueError(f"rbm_visible: h {h.shape}, W {W.shape}, bv {bv.shape} do not fit "
                         "(h: batch x n_hidden, W: n_visible x n_hidden, bv: n_visible)")
    h, W, dt = _prep(h, W)
    v = np.empty((h.shape[0], W.shape[0]), dtype=dt)
    _hWt(h, W, v)
    _visible_pass(v, bv.astype(dt, copy=False), v, False)
    return v


def rbm_free_energy(v, W, bv, bh, hidden):
    """F(v) per row, up to a constant; see :func:`kernels.ref.rbm.rbm_free_energy`."""
    check_rbm(v, W, bv=bv, bh=bh, hidden=hidden)
    v, W, dt = _prep(v, W)
    z = np.empty((v.shape[0], W.shape[1]), dtype=dt)
    _vW(v, W, z)
    F = np.empty(v.shape[0], dtype=dt)
    _free_energy_pass(v, z, bv.astype(dt, copy=False), bh.astype(dt, copy=False),
                      hidden == "gaussian", F)
    return F


def rbm_cd_backward(v0, W, bv, bh, noise, hidden, dW, dbv, dbh):
    """CD-k, k = noise.shape[0]; adds the negated CD update into dW, dbv, dbh.

    See :func:`kernels.ref.rbm.rbm_cd_backward`. Returns (h0, vk, sq_err).
    """
    check_rbm(v0, W, bv=bv, bh=bh, hidden=hidden)
    check_cd(v0, W, noise, dW, dbv, dbh)
    v0, W, dt = _prep(v0, W)
    bv, bh = bv.astype(dt, copy=False), bh.astype(dt, copy=False)
    gauss = hidden == "gaussian"
    batch, k = v0.shape[0], noise.shape[0]
    h0 = np.empty((batch, W.shape[1]), dtype=dt)
    state = np.empty_like(h0)
    h = np.empty_like(h0)
    v = np.empty_like(v0)
    sq_err = 0.0
    _vW(v0, W, h0)
    _hidden_pass(h0, bh, gauss, noise[0], state, True)
    for i in range(k):
        _hWt(state, W, v)
        if i == 0:
            sq_err = _visible_pass(v, bv, v0, True)
        else:
            _visible_pass(v, bv, v0, False)
        _vW(v, W, h)
        if i + 1 < k:
            _hidden_pass(h, bh, gauss, noise[i + 1], state, True)
        else:
            _hidden_pass(h, bh, gauss, h, h, False)
    # dW += (vk.T @ hk - v0.T @ h0) / batch as two accumulating GEMMs into dW itself
    target = dW if dW.flags.c_contiguous and dW.dtype == dt else np.zeros(dW.shape, dtype=dt)
    _gemm_into(target.T, 1.0 / batch, h.T, v.T, beta=1.0, trans_b=1)
    _gemm_into(target.T, -1.0 / batch, h0.T, v0.T, beta=1.0, trans_b=1)
    if target is not dW:
        dW += target
    dbv += _mean_diff(v, v0)
    dbh += _mean_diff(h, h0)
    return h0, v, float(sq_err)


# ---- GEMMs on row-major arrays through column-major BLAS -------------------------------

def _prep(a, W):
    dt = np.result_type(a, W)
    if dt.kind != "f":
        dt = np.dtype(np.float64)
    return np.ascontiguousarray(a, dtype=dt), np.ascontiguousarray(W, dtype=dt), dt


def _gemm(dt):
    return blas.sgemm if dt == np.float32 else blas.dgemm


def _gemm_into(c, alpha, a, b, beta=0.0, trans_a=0, trans_b=0):
    """c = alpha op(a) op(b) + beta c for column-major views; f2py writes c in place when it
    is F-contiguous of the right dtype, and otherwise we copy the result back."""
    r = _gemm(c.dtype)(alpha, a, b, beta=beta, c=c, trans_a=trans_a, trans_b=trans_b, overwrite_c=1)
    if not np.may_share_memory(r, c):
        c[...] = r


def _vW(v, W, out):
    """out = v @ W, i.e. out.T = W.T @ v.T (all three column-major views, no copies)."""
    _gemm_into(out.T, 1.0, W.T, v.T)


def _hWt(h, W, out):
    """out = h @ W.T, i.e. out.T = W @ h.T."""
    _gemm_into(out.T, 1.0, W.T, h.T, trans_a=1)


# ---- fused element-wise passes (one read and one write of each operand) ----------------

@njit(cache=True)
def _hidden_pass(h, bh, gauss, noise, state, sample):
    """h = sigmoid(h + bh) or h + bh in place; with ``sample`` also the state
    (h > noise for bernoulli units, h + noise for gaussian units)."""
    B, n = h.shape
    for r in range(B):
        if gauss:
            for j in range(n):
                h[r, j] += bh[j]
            if sample:
                for j in range(n):
                    state[r, j] = h[r, j] + noise[r, j]
        else:
            for j in range(n):
                h[r, j] = _sigmoid(np.float64(h[r, j]) + bh[j])
            if sample:
                for j in range(n):
                    state[r, j] = 1 if h[r, j] > noise[r, j] else 0


@njit(cache=True)
def _visible_pass(v, bv, v0, err):
    """v = sigmoid(v + bv) in place; with ``err`` returns sum((v - v0)^2) in float64."""
    B, n = v.shape
    total = 0.0
    for r in range(B):
        for j in range(n):
            v[r, j] = _sigmoid(np.float64(v[r, j]) + bv[j])
        if err:
            row = 0.0
            for j in range(n):
                d = np.float64(v[r, j]) - np.float64(v0[r, j])
                row += d * d
            total += row
    return total


@njit(cache=True)
def _free_energy_pass(v, z, bv, bh, gauss, F):
    B, nh = z.shape
    for r in range(B):
        s = 0.0
        for j in range(v.shape[1]):
            s -= np.float64(v[r, j]) * bv[j]
        for j in range(nh):
            a = np.float64(z[r, j]) + bh[j]
            if gauss:
                s -= 0.5 * a * a
            else:   # softplus without overflow
                s -= max(a, 0.0) + math.log1p(math.exp(-abs(a)))
        F[r] = s


@njit(cache=True)
def _mean_diff(a, b):
    """Column means of a - b, accumulated in float64."""
    B, n = a.shape
    acc = np.zeros(n)
    for r in range(B):
        for j in range(n):
            acc[j] += np.float64(a[r, j]) - np.float64(b[r, j])
    return (acc / B).astype(a.dtype)


# ---- a sigmoid that vectorises ---------------------------------------------------------

@intrinsic
def _bits_to_f64(typingctx, i):
    """Reinterpret int64 bits as a float64 (builds 2**n without a libm call)."""
    sig = types.float64(types.int64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())
    return sig, codegen


_LOG2E = 1.4426950408889634
_LN2_HI, _LN2_LO = 6.93147180369123816490e-01, 1.90821492927058770002e-10   # Cody-Waite split
_C = tuple(1.0 / math.factorial(k) for k in range(14))   # |r| <= ln2/2: error < 1e-17


@njit(inline="always", fastmath={"contract"})
def _sigmoid(z):
    """1 / (1 + exp(-z)) in float64 to ~1.5 ulp: exp(-|z|) = 2**n * exp(r), r by Cody-Waite,
    exp(r) by its degree-13 Taylor polynomial; no branches, so loops over it vectorise."""
    x = -min(abs(z), 708.0)           # exp(-708) is still a normal double
    n = math.floor(x * _LOG2E + 0.5)
    r = (x - n * _LN2_HI) - n * _LN2_LO
    p = _C[13]
    p = p * r + _C[12]
    p = p * r + _C[11]
    p = p * r + _C[10]
    p = p * r + _C[9]
    p = p * r + _C[8]
    p = p * r + _C[7]
    p = p * r + _C[6]
    p = p * r + _C[5]
    p = p * r + _C[4]
    p = p * r + _C[3]
    p = p * r + _C[2]
    p = p * r + _C[1]
    p = p * r + _C[0]
    e = p * _bits_to_f64((np.int64(n) + 1023) << 52)
    return (1.0 if z >= 0 else e) / (1.0 + e)
