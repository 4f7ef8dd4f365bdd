"""The SIMD path of :mod:`.sparse_ae`: x packed into panels and swept by the register
tiles of :mod:`.sparse_tiles`, every sum in registers and cache (the design is in
:mod:`.sparse_ae`'s docstring). Kernels take raw pointers (:func:`.simd.dptr`) and the
padded weights and accumulators of a :class:`.sparse_ae.SparseAEWorkspace`, all of one
precision (float64 or float32: each kernel is compiled for the one it is given; L below
is its vector's lanes, 8 or 16, and PW its panel's samples).
"""
from __future__ import annotations

import numpy as np
from numba import njit
from numba.extending import register_jitable

from .simd import JIT, dptr, lanes, rowptr, store_transposed, vhsum, vload, vstore
from .sparse_tiles import (OJ, OV, RH, SB, backward_fold, backward_split, hidden_tile, outer_tile, output_full,
                           output_masked, panel_width)
from .sparsity import kl_grad_into


@njit(**JIT)
def _pack_panels(x, blocks, vp, hp):
    """x into the panel blocks (both layouts), zero padding; a2 rows zeroed."""
    m, v = x.shape
    pw = panel_width(blocks)
    blk = (2 * vp + hp) * pw
    so = (vp + hp) * pw
    blocks[:] = 0.0
    for s in range(m):
        base = (s // pw) * blk
        lane = s % pw
        for i in range(v):
            blocks[base + i * pw + lane] = x[s, i]
            blocks[base + so + lane * vp + i] = x[s, i]


@njit(**JIT, inline="always")
def _tile_prefetch(t, per, lines, L):
    """(offset, line pairs) of the next block's lines (L numbers each) that call t
    prefetches, per lines (an even number) to a call."""
    lo = min(t * per, lines)
    return lo * L, (min(lo + per, lines) - lo + 1) >> 1


@njit(**JIT)
def _hidden_sweep(blocks, npan, p_lo, p_hi, vp, hp, w1, b1p, act, mask, h):
    """Sweep 1 over panels [p_lo, p_hi): a2 into each panel's block, its lanes' sums into
    act (raw pointers), x and a2 of the next block prefetched over the x W1 tiles."""
    L, pw = lanes(blocks), panel_width(blocks)
    ao, so = vp * pw, (vp + hp) * pw
    blk = so + pw * vp
    ht = hp // RH
    per1 = -(-so // (L * 2 * ht)) * 2
    for p in range(p_lo, p_hi):
        base = p * blk
        lines = so // L if p + 1 < npan else 0
        for t in range(ht):
            pfo, npf = _tile_prefetch(t, per1, lines, L)
            hidden_tile(w1, hp, t * RH, b1p, blocks, base, vp, blocks, base + ao,
                        blocks, base + blk + pfo, npf, h, act, mask, pw if p == npan - 1 else 0)


@njit(**JIT)
def _sweeps(blocks, npan, p_lo, p_hi, m, v, h, vp, hp, w1, w2, w2t, b1p, b2p, cmask, kv, zt, d3, d2,
            gw1, gw2, act, err, db1, db2, mask, group, fold, given, rho, beta):
    """The sweeps over panels [p_lo, p_hi) of the npan packed ones (all arrays as raw
    pointers; see _partials_panels); with ``given`` a2 and k are already in place."""
    L, pw = lanes(blocks), panel_width(blocks)
    ao, so = vp * pw, (vp + hp) * pw       # a2 and sample-major x within a block
    blk = so + pw * vp
    nh = hp if fold else 2 * hp            # rows of d2 panels: δ2, or e·s then s
    ht = hp // RH
    # Cache lines of the next block that each call prefetches (an even number): x
    # feature-major (split) over the x W1 tiles and a2 + x sample-major over the PW / SB
    # output-layer calls in sweep 2.
    per0 = -(-ao // (L * 2 * ht)) * 2
    per2 = -(-(blk - ao) // (L * 2 * (pw // SB))) * 2
    if fold and not given:
        # sweep 1: a2 of every panel and ρ̂, so that k is known for sweep 2
        _hidden_sweep(blocks, npan, p_lo, p_hi, vp, hp, w1, b1p, act, mask, h)
        rho_hat, k = np.empty(h), np.empty(h)
        for j in range(h):
            rho_hat[j] = vhsum(vload(act, j * L)) / m
        kl_grad_into(rho_hat, rho, beta, k)
        for j in range(h):
            kv[j] = k[j]
    for g0 in range(p_lo, p_hi, group):
        g1 = min(g0 + group, p_hi)
        for p in range(g0, g1):
            base = p * blk
            nxt = p + 1 < npan
            last = p == npan - 1
            mo = pw if last else 0
            if not fold:
                lines = ao // L if nxt else 0
                for t in range(ht):
                    pfo, npf = _tile_prefetch(t, per0, lines, L)
                    hidden_tile(w1, hp, t * RH, b1p, blocks, base, vp, blocks, base + ao,
                                 blocks, base + blk + pfo, npf, h, act, mask, mo)
            # output layer, 8 samples at a time (a3, δ3 both ways, sums); meanwhile the
            # next block's a2 and x rows are prefetched
            lines = (blk - ao) // L if nxt else 0
            nval = m - p * pw if last else pw
            do3 = (p - g0) * pw * vp
            for s0 in range(0, pw, SB):
                pfo, npf = _tile_prefetch(s0 // SB, per2, lines, L)
                if nval < pw or vp > v:
                    output_masked(blocks, base + ao + s0, w2, vp, b2p, hp, blocks, base + blk + ao + pfo,
                                   npf, blocks, base + so + s0 * vp, d3, do3 + s0 * vp, zt, s0, err, db2,
                                   cmask, nval - s0)
                else:
                    output_full(blocks, base + ao + s0, w2, vp, b2p, hp, blocks, base + blk + ao + pfo,
                                 npf, blocks, base + so + s0 * vp, d3, do3 + s0 * vp, zt, s0, err, db2,
                                 cmask, nval - s0)
            # hidden layer backward: e = δ3 W2ᵀ from the feature-major δ3, then δ2
            do2 = (p - g0) * nh * pw
            for t in range(ht):
                if fold:
                    backward_fold(w2t, hp, t * RH, zt, vp, blocks, base + ao, kv, h, d2, do2, db1, mask, mo)
                else:
                    backward_split(w2t, hp, t * RH, zt, vp, blocks, base + ao, kv, h, d2, do2, db1, mask,
                                    mo)
        # the group's weight gradients: gw2 (hp, vp) += Σ a2 ⊗ δ3, gw1 (nh, vp) += Σ d2 ⊗ x
        fresh = g0 == p_lo
        for c0 in range(0, vp, L * OV):
            for j0 in range(0, hp, OJ):
                outer_tile(blocks, g0 * blk + ao + j0 * pw, blk, d3, c0, pw * vp, vp, g1 - g0,
                            gw2, j0 * vp + c0, vp, fresh)
            for j0 in range(0, nh, OJ):
                outer_tile(d2, j0 * pw, nh * pw, blocks, g0 * blk + so + c0, blk, vp, g1 - g0,
                            gw1, j0 * vp + c0, vp, fresh)


@njit(**JIT)
def _partials_panels(blocks, m, W1, b1, W2, b2, w1, w2, w2t, b1p, b2p, cmask, kv, zt, d3, d2,
                     act, err, db1, db2, mask, group, fold, given, rho, beta, leaf_panels, offsets,
                     res, leaf_act, merges, stack):
    """res[L] = the packed sums over leaf L (panels [L leaf_panels, (L + 1) leaf_panels); one
    leaf of every panel when leaf_panels is 0), each leaf summed alone. ``given``: a2 is in
    the panels, k in kv and each leaf's Σ a2 in leaf_act (from _activations_panels). With
    ``merges`` (one count per leaf; empty: none) the leaves are added in that postfix tree
    while they sit in cache; res[i] = the i-th sum left. (Written out, 160k patches in
    leaves of 128 are 1,250 rows of 4,941 numbers, 49 MB, to be read again for the sum.)

    A leaf's weight-gradient tiles write its sums straight into the top row of ``stack``
    (:func:`padded_width` numbers: the padded layout, its lanes summed at the end), the
    tree adds those rows, and only the sums left are unpadded into ``res``: a leaf costs
    no copy, and the tree adds no zeros of the packed layout. An element's additions are
    those of the packed rows, so the bits are."""
    v, h = W1.shape
    hp, vp = kv.size, b2p.size
    npan = blocks.size // ((2 * vp + hp) * panel_width(blocks))
    # zero-padded weights in the layouts the tiles read
    for j in range(h):
        b1p[j] = b1[j]
    for i in range(v):
        b2p[i] = b2[i]
        for j in range(h):
            w1[i * hp + j] = W1[i, j]
            w2t[i * hp + j] = W2[j, i]
            w2[j * vp + i] = W2[j, i]
    P = dptr
    if res.shape[1] > 1 and res.strides[1] != res.itemsize:
        raise ValueError("sparse_ae_partials: each output row must be contiguous")
    nh = hp if fold else 2 * hp
    if stack.shape[1] != padded_width(v, h, vp, hp, fold):
        raise ValueError("sparse_ae_partials: the stack's rows are not the padded width")
    per = leaf_panels if leaf_panels > 0 else max(npan, 1)
    merging = merges.size > 0
    top = 0
    for leaf in range(merges.size if merging else res.shape[0]):
        for arr in (act, err, db1, db2):  # the weight gradients: the first group's tiles start them
            arr[:] = 0.0
        p_lo = leaf * per
        row = stack[top]
        _sweeps(P(blocks), npan, p_lo, min(p_lo + per, npan), m, v, h, vp, hp, P(w1), P(w2), P(w2t),
                P(b1p), P(b2p), P(cmask), P(kv), P(zt), P(d3), P(d2), P(row), P(row[nh * vp:]), P(act), P(err),
                P(db1), P(db2), P(mask), group, fold, given, rho, beta)
        _lane_sums(P(act), P(err), P(db1), P(db2), v, h, hp, fold, P(row[(nh + hp) * vp:]))
        if given:  # the sums of the first round, so that their total is ρ̂ m bit for bit
            for j in range(h):
                row[(nh + hp) * vp + j] = leaf_act[leaf, j]
        if not merging:
            _unpad(P(row), v, h, vp, hp, fold, offsets, rowptr(res, leaf))
            continue
        top += 1
        for _ in range(merges[leaf]):
            top -= 1
            for c in range(stack.shape[1]):
                stack[top - 1, c] += stack[top, c]
    if merging:
        for i in range(top):
            _unpad(P(stack[i]), v, h, vp, hp, fold, offsets, rowptr(res, i))


@register_jitable
def padded_width(v, h, vp, hp, fold):
    """A leaf's sums in the padded layout: the weight gradients as the tiles write them,
    (δ2 rows, or e·s then s rows) x vp then hp x vp, then act (h), b1 (h), the s sums (h),
    b2 (v) and the error, rounded up to 16 numbers, a whole vector of either precision (so
    that every row of an aligned stack is aligned too)."""
    return -(-(((hp if fold else 2 * hp) + hp) * vp + 3 * h + v + 1) // 16) * 16


@njit(**JIT)
def _activations_panels(blocks, W1, b1, w1, b1p, act, mask, vp, hp, leaf_panels, res, leaf_act):
    """Sweep 1 alone: res[L, :h] = leaf_act[L] = Σ a2 over leaf L (as _partials_panels'
    leaves), a2 left in the panels."""
    v, h = W1.shape
    for j in range(h):
        b1p[j] = b1[j]
    for i in range(v):
        for j in range(h):
            w1[i * hp + j] = W1[i, j]
    P = dptr
    npan = blocks.size // ((2 * vp + hp) * panel_width(blocks))
    per = leaf_panels if leaf_panels > 0 else max(npan, 1)
    for leaf in range(res.shape[0]):
        act[:] = 0.0
        p_lo = leaf * per
        _hidden_sweep(P(blocks), npan, p_lo, min(p_lo + per, npan), vp, hp, P(w1), P(b1p), P(act), P(mask), h)
        for j in range(h):
            s = vhsum(vload(act, j * lanes(act)))
            res[leaf, j] = s
            leaf_act[leaf, j] = s


@njit(**JIT)
def _transpose_into(src, ld, rows, res, ro, ldr, cols, so):
    """res[ro + i·ldr + j] = src[so + j·ld + i] for j < rows, i < cols (blocks of 8 rows of
    src, one vector each, transposed in registers: several times faster than the scalar
    loop)."""
    L = lanes(src)
    j8 = rows - rows % 8
    for i0 in range(0, cols - cols % L, L):
        for j0 in range(0, j8, 8):
            b = so + j0 * ld + i0
            store_transposed(res, ro + i0 * ldr + j0, ldr, vload(src, b), vload(src, b + ld),
                             vload(src, b + 2 * ld), vload(src, b + 3 * ld), vload(src, b + 4 * ld),
                             vload(src, b + 5 * ld), vload(src, b + 6 * ld), vload(src, b + 7 * ld))
    for i in range(cols):
        for j in range(j8 if i < cols - cols % L else 0, rows):
            res[ro + i * ldr + j] = src[so + j * ld + i]


@njit(**JIT)
def _lane_sums(act, err, db1, db2, v, h, hp, fold, tail):
    """A leaf's per-lane and per-column accumulators summed into the padded row's tail
    (act, b1, the s sums, b2, the error: see :func:`padded_width`)."""
    L = lanes(act)
    for j in range(h):
        tail[j] = vhsum(vload(act, j * L))
        tail[h + j] = vhsum(vload(db1, j * L))
        tail[2 * h + j] = 0.0 if fold else vhsum(vload(db1, (hp + j) * L))
    total = 0.0
    for i in range(v):
        tail[3 * h + i] = db2[i]
        total += err[i]
    tail[3 * h + v] = total


@njit(**JIT)
def _unpad(row, v, h, vp, hp, fold, offsets, res):
    """A padded row (see :func:`padded_width`) -> one packed partials vector (``offsets``:
    the reference layout's w1, b1, w2, b2, act, err)."""
    o_w1, o_b1, o_w2, o_b2, o_act, o_err = offsets
    nh = hp if fold else 2 * hp
    _transpose_into(row, vp, h, res, o_w1, 2 * h, v, 0)
    if fold:
        for i in range(v):
            for j in range(h):
                res[o_w1 + i * 2 * h + h + j] = 0.0
    else:
        _transpose_into(row, vp, h, res, o_w1 + h, 2 * h, v, hp * vp)
    L = lanes(row)
    v8 = v - v % L
    g2 = nh * vp
    for j in range(h):  # explicit vectors: several times faster than the scalar loop
        for i in range(0, v8, L):
            vstore(res, o_w2 + j * v + i, vload(row, g2 + j * vp + i))
        for i in range(v8, v):
            res[o_w2 + j * v + i] = row[g2 + j * vp + i]
    t = g2 + hp * vp
    for j in range(h):
        res[o_act + j] = row[t + j]
        res[o_b1 + j] = row[t + h + j]
        res[o_b1 + h + j] = row[t + 2 * h + j]
    for i in range(v):
        res[o_b2 + i] = row[t + 3 * h + i]
    res[o_err] = row[t + 3 * h + v]
