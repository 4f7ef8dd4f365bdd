"""Sparse autoencoder partials and assembly, fused for the CPU (Numba).

Same names, layout and results as :mod:`aepar.kernels.ref.sparse_ae` (read its docstring
for the formulation). Two implementations behind one entry point:

float64: register-tiled SIMD kernels, no BLAS. The five products have a 25- or 64-wide
side, where OpenBLAS stays well below its own DGEMM rate, and element-wise passes between
them would stream the (m, ·) arrays through memory again; these kernels keep both in
registers and cache and take clearly less time per evaluation. The design:

- Explicit 8-lane vectors (:mod:`.simd`), so that register tiles stay in registers: the
  tile kernels (:mod:`.sparse_tiles`) are generated source with one variable per
  accumulator, in shapes chosen for the target's register file (AVX-512 or AVX2).
- The workspace packs x once (until x changes) into *panels* of PW samples (32 on
  AVX-512, 16 on AVX2). Per
  panel one contiguous block holds x feature-major (v, PW), a2 (h, PW) and x
  sample-major (PW, v): the next block is prefetched while this one is worked on.
- Each product's element-wise epilogue runs on its accumulators, in registers:
  x W1 (lanes = samples, weights broadcast, RH hidden units × PW): σ and the ρ̂ sums;
  a2 W2 (lanes = visible units, a2 broadcast, 8 samples × 8 TB units): σ, the error, δ3
  sample-major, its sums, and δ3 transposed in registers into a feature-major panel;
  δ3 W2ᵀ (like x W1): δ2 = (e + k)(a2 − a2²) and its sums.
- a2ᵀ δ3 and xᵀ δ2, per group of panels: sums over samples of a broadcast (a2 or δ2 of
  a sample) times a sample-major row (δ3 or x), tiles of OJ hidden × 8 OV visible units.

With ``kl=(rho, beta)`` a first sweep computes a2 of every panel and ρ̂ (one shard = all
samples), the second folds k into δ2 (five products; no Q = xᵀs); without it one sweep
does everything and adds Q and Σs. :func:`sparse_ae_activations` is that first sweep
alone, per leaf, and leaves a2 in the workspace: ``sparse_ae_partials(..., rho_hat=ρ̂)``
then runs only the second (the two rounds of the reference's docstring). Biases start
the accumulators. Rows and columns are padded to the tile sizes with zero weights,
padding lanes are masked out of every sum; every sum has a fixed order, so results are
deterministic, and they agree with the reference to rounding (not bit for bit across
ISAs: the panel width changes the order of the per-lane sums). Such kernels are bound by
instruction throughput: in the element-wise epilogues, by the sigmoid's ~20 vector
operations per 8 values (its division runs beside them: a reciprocal and Newton steps
instead took as long).

Other dtypes: the BLAS path (np.dot on 256-row blocks with fused element-wise passes).

The sigmoid is :func:`.nbmath.sigmoid64` (one division and ~12 FMAs, vectorised), the KL
term's gradient and value come from :mod:`.sparsity`, and the packed offsets from
``sparse_ae_layout``. Sums are accumulated in float64. All scratch memory lives in a :class:`SparseAEWorkspace` made
once per model; an evaluation allocates nothing of size m.
"""
from __future__ import annotations

import functools

import numpy as np
from numba import njit

from ..memory import zeros
from ..ref.sparse_ae import (leaf_rows, merge_plan, merge_rows, sparse_ae_layout, sparse_ae_partials_size,
                             sparse_ae_theta_layout, sparse_ae_theta_size)
from .nbmath import sigmoid64
from .simd import JIT, LANES, dptr, rowptr, store_transposed, vhsum, vload, vstore
from .sparse_tiles import (OJ, OV, PW, RH, SB, TB, backward_fold, backward_split, hidden_tile, outer_tile,
                           output_full, output_masked)
from .sparsity import kl_grad_into, kl_sum

__all__ = ["sparse_ae_layout", "sparse_ae_partials_size", "sparse_ae_theta_layout",
           "sparse_ae_theta_size", "sparse_ae_workspace", "sparse_ae_activations",
           "sparse_ae_partials", "sparse_ae_assemble", "SparseAEWorkspace"]

DEFAULT_BLOCK = 256
_NO_MERGES = np.empty(0, np.int64)
_NO_MERGES.setflags(write=False)  # the type merge_plan's arrays have: one compiled signature
DEFAULT_GROUP = 64          # samples per group: the gradients' operands stay in L1/L2


# ---------------------------------------------------------------------------- BLAS path
@njit(**JIT)
def _hidden_forward(a2, b1, act):
    """a2 holds x W1 on entry: a2 = σ(a2 + b1) in place, act += column sums."""
    for i in range(a2.shape[0]):
        for j in range(a2.shape[1]):
            a = sigmoid64(np.float64(a2[i, j]) + b1[j])
            a2[i, j] = a
            act[j] += a


@njit(**JIT)
def _output_delta(z3, b2, x, db2, err):
    """z3 holds a2 W2 on entry: a3 = σ(z3 + b2); z3 = δ3 = (a3 − x) a3 (1 − a3) in place;
    db2 += Σ δ3, err += Σ (a3 − x)² (per column, so the loop vectorises exactly)."""
    for i in range(z3.shape[0]):
        for j in range(z3.shape[1]):
            a = sigmoid64(np.float64(z3[i, j]) + b2[j])
            d = a - x[i, j]
            err[j] += d * d
            d3 = d * a * (1.0 - a)
            z3[i, j] = d3
            db2[j] += d3


@njit(**JIT)
def _hidden_delta_folded(e, a2, k, db1):
    """e holds δ3 W2ᵀ on entry: e = δ2 = (e + k) ⊙ a2 (1 − a2) in place; db1 += Σ δ2."""
    for i in range(e.shape[0]):
        for j in range(e.shape[1]):
            a = np.float64(a2[i, j])
            d2 = (e[i, j] + k[j]) * a * (1.0 - a)
            e[i, j] = d2
            db1[j] += d2


@njit(**JIT)
def _hidden_delta_split(e, a2, g, db1):
    """g[:, :h] = e ⊙ s, g[:, h:] = s with s = a2 (1 − a2); db1 += their column sums."""
    h = e.shape[1]
    for i in range(e.shape[0]):
        for j in range(h):
            a = np.float64(a2[i, j])
            s = a * (1.0 - a)
            es = e[i, j] * s
            g[i, j] = es
            g[i, h + j] = s
            db1[j] += es
            db1[h + j] += s


@njit(**JIT)
def _activations_blas(x, W1, b1, a2, act, block):
    """a2 = σ(x W1 + b1) block by block, act = Σ a2 (the sums of _partials_blas)."""
    act[:] = 0.0
    for i0 in range(0, x.shape[0], block):
        i1 = min(i0 + block, x.shape[0])
        np.dot(x[i0:i1], W1, a2[i0:i1])
        _hidden_forward(a2[i0:i1], b1, act)


@njit(**JIT)
def _partials_blas(x, W1, b1, W2, b2, W2t, a2, z3, e, g, t_vh, t_v2h, t_hv,
                   acc_w1, acc_b1, acc_w2, acc_b2, acc_act, acc_err, block, fold, k, given, rho, beta):
    """The shard's sums; with ``fold`` k folded into δ2: made from this shard's ρ̂, or
    ``given`` (the global ρ̂'s, in k on entry)."""
    m, h = x.shape[0], W1.shape[1]
    acc_w1[:] = 0.0
    acc_b1[:] = 0.0
    acc_w2[:] = 0.0
    acc_b2[:] = 0.0
    acc_err[:] = 0.0
    W2t[:] = W2.T  # a contiguous copy: BLAS is slower on this product with W2.T's view
    # pass 1: hidden activations of every sample (and ρ̂, hence k, unless given)
    _activations_blas(x, W1, b1, a2, acc_act, block)
    if fold and not given:
        kl_grad_into(acc_act / m, rho, beta, k)
    for i0 in range(0, m, block):
        i1 = min(i0 + block, m)
        nb = i1 - i0
        xb = x[i0:i1]
        ab = a2[i0:i1]
        zb = z3[:nb]
        np.dot(ab, W2, zb)
        _output_delta(zb, b2, xb, acc_b2, acc_err)
        np.dot(ab.T, zb, t_hv)
        acc_w2 += t_hv
        eb = e[:nb]
        np.dot(zb, W2t, eb)
        if fold:
            _hidden_delta_folded(eb, ab, k, acc_b1)
            np.dot(xb.T, eb, t_vh)
            acc_w1[:, :h] += t_vh
        else:
            gb = g[:nb]
            _hidden_delta_split(eb, ab, gb, acc_b1)
            np.dot(xb.T, gb, t_v2h)
            acc_w1 += t_v2h


# ---------------------------------------------------------------------------- SIMD path
@njit(**JIT)
def _pack_panels(x, blocks, vp, hp):
    """x into the panel blocks (both layouts), zero padding; a2 rows zeroed."""
    m, v = x.shape
    blk = (2 * vp + hp) * PW
    so = (vp + hp) * PW
    blocks[:] = 0.0
    for s in range(m):
        base = (s // PW) * blk
        l = s % PW
        for i in range(v):
            blocks[base + i * PW + l] = x[s, i]
            blocks[base + so + l * vp + i] = x[s, i]


@njit(**JIT, inline="always")
def _tile_prefetch(t, per, lines):
    """(offset, line pairs) of the next block's lines that call t prefetches, per lines
    (an even number) to a call."""
    lo = min(t * per, lines)
    return lo * LANES, (min(lo + per, lines) - lo + 1) >> 1


@njit(**JIT)
def _hidden_sweep(blocks, npan, p_lo, p_hi, vp, hp, w1, b1p, act, mask, h):
    """Sweep 1 over panels [p_lo, p_hi): a2 into each panel's block, its lanes' sums into
    act (raw pointers), x and a2 of the next block prefetched over the x W1 tiles."""
    ao, so = vp * PW, (vp + hp) * PW
    blk = so + PW * vp
    ht = hp // RH
    per1 = -(-so // (LANES * 2 * ht)) * 2
    for p in range(p_lo, p_hi):
        base = p * blk
        lines = so // LANES if p + 1 < npan else 0
        for t in range(ht):
            pfo, npf = _tile_prefetch(t, per1, lines)
            hidden_tile(w1, hp, t * RH, b1p, blocks, base, vp, blocks, base + ao,
                        blocks, base + blk + pfo, npf, h, act, mask, PW if p == npan - 1 else 0)


@njit(**JIT)
def _sweeps(blocks, npan, p_lo, p_hi, m, v, h, vp, hp, w1, w2, w2t, b1p, b2p, cmask, kv, zt, d3, d2,
            gw1, gw2, act, err, db1, db2, mask, group, fold, given, rho, beta):
    """The sweeps over panels [p_lo, p_hi) of the npan packed ones (all arrays as raw
    pointers; see _partials_panels); with ``given`` a2 and k are already in place."""
    ao, so = vp * PW, (vp + hp) * PW       # a2 and sample-major x within a block
    blk = so + PW * vp
    nh = hp if fold else 2 * hp            # rows of d2 panels: δ2, or e·s then s
    ht = hp // RH
    # Cache lines of the next block that each call prefetches (an even number): x
    # feature-major (split) over the x W1 tiles and a2 + x sample-major over the PW / SB
    # output-layer calls in sweep 2.
    per0 = -(-ao // (LANES * 2 * ht)) * 2
    per2 = -(-(blk - ao) // (LANES * 2 * (PW // SB))) * 2
    if fold and not given:
        # sweep 1: a2 of every panel and ρ̂, so that k is known for sweep 2
        _hidden_sweep(blocks, npan, p_lo, p_hi, vp, hp, w1, b1p, act, mask, h)
        rho_hat, k = np.empty(h), np.empty(h)
        for j in range(h):
            rho_hat[j] = vhsum(vload(act, j * LANES)) / m
        kl_grad_into(rho_hat, rho, beta, k)
        for j in range(h):
            kv[j] = k[j]
    for g0 in range(p_lo, p_hi, group):
        g1 = min(g0 + group, p_hi)
        for p in range(g0, g1):
            base = p * blk
            nxt = p + 1 < npan
            last = p == npan - 1
            mo = PW if last else 0
            if not fold:
                lines = ao // LANES if nxt else 0
                for t in range(ht):
                    pfo, npf = _tile_prefetch(t, per0, lines)
                    hidden_tile(w1, hp, t * RH, b1p, blocks, base, vp, blocks, base + ao,
                                 blocks, base + blk + pfo, npf, h, act, mask, mo)
            # output layer, 8 samples at a time (a3, δ3 both ways, sums); meanwhile the
            # next block's a2 and x rows are prefetched
            lines = (blk - ao) // LANES if nxt else 0
            nval = m - p * PW if last else PW
            do3 = (p - g0) * PW * vp
            for s0 in range(0, PW, SB):
                pfo, npf = _tile_prefetch(s0 // SB, per2, lines)
                if nval < PW or vp > v:
                    output_masked(blocks, base + ao + s0, w2, vp, b2p, hp, blocks, base + blk + ao + pfo,
                                   npf, blocks, base + so + s0 * vp, d3, do3 + s0 * vp, zt, s0, err, db2,
                                   cmask, nval - s0)
                else:
                    output_full(blocks, base + ao + s0, w2, vp, b2p, hp, blocks, base + blk + ao + pfo,
                                 npf, blocks, base + so + s0 * vp, d3, do3 + s0 * vp, zt, s0, err, db2,
                                 cmask, nval - s0)
            # hidden layer backward: e = δ3 W2ᵀ from the feature-major δ3, then δ2
            do2 = (p - g0) * nh * PW
            for t in range(ht):
                if fold:
                    backward_fold(w2t, hp, t * RH, zt, vp, blocks, base + ao, kv, h, d2, do2, db1, mask, mo)
                else:
                    backward_split(w2t, hp, t * RH, zt, vp, blocks, base + ao, kv, h, d2, do2, db1, mask,
                                    mo)
        # the group's weight gradients: gw2 (hp, vp) += Σ a2 ⊗ δ3, gw1 (nh, vp) += Σ d2 ⊗ x
        fresh = g0 == p_lo
        for c0 in range(0, vp, LANES * OV):
            for j0 in range(0, hp, OJ):
                outer_tile(blocks, g0 * blk + ao + j0 * PW, blk, d3, c0, PW * vp, vp, g1 - g0,
                            gw2, j0 * vp + c0, vp, fresh)
            for j0 in range(0, nh, OJ):
                outer_tile(d2, j0 * PW, nh * PW, blocks, g0 * blk + so + c0, blk, vp, g1 - g0,
                            gw1, j0 * vp + c0, vp, fresh)


@njit(**JIT)
def _partials_panels(blocks, m, W1, b1, W2, b2, w1, w2, w2t, b1p, b2p, cmask, kv, zt, d3, d2,
                     gw1, gw2, act, err, db1, db2, mask, group, fold, given, rho, beta, leaf_panels, offsets,
                     res, leaf_act, merges, stack):
    """res[L] = the packed sums over leaf L (panels [L leaf_panels, (L + 1) leaf_panels); one
    leaf of every panel when leaf_panels is 0), each leaf summed alone. ``given``: a2 is in
    the panels, k in kv and each leaf's Σ a2 in leaf_act (from _activations_panels). With
    ``merges`` (one count per leaf; empty: none) the leaves go onto ``stack`` instead and
    are added in that postfix tree while they sit in cache; res[i] = the i-th sum left.
    (Written out, 160k patches in leaves of 128 are 1,250 rows of 4,941 numbers, 49 MB,
    to be read again for the sum.)"""
    v, h = W1.shape
    hp, vp = kv.size, b2p.size
    npan = blocks.size // ((2 * vp + hp) * PW)
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
    if res.shape[1] > 1 and res.strides[1] != 8:
        raise ValueError("sparse_ae_partials: each output row must be contiguous")
    per = leaf_panels if leaf_panels > 0 else max(npan, 1)
    merging = merges.size > 0
    top = 0
    for leaf in range(merges.size if merging else res.shape[0]):
        for arr in (act, err, db1, db2):  # gw1, gw2: the first group's tiles start them
            arr[:] = 0.0
        p_lo = leaf * per
        _sweeps(P(blocks), npan, p_lo, min(p_lo + per, npan), m, v, h, vp, hp, P(w1), P(w2), P(w2t),
                P(b1p), P(b2p), P(cmask), P(kv), P(zt), P(d3), P(d2), P(gw1), P(gw2), P(act), P(err),
                P(db1), P(db2), P(mask), group, fold, given, rho, beta)
        dst, row = (stack, top) if merging else (res, leaf)
        _unpad(P(gw1), P(gw2), P(act), P(err), P(db1), P(db2), v, h, vp, hp, fold, offsets, rowptr(dst, row))
        if given:  # the sums of the first round, so that their total is ρ̂ m bit for bit
            for j in range(h):
                dst[row, offsets[4] + j] = leaf_act[leaf, j]
        if not merging:
            continue
        top += 1
        for _ in range(merges[leaf]):
            top -= 1
            for c in range(stack.shape[1]):
                stack[top - 1, c] += stack[top, c]
    if merging:
        for i in range(top):
            for c in range(res.shape[1]):
                res[i, c] = stack[i, c]


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
    npan = blocks.size // ((2 * vp + hp) * PW)
    per = leaf_panels if leaf_panels > 0 else max(npan, 1)
    for leaf in range(res.shape[0]):
        act[:] = 0.0
        p_lo = leaf * per
        _hidden_sweep(P(blocks), npan, p_lo, min(p_lo + per, npan), vp, hp, P(w1), P(b1p), P(act), P(mask), h)
        for j in range(h):
            s = vhsum(vload(act, j * LANES))
            res[leaf, j] = s
            leaf_act[leaf, j] = s


@njit(**JIT)
def _transpose_into(src, ld, rows, res, ro, ldr, cols, so):
    """res[ro + i·ldr + j] = src[so + j·ld + i] for j < rows, i < cols (8 × 8 blocks
    transposed in registers: several times faster than the scalar loop)."""
    j8 = rows - rows % LANES
    for i0 in range(0, cols - cols % LANES, LANES):
        for j0 in range(0, j8, LANES):
            b = so + j0 * ld + i0
            store_transposed(res, ro + i0 * ldr + j0, ldr, vload(src, b), vload(src, b + ld),
                             vload(src, b + 2 * ld), vload(src, b + 3 * ld), vload(src, b + 4 * ld),
                             vload(src, b + 5 * ld), vload(src, b + 6 * ld), vload(src, b + 7 * ld))
    for i in range(cols):
        for j in range(j8 if i < cols - cols % LANES else 0, rows):
            res[ro + i * ldr + j] = src[so + j * ld + i]


@njit(**JIT)
def _unpad(gw1, gw2, act, err, db1, db2, v, h, vp, hp, fold, offsets, res):
    """The padded accumulators -> one packed partials vector (``offsets``: the
    reference layout's w1, b1, w2, b2, act, err)."""
    o_w1, o_b1, o_w2, o_b2, o_act, o_err = offsets
    _transpose_into(gw1, vp, h, res, o_w1, 2 * h, v, 0)
    if fold:
        for i in range(v):
            for j in range(h):
                res[o_w1 + i * 2 * h + h + j] = 0.0
    else:
        _transpose_into(gw1, vp, h, res, o_w1 + h, 2 * h, v, hp * vp)
    v8 = v - v % LANES
    for j in range(h):  # explicit vectors: several times faster than the scalar loop
        for i in range(0, v8, LANES):
            vstore(res, o_w2 + j * v + i, vload(gw2, j * vp + i))
        for i in range(v8, v):
            res[o_w2 + j * v + i] = gw2[j * vp + i]
    for j in range(h):
        res[o_b1 + j] = vhsum(vload(db1, j * LANES))
        res[o_b1 + h + j] = 0.0 if fold else vhsum(vload(db1, (hp + j) * LANES))
        res[o_act + j] = vhsum(vload(act, j * LANES))
    total = 0.0
    for i in range(v):
        res[o_b2 + i] = db2[i]
        total += err[i]
    res[o_err] = total


@functools.lru_cache(maxsize=16)  # made once per shape: every evaluation asks twice
def _offsets(v, h):
    """The packed partials' offsets in the order w1, b1, w2, b2, act, err."""
    layout = sparse_ae_layout(v, h)
    return _frozen([layout[name][0] for name in ("w1", "b1", "w2", "b2", "act", "err")])


@functools.lru_cache(maxsize=16)
def _theta_offsets(v, h):
    layout = sparse_ae_theta_layout(v, h)
    return _frozen([layout[name][0] for name in ("W1", "W2", "b1", "b2")])


def _frozen(offsets):
    """A read-only int64 array: the cached offsets are shared by every call."""
    a = np.array(offsets, np.int64)
    a.setflags(write=False)
    return a


def _round_up(n, k):
    return -(-n // k) * k


class SparseAEWorkspace:
    """Scratch arrays for :func:`sparse_ae_partials` on ``m`` samples, made once per model.

    float64: x packed into panel blocks (kept until a different or changed x comes) with
    every panel's hidden activations, one group's δ3/δ2, the accumulators and padded
    weights; ``block`` is the group size in samples (default 64). Other dtypes: the
    shard's hidden activations (m, h) and per-block buffers of ``block`` rows (256).
    """

    def __init__(self, m: int, visible: int, hidden: int, dtype=np.float64, block: int | None = None,
                 leaf: int | None = None):
        dtype = np.dtype(dtype)
        v, h = int(visible), int(hidden)
        self.m, self.visible, self.hidden, self.dtype = int(m), v, h, dtype
        self.leaf = None if leaf is None else int(leaf)
        if self.leaf is not None and dtype == np.float64 and self.leaf % PW:
            raise ValueError(f"leaf of {self.leaf} samples: the float64 kernel needs a multiple of {PW}")
        self.simd = dtype == np.float64
        self.acc = zeros(sparse_ae_partials_size(v, h))
        layout = sparse_ae_layout(v, h)
        self.views = {name: self.acc[o:o + int(np.prod(s))].reshape(s) for name, (o, s) in layout.items()}
        if self.simd:
            self._init_panels(block)
        else:
            self._init_blocks(block)

    def _init_panels(self, block):
        v, h = self.visible, self.hidden
        vp = _round_up(v, LANES * np.lcm(TB, OV))
        hp = _round_up(h, np.lcm(RH, OJ))
        npan = -(-self.m // PW)
        self.block = int(self.leaf or block or DEFAULT_GROUP)  # a leaf is one group
        self.group = max(1, -(-self.block // PW))
        g = min(self.group, max(npan, 1))
        z = zeros
        self.blocks = z(npan * (2 * vp + hp) * PW)
        self.zt = z(vp * PW)
        self.d3, self.d2 = z(g * PW * vp), z(g * 2 * hp * PW)
        self.gw1, self.gw2 = z(2 * hp * vp), z(hp * vp)
        self.act, self.db1 = z(hp * LANES), z(2 * hp * LANES)
        self.err, self.db2 = z(vp), z(vp)
        self.w1, self.w2, self.w2t = z(vp * hp), z(hp * vp), z(vp * hp)
        self.b1p, self.b2p, self.kv = z(hp), z(vp), z(hp)
        self.cmask = z(vp)
        self.cmask[:v] = 1.0
        self.mask = z(2 * PW)  # lanes of a full panel, then of the last panel
        self.mask[:PW + (self.m - (npan - 1) * PW if npan else PW)] = 1.0
        self.vp, self.hp = vp, hp
        self._packed = None  # (x, its fingerprint) last packed
        # each leaf's Σ a2 from sparse_ae_activations, and the (W1, b1) its a2 in the
        # panels belong to (None: the panels hold no current a2)
        self.leaf_act = np.zeros((max(1, -(-self.m // (self.leaf or max(self.m, 1)))), h))
        self._hidden = None
        self.no_stack = np.zeros((1, 1))
        self._stack = self.no_stack

    def merge_stack(self, depth, width):
        """A (depth, width) float64 stack for the leaves' tree (kept for the next call)."""
        if self._stack.shape[0] < depth or self._stack.shape[1] != width:
            self._stack = zeros((max(depth, 1), width))
        return self._stack[:max(depth, 1)]

    def _init_blocks(self, block):
        v, h, dtype = self.visible, self.hidden, self.dtype
        self.block = int(block or DEFAULT_BLOCK)
        rows = max(1, min(self.block, self.m))
        self.a2 = np.empty((max(self.m, 1), h), dtype)
        self.z3 = np.empty((rows, v), dtype)
        self.e = np.empty((rows, h), dtype)
        self.g = np.empty((rows, 2 * h), dtype)
        self.t_vh = np.empty((v, h), dtype)
        self.t_v2h = np.empty((v, 2 * h), dtype)
        self.t_hv = np.empty((h, v), dtype)
        self.W2t = np.empty((v, h), dtype)
        self.acc_err = np.zeros(v)  # per-column squared error, summed at the end

    def fits(self, x, W1, leaf=None) -> bool:
        return (x.shape[0] == self.m and W1.shape == (self.visible, self.hidden) and x.dtype == self.dtype
                and (leaf is None or self.leaf == int(leaf)))

    @staticmethod
    def _fingerprint(x):
        flat = x.reshape(-1)
        return flat[::max(1, flat.size // 61)].copy()

    def pack(self, x):
        """Pack ``x`` into the panels unless it is the array packed last time, unchanged
        (same object and the same values at ~64 spread-out places)."""
        if self._packed is not None and self._packed[0] is x \
                and np.array_equal(self._packed[1], self._fingerprint(x)):
            return
        _pack_panels(x, self.blocks, self.vp, self.hp)
        self._packed = (x, self._fingerprint(x))
        self._hidden = None

    def holds_hidden(self, W1, b1) -> bool:
        """Whether the panels hold a2 at this (W1, b1) (and the x packed last)."""
        return (self._hidden is not None and np.array_equal(self._hidden[0], W1)
                and np.array_equal(self._hidden[1], b1))


def sparse_ae_workspace(m: int, visible: int, hidden: int, dtype=np.float64, block: int | None = None,
                        leaf: int | None = None):
    """A :class:`SparseAEWorkspace` for ``m`` samples of a ``visible``-``hidden`` model
    (``leaf``: the samples per leaf the partials will be asked for, a multiple of 32 in
    float64)."""
    return SparseAEWorkspace(m, visible, hidden, dtype, block, leaf)


def sparse_ae_activations(x, W1, b1, out, ws=None, leaf=None):
    """Σ a2 over the shard, or per leaf into the rows of ``out`` (see the reference);
    returns ``out``. In float64 a2 stays in ``ws`` for ``sparse_ae_partials(...,
    rho_hat=...)`` at the same x, W1 and b1."""
    v, h = W1.shape
    m = x.shape[0]
    rows = out.reshape(1, -1) if leaf is None else leaf_rows(m, out, None, leaf)
    if rows.shape[1] != h:
        raise ValueError(f"sparse_ae_activations: out needs {h} columns, got {rows.shape[1]}")
    if ws is None or not ws.fits(x, W1, leaf):
        ws = SparseAEWorkspace(m, v, h, x.dtype, leaf=leaf)
    c = np.ascontiguousarray
    W1, b1 = c(W1), c(b1)
    if ws.simd:
        x = c(x)
        ws.pack(x)
        _activations_panels(ws.blocks, W1, b1, ws.w1, ws.b1p, ws.act, ws.mask, ws.vp, ws.hp,
                            0 if leaf is None else int(leaf) // PW, rows, ws.leaf_act)
        ws._hidden = (W1.copy(), b1.copy())
        return out
    step = max(m if leaf is None else int(leaf), 1)
    act = np.empty(h)
    for i, i0 in enumerate(range(0, max(m, 1), step)):
        _activations_blas(c(x[i0:i0 + step]), W1, b1, ws.a2, act, ws.block)
        rows[i] = act
    return out


def sparse_ae_partials(x, W1, b1, W2, b2, out, ws=None, kl=None, leaf=None, rho_hat=None, merges=None):
    """Fill ``out`` with this shard's packed sums (see the reference); returns ``out``.

    ``ws`` should be a workspace made once for this shard (one is made per call if not,
    which allocates); ``kl=(rho, beta)`` folds the KL term, with ``rho_hat`` (ρ̂ over every
    shard) or when the shard holds all samples. With ``leaf``, ``out`` is (ceil(m / leaf),
    size) and row L holds the sums over samples [L leaf, (L + 1) leaf) alone. In float64
    the workspace keeps x packed between calls: pass the same array again, or a new one
    (an array changed in place is noticed only at the ~64 places it samples); with
    ``rho_hat`` it uses the a2 that :func:`sparse_ae_activations` left there (made again
    if it was not at these x, W1, b1). ``merges``: the leaves added up as they come (see
    the reference), in float64 on a small stack in the workspace.
    """
    v, h = W1.shape
    m = x.shape[0]
    rows = _check_leaves(m, out, kl, leaf, rho_hat, merges)
    if ws is None or not ws.fits(x, W1, leaf):
        ws = SparseAEWorkspace(m, v, h, x.dtype, leaf=leaf)
    c = np.ascontiguousarray
    fold, given = kl is not None, rho_hat is not None
    rho, beta = (float(kl[0]), float(kl[1])) if fold else (0.0, 0.0)
    k = np.zeros(h)
    if fold and given:
        kl_grad_into(c(rho_hat, dtype=np.float64), rho, beta, k)
    if ws.simd:
        x = c(x)
        ws.pack(x)
        if given and not ws.holds_hidden(W1, b1):  # one activation row per leaf
            sparse_ae_activations(x, W1, b1, np.empty((1 if leaf is None else len(ws.leaf_act), h)), ws, leaf)
        ws.kv[:h] = k
        order, stack = _NO_MERGES, ws.no_stack
        if merges is not None:
            depth, _, order = merge_plan(tuple(merges))
            stack = ws.merge_stack(depth, rows.shape[1])
        _partials_panels(ws.blocks, m, c(W1), c(b1), c(W2), c(b2), ws.w1, ws.w2, ws.w2t,
                         ws.b1p, ws.b2p, ws.cmask, ws.kv, ws.zt, ws.d3, ws.d2,
                         ws.gw1, ws.gw2, ws.act, ws.err, ws.db1, ws.db2, ws.mask, ws.group, fold, fold and given,
                         rho, beta, 0 if leaf is None else int(leaf) // PW, _offsets(v, h), rows, ws.leaf_act,
                         order, stack)
    elif merges is not None:  # each leaf into a row of its own, then the tree
        each = np.empty((len(merges), rows.shape[1]), rows.dtype)
        sparse_ae_partials(x, W1, b1, W2, b2, each, ws, kl, leaf, rho_hat)
        merge_rows(each, merges, rows)
    else:
        V = ws.views
        step = m if leaf is None else int(leaf)
        for i, i0 in enumerate(range(0, max(m, 1), max(step, 1))):
            i1 = min(i0 + step, m)
            _partials_blas(c(x[i0:i1]), c(W1), c(b1), c(W2), c(b2), ws.W2t, ws.a2, ws.z3, ws.e, ws.g,
                           ws.t_vh, ws.t_v2h, ws.t_hv, V["w1"], V["b1"], V["w2"], V["b2"], V["act"],
                           ws.acc_err, ws.block, fold, k.copy(), fold and given, rho, beta)
            V["err"][0] = ws.acc_err.sum()
            rows[i] = ws.acc
    return out


def _check_leaves(m, out, kl, leaf, rho_hat=None, merges=None):
    """``out`` as rows (one per leaf or node; a 1-row view without ``leaf``), checked."""
    if leaf is None and merges is not None:
        raise ValueError("merges add leaves: give leaf too")
    return out.reshape(1, -1) if leaf is None else leaf_rows(m, out, kl, leaf, rho_hat, merges)


@njit(**JIT)
def _assemble(p, W1, W2, m, rho, beta, lam, offsets, theta_offsets, grad):
    """``offsets``: the partials' w1, b1, w2, b2, act, err; ``theta_offsets``: θ's W1, W2,
    b1, b2 (the reference's layouts)."""
    v, h = W1.shape
    o_w1, o_b1, o_w2, o_b2, o_act, o_err = offsets
    t_w1, t_w2, t_b1, t_b2 = theta_offsets
    rho_hat = p[o_act:o_act + h] / m
    k = np.empty(h)
    kl_grad_into(rho_hat, rho, beta, k)
    decay = 0.0
    for i in range(v):
        for j in range(h):
            w1 = W1[i, j]
            w2 = W2[j, i]
            decay += w1 * w1 + w2 * w2
            grad[t_w1 + i * h + j] = (p[o_w1 + i * 2 * h + j] + p[o_w1 + i * 2 * h + h + j] * k[j]) / m + lam * w1
    for j in range(h):
        for i in range(v):
            grad[t_w2 + j * v + i] = p[o_w2 + j * v + i] / m + lam * W2[j, i]
        grad[t_b1 + j] = (p[o_b1 + j] + k[j] * p[o_b1 + h + j]) / m
    for i in range(v):
        grad[t_b2 + i] = p[o_b2 + i] / m
    return p[o_err] / (2.0 * m) + 0.5 * lam * decay + kl_sum(rho_hat, rho, beta)


def sparse_ae_assemble(partials, W1, W2, m, rho, beta, lam, grad=None):
    """Cost and float64 gradient from the summed partials (see the reference)."""
    v, h = W1.shape
    if grad is None:
        grad = np.empty(sparse_ae_theta_size(v, h))
    p = np.ascontiguousarray(partials, dtype=np.float64)
    cost = _assemble(p, np.ascontiguousarray(W1, dtype=np.float64),
                     np.ascontiguousarray(W2, dtype=np.float64), float(m), float(rho), float(beta),
                     float(lam), _offsets(v, h), _theta_offsets(v, h), grad)
    return float(cost), grad
