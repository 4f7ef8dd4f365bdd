"""Restricted Boltzmann machine kernels (Numba): BLAS GEMMs + fused element-wise passes.

Same semantics as :mod:`kernels.ref.rbm`, except that float32 probabilities below 2**-100
are stored as 0 (see :func:`_flush`). A CD-1 step on 784x1000, batch 100 is ~0.8 GFLOP in
five GEMMs (four calls), so the GEMMs are called through scipy's BLAS wrappers on
row-major arrays seen as their column-major transposes: results land in preallocated
buffers with no temporaries. The chain writes [v0; vk] and [h0; -hk] into stacked
buffers, so that one GEMM with K = 2 batch gives both statistics: it accumulates into
``dW`` (rbm_cd_backward), or it *is* the velocity update (rbm_cd_update: beta = momentum),
after which one pass over W adds the weight cost and takes the step.

Bias, nonlinearity, sampling and the reconstruction error are one fused pass each, with a
sigmoid LLVM vectorises: float32 arithmetic for float32 arrays (float64 for float64), no
libm call (libm's exp is scalar, a call per element) and error_model="numpy" (Python's
error model tests each division for zero, a branch that kept the loops scalar). The four
GEMM calls are most of a step. The forward products of a block of at most
``rowprod.MAX_ROWS`` rows (aepar.rows' eight blocks of a batch) go to :mod:`.rowprod`
instead: OpenBLAS runs those far below its rate.

The passes are serial on purpose: each is short next to the GEMMs, and a numba parallel
region between BLAS calls cost more than it saved. With 2 threads a CD-1 step took the
same time either way under OMP_WAIT_POLICY=passive, and with GNU OpenMP's default spinning
each parallel-region-then-GEMM hand-over was costly (the spinning OpenMP workers starve
OpenBLAS's threads); prange passes and update were slower at 2 threads too.
scipy's BLAS is the one numba's np.dot uses too: one BLAS thread pool (NumPy's own
OpenBLAS did the forward products a little faster on one thread, but a second pool made a
2-thread step several times slower).
"""
import math
import sys
import threading

import numpy as np
from numba import literal_unroll, njit

from ..memory import empty
from ..ref.blocksum import most_rows
from ..ref.rbm import cd_update_blocks_via, cd_update_via, check_cd, check_cd_blocks, check_cd_update_blocks, check_rbm
from .blas import gemm
from .nbmath import sig as _sig
from .rowprod import LONG_ROWS, _rows_times, rows_times, rows_times_t, tables_sgd_step, thin, w_panels, wt_panel

__all__ = ["rbm_hidden", "rbm_visible", "rbm_free_energy", "rbm_cd_backward", "rbm_cd_factors",
           "rbm_cd_factors_blocks", "rbm_cd_update", "rbm_cd_update_blocks"]


def rbm_hidden(v, W, bh, hidden):
    """Hidden probabilities (bernoulli) or means (gaussian); see :func:`kernels.ref.rbm.rbm_hidden`."""
    check_rbm(v, W, bh=bh, hidden=hidden)
    v, W, dt = _prep(v, W)
    h = np.empty((v.shape[0], W.shape[1]), dtype=dt)
    _vW(v, W, h)
    _hidden_pass(h, bh.astype(dt, copy=False), hidden == "gaussian", h, h, False, _flush(dt), 1.0)
    return h


def rbm_visible(h, W, bv):
    """Visible probabilities sigmoid(h @ W.T + bv); see :func:`kernels.ref.rbm.rbm_visible`."""
    if h.ndim != 2 or W.ndim != 2 or h.shape[1] != W.shape[1] or bv.shape != (W.shape[0],):
        raise ValueError(f"rbm_visible: h {h.shape}, W {W.shape}, bv {bv.shape} do not fit "
                         "(h: batch x n_hidden, W: n_visible x n_hidden, bv: n_visible)")
    h, W, dt = _prep(h, W)
    v = np.empty((h.shape[0], W.shape[0]), dtype=dt)
    _hWt(h, W, v)
    _visible_pass(v, bv.astype(dt, copy=False), _flush(dt))
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


def rbm_cd_backward(v0, W, bv, bh, noise, hidden, dW, dbv, dbh, scale=None):
    """CD-k, k = noise.shape[0]; adds the negated CD update into dW, dbv, dbh.

    See :func:`kernels.ref.rbm.rbm_cd_backward` (``scale`` default 1/batch). Returns
    (h0, vk, sq_err).
    """
    check_rbm(v0, W, bv=bv, bh=bh, hidden=hidden)
    check_cd(v0, W, noise, dW, dbv, dbh)
    vs, hs, scale, sq_err = _cd_chain_stacked(v0, W, bv, bh, noise, hidden, dbv, dbh, scale)
    # dW += scale (vk.T @ hk - v0.T @ h0) = -scale [v0; vk].T @ [h0; -hk]: one GEMM into dW
    dt = vs.dtype
    target = dW if dW.flags.c_contiguous and dW.dtype == dt else np.zeros(dW.shape, dtype=dt)
    _gemm_into(target.T, -scale, hs.T, vs.T, beta=1.0, trans_b=1)
    if target is not dW:
        dW += target
    batch = v0.shape[0]
    return hs[:batch], vs[batch:], sq_err


def rbm_cd_factors(v0, W, bv, bh, noise, hidden, dbv, dbh, scale=None):
    """The chain of :func:`rbm_cd_backward` and its bias gradients (added into dbv, dbh);
    returns (vs, hs, alpha, sq_err) with the W gradient alpha * vs.T @ hs: vs = [v0; vk],
    hs = -scale [h0; -hk] (each element rounded once), alpha = 1. The scale rides on hs
    because ``block_outer_sum`` then skips a multiply of every block's sums by its alpha,
    which stands between a block's last FMA and the tree's additions. See
    :func:`kernels.ref.rbm.rbm_cd_factors`."""
    vs, hs, scale, sq_err = _cd_chain_stacked(v0, W, bv, bh, noise, hidden, dbv, dbh, scale)
    hs *= hs.dtype.type(-scale)
    return vs, hs, 1.0, sq_err


def _cd_chain_stacked(v0, W, bv, bh, noise, hidden, dbv, dbh, scale):
    """(vs = [v0; vk], hs = [h0; -hk], scale, sq_err) of the chain, its bias gradients
    added into dbv, dbh."""
    check_rbm(v0, W, bv=bv, bh=bh, hidden=hidden)
    check_cd(v0, W, noise, W, dbv, dbh, ("W", "dbv", "dbh"), "rbm_cd_factors")
    v0, W, dt = _prep(v0, W)
    batch = v0.shape[0]
    scale = 1.0 / batch if scale is None else float(scale)
    vs, hs = empty((2 * batch, W.shape[0]), dt), empty((2 * batch, W.shape[1]), dt)
    sq_err = _chain(v0, W, bv.astype(dt, copy=False), bh.astype(dt, copy=False), noise, hidden,
                    vs, hs, empty((batch, W.shape[1]), dt))
    _add_bias_grads(vs, hs, batch, scale, dbv, dbh)
    return vs, hs, scale, float(sq_err)


def rbm_cd_factors_blocks(v0, W, bv, bh, noise, hidden, dbvs, dbhs, starts, scale=None):
    """:func:`rbm_cd_factors` of each block of stacked rows, stacked as
    :func:`kernels.ref.rbm.rbm_cd_factors_blocks` says. CD-1 on blocks that each would
    take the row kernels alone runs every block's chain in one call of each product: a
    row's sums do not depend on the other rows of the call, so every block keeps its own
    bits, and W is read once per product instead of once per block (which pays most where
    W does not fit in L2). Anything else: block by block.
    """
    check_rbm(v0, W, bv=bv, bh=bh, hidden=hidden)
    starts = check_cd_blocks(v0, noise, dbvs, dbhs, starts)
    shapes = ((W.shape[0],), (W.shape[1],))
    for b, (dbv, dbh) in enumerate(zip(dbvs, dbhs)):  # the whole check once, then the shapes that differ
        if b == 0 or (dbv.shape, dbh.shape) != shapes:
            check_cd(v0, W, noise, W, dbv, dbh, ("W", "dbv", "dbh"), "rbm_cd_factors_blocks")
    v0, W, dt = _prep(v0, W)
    M, nv, nh = v0.shape[0], W.shape[0], W.shape[1]
    scale = 1.0 / M if scale is None else float(scale)
    h0, state, vk, hk = _chain_workspace(M, nv, nh, dt)
    most = most_rows(starts)
    bv, bh = bv.astype(dt, copy=False), bh.astype(dt, copy=False)
    vs, hs = empty((2 * M, nv), dt), empty((2 * M, nh), dt)
    if noise.shape[0] != 1 or not (thin(v0, W, h0, most) and thin(state, W, vk, most)):
        # block by block, each chain written where the stacked factors want it (stacking
        # fresh ones costs a copy of both, a sizeable part of a CD-1 step at large batches)
        sq_errs = []
        for lo, hi, dbv, dbh in zip(starts[:-1], starts[1:], dbvs, dbhs):
            sq_errs.append(float(_chain(v0[lo:hi], W, bv, bh, noise[:, lo:hi], hidden, vs[2 * lo:2 * hi],
                                        hs[2 * lo:2 * hi], state[lo:hi])))
            _add_bias_grads(vs[2 * lo:2 * hi], hs[2 * lo:2 * hi], hi - lo, scale, dbv, dbh)
            hs[2 * lo:2 * hi] *= dt.type(-scale)  # as rbm_cd_factors
        return vs, hs, 1.0, sq_errs
    blocks = len(starts) - 1
    sq_errs, gv, gh = np.empty(blocks), np.empty((blocks, nv), dt), np.empty((blocks, nh), dt)
    panel, keeps = w_panels(M, W, True)  # W's column panels, copied once for both of its products
    _cd_blocks(v0, W, bv, bh, hidden == "gaussian", noise[0], _flush(dt), h0, state, vk, hk, panel, keeps,
               wt_panel(W), starts, scale, dt.type(-scale), vs, hs, sq_errs, gv, gh)
    if blocks:
        _add_rows(tuple(dbvs), gv)
        _add_rows(tuple(dbhs), gh)
    return vs, hs, 1.0, sq_errs.tolist()


def rbm_cd_update_blocks(v0, W, bv, bh, noise, hidden, starts, merges, vW, vbv, vbh, lr, momentum, weight_cost,
                         scale=None):
    """The blocks' CD step, in place; see :func:`kernels.ref.rbm.rbm_cd_update_blocks`. CD-1
    on float32, C-ordered arrays whose every block takes the row kernels: the chains in one
    compiled call (:func:`_cd_blocks`, as :func:`rbm_cd_factors_blocks` runs it), W's tree
    and step in another (``block_outer_sum_sgd``'s tiles), each bias's tree and step in
    one more (:func:`.rowprod.tables_sgd_step`, as ``blocks_sgd_step`` takes them): those kernels'
    bits, without their checks and Python around each call (most of a narrow layer's
    step). Anything else: the kernels one after another."""
    check_rbm(v0, W, bv=bv, bh=bh, hidden=hidden)
    starts, merges = check_cd_update_blocks(v0, W, noise, vW, vbv, vbh, starts, merges)
    M, nv, nh, dt = v0.shape[0], W.shape[0], W.shape[1], np.dtype(np.float32)
    arrays = (v0, W, bv, bh, vW, vbv, vbh)
    most = most_rows(starts)
    if noise.shape[0] != 1 or 2 * most > LONG_ROWS or \
            not all(a.dtype == dt and a.flags.c_contiguous and (a is v0 or a.flags.writeable) for a in arrays):
        return cd_update_blocks_via(sys.modules[__package__], np, v0, W, bv, bh, noise, hidden, starts, merges, vW, vbv,
                                    vbh, lr, momentum, weight_cost, scale)
    h0, state, vk, hk = _chain_workspace(M, nv, nh, dt)
    if not (thin(v0, W, h0, most) and thin(state, W, vk, most)):
        return cd_update_blocks_via(sys.modules[__package__], np, v0, W, bv, bh, noise, hidden, starts, merges, vW, vbv,
                                    vbh, lr, momentum, weight_cost, scale)
    scale = 1.0 / M if scale is None else float(scale)
    blocks = merges.size
    vs, hs = empty((2 * M, nv), dt), empty((2 * M, nh), dt)
    sq_errs, gv, gh = np.empty(blocks), np.empty((blocks, nv), dt), np.empty((blocks, nh), dt)
    panel, keeps = w_panels(M, W, True)
    _cd_blocks(v0, W, bv, bh, hidden == "gaussian", noise[0], _flush(dt), h0, state, vk, hk, panel, keeps,
               wt_panel(W), starts, scale, dt.type(-scale), vs, hs, sq_errs, gv, gh)
    # each bias's rows straight from gv and gh: the trainer adds them to zeroed rows first,
    # which keeps their bits (none is -0, each a sum that starts from +0)
    return tables_sgd_step(vs, hs, 2 * starts, merges, W, vW, (gv, gh), (bv, bh), (vbv, vbh), sq_errs, lr, momentum,
                           weight_cost)


@njit(cache=True, nogil=True, error_model="numpy")
def _cd_blocks(v0, W, bv, bh, gauss, noise, flush, h0, state, vk, hk, panel, keeps, tpanel, starts, scale,
               minus_scale, vs, hs, sq_errs, gv, gh):
    """:func:`_chain`'s steps for k = 1 on every block's rows at once, then the blocks'
    factors stacked (:func:`_stack_blocks`), in one call (the Python between eight kernel
    calls was a tenth of a small layer's step, and a second thread's group waits for it,
    under the interpreter lock). The products through the row kernels: ``panel`` W's
    column panels' room for v0 @ W and vk @ W (:func:`kernels.nb.rowprod.w_panels`: with
    ``keeps`` the second reads what the first copied), ``tpanel`` W.T's for state @ W.T."""
    _rows_times(v0, W, h0, panel, False, False)
    _hidden_pass(h0, bh, gauss, noise, state, True, flush, 1.0)
    _rows_times(state, W, vk, tpanel, True, False)
    _visible_pass(vk, bv, flush)
    _rows_times(vk, W, hk, panel, False, keeps)
    _hidden_pass(hk, bh, gauss, hk, hk, False, flush, -1.0)
    _stack_blocks(v0, vk, h0, hk, starts, scale, minus_scale, vs, hs, sq_errs, gv, gh)


@njit(cache=True, nogil=True)
def _add_rows(outs, rows):
    """outs[b] += rows[b] for each block b, element by element as NumPy's ``+=`` (one
    call for a tuple of the blocks' arrays instead of a NumPy addition each)."""
    b = 0
    for out in literal_unroll(outs):
        for j in range(out.shape[0]):
            out[j] += rows[b, j]
        b += 1


@njit(cache=True, nogil=True, error_model="numpy")
def _stack_blocks(v0, vk, h0, hk, starts, scale, minus_scale, vs, hs, sq_errs, gv, gh):
    """Every block's chain stacked where :func:`rbm_cd_factors_blocks` returns it (block b's
    rows of vs: [v0_b; vk_b] from 2 starts[b], of hs: ``minus_scale`` [h0_b; -hk_b] (in the
    arrays' dtype, as :func:`rbm_cd_factors`' product), hk holding -hk), its
    squared error (:func:`_sq_err`) and its bias gradients (row b of gv and gh), in one call
    for all blocks. The bias sums are :func:`_bias_grads`' own, element by element in the
    same order, taken while the rows are copied: one pass over them where slice copies,
    then the sums, read them twice (and allocated four arrays a block)."""
    nv, nh = vs.shape[1], hs.shape[1]
    sv, sh = np.empty(nv), np.empty(nh)  # float64, as _bias_grads sums
    for b in range(starts.size - 1):
        lo, hi = starts[b], starts[b + 1]
        n = hi - lo
        sv[:] = 0.0
        sh[:] = 0.0
        for r in range(n):
            for j in range(nv):
                first, last = v0[lo + r, j], vk[lo + r, j]
                vs[2 * lo + r, j] = first
                vs[2 * lo + n + r, j] = last
                sv[j] += np.float64(last) - np.float64(first)
            for j in range(nh):
                first, last = h0[lo + r, j], hk[lo + r, j]
                hs[2 * lo + r, j] = first * minus_scale
                hs[2 * lo + n + r, j] = last * minus_scale
                sh[j] -= np.float64(last) + np.float64(first)
        sq_errs[b] = _sq_err(vk[lo:hi], v0[lo:hi])
        for j in range(nv):  # rounded to the arrays' dtype as _bias_grads' astype does
            gv[b, j] = sv[j] * scale
        for j in range(nh):
            gh[b, j] = sh[j] * scale


def _add_bias_grads(vs, hs, batch, scale, dbv, dbh):
    gv, gh = _bias_grads(vs, hs, batch, scale)
    dbv += gv
    dbh += gh


def rbm_cd_update(v0, W, bv, bh, noise, hidden, vW, vbv, vbh, lr, momentum, weight_cost):
    """CD-k and its SGD-with-momentum step, in place; see :func:`kernels.ref.rbm.rbm_cd_update`.

    The velocity update is the statistics GEMM itself (vW = momentum vW + lr/batch
    [v0; vk].T @ [h0; -hk]), then one pass over W adds the weight cost and takes the step.
    The chain's buffers are kept between calls (per thread and layer shape): allocating
    them afresh cost page faults worth a twentieth of the step. Returns sq_err.
    """
    check_rbm(v0, W, bv=bv, bh=bh, hidden=hidden)
    check_cd(v0, W, noise, vW, vbv, vbh, names=("vW", "vbv", "vbh"))
    dt = _prep_dtype(v0, W)
    inplace = all(a.dtype == dt and a.flags.c_contiguous and a.flags.writeable for a in (W, bv, bh, vW, vbv, vbh))
    if not inplace:  # odd layouts or dtypes: the same step through the gradient
        return cd_update_via(rbm_cd_backward, v0, W, bv, bh, noise, hidden, vW, vbv, vbh,
                             lr, momentum, weight_cost)
    batch = v0.shape[0]
    vs, hs, state = _workspace(batch, W.shape[0], W.shape[1], dt)
    sq_err = _chain(np.ascontiguousarray(v0, dtype=dt), W, bv, bh, noise, hidden, vs, hs, state)
    lr, momentum = float(lr), float(momentum)
    _gemm_into(vW.T, lr / batch, hs.T, vs.T, beta=momentum, trans_b=1)
    # the passes' scalars in the arrays' dtype: float32 arithmetic for float32 weights, as
    # in .update (float64 scalars made these passes run in float64, slower)
    _decay_step(W.reshape(-1), vW.reshape(-1), dt.type(lr * float(weight_cost)))
    gv, gh = _bias_grads(vs, hs, batch, 1.0 / batch)
    _bias_step(bv, vbv, gv, dt.type(lr), dt.type(momentum))
    _bias_step(bh, vbh, gh, dt.type(lr), dt.type(momentum))
    return float(sq_err)


_work = threading.local()


# rbm_cd_factors_blocks keeps its chain's scratch between calls up to this size (a batch of
# 100 of the 784x1000 layer: 1.5 MB); larger batches allocate it per call, where the
# allocation is a small part of the step and keeping it would hold memory per thread and
# layer. Each kind of kept buffers holds this many shapes a thread (a stack's layers, each
# with its last, shorter batch)
KEEP_CHAIN_BYTES, KEEP_SHAPES = 4 << 20, 16


def _chain_workspace(rows, nv, nh, dt):
    """(h0, state, vk, hk) for :func:`rbm_cd_factors_blocks`' chain over ``rows`` rows:
    scratch that no result refers to, this thread's kept between calls where small (four
    aligned allocations were a tenth of a small layer's 8-block step)."""
    def fresh():
        return empty((rows, nh), dt), empty((rows, nh), dt), empty((rows, nv), dt), empty((rows, nh), dt)
    if rows * (3 * nh + nv) * np.dtype(dt).itemsize > KEEP_CHAIN_BYTES:
        return fresh()
    return _kept("chains", (rows, nv, nh, np.dtype(dt).str), fresh)


def _workspace(batch, nv, nh, dt):
    """This thread's (vs, hs, state) buffers for a layer shape, at least ``batch`` rows."""
    bufs = _kept("bufs", (nv, nh, np.dtype(dt).str),
                 lambda: (empty((2 * batch, nv), dt), empty((2 * batch, nh), dt), empty((batch, nh), dt)),
                 lambda bufs: bufs[2].shape[0] >= batch)
    return bufs[0][:2 * batch], bufs[1][:2 * batch], bufs[2][:batch]


def _kept(name, key, make, fits=lambda bufs: True):
    """This thread's buffers ``key`` of the kind ``name``, made by ``make()`` where there are
    none that ``fits``: the most recent KEEP_SHAPES keys of each kind are kept (a
    notebook that tries many shapes holds only the latest)."""
    cache = _work.__dict__.setdefault(name, {})
    bufs = cache.pop(key, None)
    if bufs is None or not fits(bufs):
        bufs = make()
    cache[key] = bufs  # the newest last
    if len(cache) > KEEP_SHAPES:
        del cache[next(iter(cache))]
    return bufs


def _chain(v0, W, bv, bh, noise, hidden, vs, hs, state):
    """The CD-k chain into stacked buffers: vs = [v0; vk], hs = [h0; -hk] (one GEMM then
    gives both statistics); returns the first reconstruction's squared error."""
    gauss = hidden == "gaussian"
    flush = _flush(W.dtype)
    batch, k = v0.shape[0], noise.shape[0]
    vs[:batch] = v0
    h0, v, hk = hs[:batch], vs[batch:], hs[batch:]
    h = np.empty_like(h0) if k > 1 else hk
    sq_err = 0.0
    _vW(v0, W, h0)
    _hidden_pass(h0, bh, gauss, noise[0], state, True, flush, 1.0)
    for i in range(k):
        _hWt(state, W, v)
        _visible_pass(v, bv, flush)
        if i == 0:
            sq_err = _sq_err(v, v0)
        last = i + 1 == k
        _vW(v, W, hk if last else h)
        if last:
            _hidden_pass(hk, bh, gauss, hk, hk, False, flush, -1.0)
        else:
            _hidden_pass(h, bh, gauss, noise[i + 1], state, True, flush, 1.0)
    return sq_err


def _flush(dt):
    """Probabilities below this are stored as 0: in float32, 2**-100; float64 keeps every value.

    After a few epochs about a tenth of the hidden probabilities are below 1e-30 (sigmoid
    of < -69), their products with the data or the weights underflow, and x86 arithmetic
    that meets subnormal numbers takes microcode assists: they slow PyTorch's plain CD-1
    epoch several-fold, and this kernel set a little.
    A thread's flush-to-zero mode would not reach OpenBLAS's worker threads; zeros in the
    operands do. The change to any float32 result is 30 orders of magnitude below its
    last digit.

    The threshold is a scalar of the arrays' dtype (2**-100 is a normal float32, so the
    test is exact either way): against a float64 one the passes converted every float32
    probability to float64 for the test, inside their vector loops.
    """
    dt = np.dtype(dt)
    return dt.type(2.0 ** -100 if dt == np.float32 else 0.0)


def _prep_dtype(a, W):
    dt = np.result_type(a, W)
    return dt if dt.kind == "f" else np.dtype(np.float64)


def _prep(a, W):
    dt = _prep_dtype(a, W)
    return np.ascontiguousarray(a, dtype=dt), np.ascontiguousarray(W, dtype=dt), dt


def _gemm_into(c, alpha, a, b, beta=0.0, trans_a=0, trans_b=0):
    """c = alpha op(a) op(b) + beta c for column-major views, without the GIL (.blas)."""
    gemm(alpha, a, b, beta, c, trans_a, trans_b)


def _vW(v, W, out):
    """out = v @ W: a block's few rows through :mod:`.rowprod`, else BLAS with
    out.T = W.T @ v.T (all three column-major views, no copies)."""
    if thin(v, W, out):
        rows_times(v, W, out)
    else:
        _gemm_into(out.T, 1.0, W.T, v.T)


def _hWt(h, W, out):
    """out = h @ W.T: a block's few rows through :mod:`.rowprod`, else BLAS with
    out.T = W @ h.T."""
    if thin(h, W, out):
        rows_times_t(h, W, out)
    else:
        _gemm_into(out.T, 1.0, W.T, h.T, trans_a=1)


# ---- fused element-wise passes (one read and one write of each operand) ----------------
# error_model="numpy": Python's error model tests every division for zero, a branch that
# kept LLVM from vectorising the sigmoid, which then ran many times slower.

@njit(cache=True, nogil=True, error_model="numpy", fastmath={"contract"})
def _hidden_pass(h, bh, gauss, noise, state, sample, flush, sign):
    """h = sign * (sigmoid(h + bh), 0 below ``flush``) or sign * (h + bh), in place; with
    ``sample`` also the state (h > noise for bernoulli units, h + noise for gaussian)."""
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
                p = _sig(h[r, j] + bh[j])
                h[r, j] = p if p >= flush else 0.0
            if sample:
                for j in range(n):
                    state[r, j] = 1 if h[r, j] > noise[r, j] else 0
        if sign != 1.0:
            for j in range(n):
                h[r, j] = -h[r, j]


@njit(cache=True, nogil=True, error_model="numpy", fastmath={"contract"})
def _visible_pass(v, bv, flush):
    """v = sigmoid(v + bv) in place, 0 below ``flush``."""
    B, n = v.shape
    for r in range(B):
        for j in range(n):
            p = _sig(v[r, j] + bv[j])
            v[r, j] = p if p >= flush else 0.0


@njit(cache=True, nogil=True, error_model="numpy", fastmath={"contract", "reassoc"})
def _sq_err(v, v0):
    """sum((v - v0)^2) in float64 (reassociated: a vectorised sum, the same on every run)."""
    total = 0.0
    for r in range(v.shape[0]):
        row = 0.0
        for j in range(v.shape[1]):
            d = np.float64(v[r, j]) - np.float64(v0[r, j])
            row += d * d
        total += row
    return total


@njit(cache=True, nogil=True)
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


@njit(cache=True, nogil=True, error_model="numpy")
def _bias_grads(vs, hs, batch, scale):
    """(scale Σ(vk - v0), scale Σ(hk - h0)) from vs = [v0; vk] and hs = [h0; -hk], in float64 sums."""
    gv = np.zeros(vs.shape[1])
    gh = np.zeros(hs.shape[1])
    for r in range(batch):
        for j in range(vs.shape[1]):
            gv[j] += np.float64(vs[batch + r, j]) - np.float64(vs[r, j])
        for j in range(hs.shape[1]):
            gh[j] -= np.float64(hs[batch + r, j]) + np.float64(hs[r, j])
    return (gv * scale).astype(vs.dtype), (gh * scale).astype(hs.dtype)


@njit(cache=True, nogil=True, error_model="numpy")
def _decay_step(w, vel, c):
    """vel -= c * w; w += vel (flat arrays): the weight cost and the step in one pass."""
    for i in range(w.size):
        v = vel[i] - c * w[i]
        vel[i] = v
        w[i] += v


@njit(cache=True, nogil=True, error_model="numpy")
def _bias_step(b, vel, g, lr, momentum):
    for i in range(b.size):
        v = momentum * vel[i] - lr * g[i]
        vel[i] = v
        b[i] += v
