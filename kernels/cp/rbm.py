"""Restricted Boltzmann machine kernels (CuPy): cuBLAS GEMMs + fused element-wise kernels.

Same semantics as :mod:`kernels.ref.rbm`. Bias + nonlinearity + sampling is one kernel
per layer visit; the two statistics of the weight gradient are one GEMM over the stacked
batch [vk; v0]^T @ [hk; -h0], added into dW by one fused kernel (rbm_cd_backward) or,
in rbm_cd_update, turned into the velocity, weight cost and step of W by one fused kernel.
Subnormal probabilities are kept (GPUs take no assists for them; the numba set zeroes
float32 ones below 2**-100).
"""
import cupy as cp
import numpy as np

from ..ref.rbm import cd_factors_by_block, cd_update_via, check_cd, check_rbm

__all__ = ["rbm_hidden", "rbm_visible", "rbm_free_energy", "rbm_cd_backward", "rbm_cd_factors",
           "rbm_cd_factors_blocks", "rbm_cd_update"]

# sigmoid from exp of a non-positive argument only: no overflow in float32
_SIGMOID = "T e = exp(-fabs(a)); h = (a >= 0 ? (T)1 : e) / ((T)1 + e);"

_bern_hidden = cp.ElementwiseKernel(
    "T z, T b", "T h", f"T a = z + b; {_SIGMOID}", "aepar_rbm_bern_hidden")
_bern_hidden_sample = cp.ElementwiseKernel(
    "T z, T b, U u", "T h, T s", f"T a = z + b; {_SIGMOID} s = h > u ? (T)1 : (T)0;",
    "aepar_rbm_bern_hidden_sample")
_gauss_hidden = cp.ElementwiseKernel(
    "T z, T b", "T h", "h = z + b;", "aepar_rbm_gauss_hidden")
_gauss_hidden_sample = cp.ElementwiseKernel(
    "T z, T b, U eps", "T h, T s", "h = z + b; s = h + (T)eps;", "aepar_rbm_gauss_hidden_sample")
_visible = cp.ElementwiseKernel(
    "T z, T b", "T h", f"T a = z + b; {_SIGMOID}", "aepar_rbm_visible")
_sq_err = cp.ReductionKernel(
    "T v, T v0", "float64 s", "((double)v - (double)v0) * ((double)v - (double)v0)",
    "a + b", "s = a", "0", "aepar_rbm_sq_err", reduce_type="double")
_axpy = cp.ElementwiseKernel("T g, T alpha", "T d", "d += alpha * g;", "aepar_rbm_axpy")
# vel = m vel + a G - c W; W += vel (G: the stacked statistics, a = -lr / batch, c = lr * weight cost)
_momentum_step = cp.ElementwiseKernel(
    "T g, T a, T m, T c", "T vel, T w", "vel = m * vel + a * g - c * w; w += vel;", "aepar_rbm_momentum_step")


def rbm_hidden(v, W, bh, hidden):
    """Hidden probabilities (bernoulli) or means (gaussian); see :func:`kernels.ref.rbm.rbm_hidden`."""
    check_rbm(v, W, bh=bh, hidden=hidden)
    v, W, dt = _prep(v, W)
    z = v @ W
    return (_bern_hidden if hidden == "bernoulli" else _gauss_hidden)(z, bh.astype(dt, copy=False))


def rbm_visible(h, W, bv):
    """Visible probabilities sigmoid(h @ W.T + bv); see :func:`kernels.ref.rbm.rbm_visible`."""
    if h.ndim != 2 or W.ndim != 2 or h.shape[1] != W.shape[1] or bv.shape != (W.shape[0],):
        raise ValueError(f"rbm_visible: h {h.shape}, W {W.shape}, bv {bv.shape} do not fit "
                         "(h: batch x n_hidden, W: n_visible x n_hidden, bv: n_visible)")
    h, W, dt = _prep(h, W)
    return _visible(h @ W.T, bv.astype(dt, copy=False))


def rbm_free_energy(v, W, bv, bh, hidden):
    """F(v) per row, up to a constant; see :func:`kernels.ref.rbm.rbm_free_energy`."""
    check_rbm(v, W, bv=bv, bh=bh, hidden=hidden)
    v, W, dt = _prep(v, W)
    z = v @ W + bh.astype(dt, copy=False)
    hid = cp.logaddexp(0, z).sum(axis=1) if hidden == "bernoulli" else 0.5 * (z * z).sum(axis=1)
    return -(v @ bv.astype(dt, copy=False)) - hid


def rbm_cd_backward(v0, W, bv, bh, noise, hidden, dW, dbv, dbh, scale=None):
    """CD-k, k = noise.shape[0]; adds the negated CD update into dW, dbv, dbh.

    See :func:`kernels.ref.rbm.rbm_cd_backward` (``scale`` default 1/batch). Returns
    (h0, vk, sq_err) with sq_err a Python float (one device sync per call).
    """
    check_rbm(v0, W, bv=bv, bh=bh, hidden=hidden)
    check_cd(v0, W, noise, dW, dbv, dbh)
    vs, hs, alpha, sq_err = rbm_cd_factors(v0, W, bv, bh, noise, hidden, dbv, dbh, scale)
    _axpy(vs.T @ hs, vs.dtype.type(alpha), dW)
    batch = v0.shape[0]
    return -hs[batch:], vs[:batch], sq_err


def rbm_cd_factors(v0, W, bv, bh, noise, hidden, dbv, dbh, scale=None):
    """The chain of :func:`rbm_cd_backward` and its bias gradients (added into dbv, dbh);
    returns (vs, hs, alpha, sq_err) with the W gradient alpha * vs.T @ hs, vs = [vk; v0],
    hs = [hk; -h0], alpha = scale. See :func:`kernels.ref.rbm.rbm_cd_factors`."""
    check_rbm(v0, W, bv=bv, bh=bh, hidden=hidden)
    check_cd(v0, W, noise, W, dbv, dbh, ("W", "dbv", "dbh"), "rbm_cd_factors")
    v0, W, dt = _prep(v0, W)
    batch = v0.shape[0]
    scale = 1.0 / batch if scale is None else float(scale)
    vs, hs, h0, sq_err = _chain(v0, W, bv.astype(dt, copy=False), bh.astype(dt, copy=False), noise, hidden)
    v, h = vs[:batch], hs[:batch]
    dbv += (v.sum(axis=0) - v0.sum(axis=0)) * scale
    dbh += (h.sum(axis=0) - h0.sum(axis=0)) * scale
    return vs, hs, scale, float(sq_err)


def rbm_cd_factors_blocks(v0, W, bv, bh, noise, hidden, dbvs, dbhs, starts, scale=None):
    """:func:`rbm_cd_factors` block by block, stacked; see :func:`kernels.ref.rbm.rbm_cd_factors_blocks`
    (cuBLAS's rows may depend on the rows beside them: no stacked chain here)."""
    return cd_factors_by_block(rbm_cd_factors, cp, v0, W, bv, bh, noise, hidden, dbvs, dbhs, starts, scale)


def rbm_cd_update(v0, W, bv, bh, noise, hidden, vW, vbv, vbh, lr, momentum, weight_cost):
    """CD-k and its SGD-with-momentum step, in place; see :func:`kernels.ref.rbm.rbm_cd_update`.

    One GEMM for both statistics, then one fused kernel for the velocity, the weight cost
    and the step of W. Returns sq_err (one device sync per call).
    """
    check_rbm(v0, W, bv=bv, bh=bh, hidden=hidden)
    check_cd(v0, W, noise, vW, vbv, vbh, names=("vW", "vbv", "vbh"))
    dt = np.result_type(v0.dtype, W.dtype)
    dt = dt if dt.kind == "f" else np.dtype(np.float64)
    if not all(a.dtype == dt and a.flags.c_contiguous for a in (W, bv, bh, vW, vbv, vbh)):
        # odd layouts or dtypes: the same step through the gradient
        return cd_update_via(rbm_cd_backward, v0, W, bv, bh, noise, hidden, vW, vbv, vbh,
                             lr, momentum, weight_cost)
    v0 = cp.ascontiguousarray(v0, dtype=dt)
    batch = v0.shape[0]
    vs, hs, h0, sq_err = _chain(v0, W, bv, bh, noise, hidden)
    # vs.T @ hs = vk.T @ hk - v0.T @ h0 = batch * dW (without the weight cost)
    _momentum_step(vs.T @ hs, dt.type(-lr / batch), dt.type(momentum), dt.type(lr * weight_cost), vW, W)
    v, h = vs[:batch], hs[:batch]
    for p, vel, g in ((bv, vbv, (v.sum(axis=0) - v0.sum(axis=0)) / batch),
                      (bh, vbh, (h.sum(axis=0) - h0.sum(axis=0)) / batch)):
        vel *= momentum
        vel -= lr * g
        p += vel
    return float(sq_err)


def _chain(v0, W, bv, bh, noise, hidden):
    """The CD-k chain: (vs = [vk; v0], hs = [hk; -h0], h0, sq_err on the device); one GEMM
    vs.T @ hs then gives vk.T @ hk - v0.T @ h0."""
    sample = _bern_hidden_sample if hidden == "bernoulli" else _gauss_hidden_sample
    hid = _bern_hidden if hidden == "bernoulli" else _gauss_hidden
    batch, k, dt = v0.shape[0], noise.shape[0], W.dtype
    vs = cp.empty((2 * batch, v0.shape[1]), dtype=dt)
    hs = cp.empty((2 * batch, W.shape[1]), dtype=dt)
    v, h = vs[:batch], hs[:batch]
    h0, state = sample(v0 @ W, bh, noise[0])
    sq_err = None
    for i in range(k):
        _visible(state @ W.T, bv, v)
        if i == 0:
            sq_err = _sq_err(v, v0)
        if i + 1 < k:
            h, state = sample(v @ W, bh, noise[i + 1], h, state)
        else:
            hid(v @ W, bh, h)
    vs[batch:] = v0
    cp.negative(h0, out=hs[batch:])
    return vs, hs, h0, sq_err


def _prep(a, W):
    dt = np.result_type(a.dtype, W.dtype)
    if dt.kind != "f":
        dt = np.dtype(np.float64)
    return cp.ascontiguousarray(a, dtype=dt), cp.ascontiguousarray(W, dtype=dt), dt
