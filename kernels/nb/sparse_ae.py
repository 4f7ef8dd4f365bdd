"""Sparse autoencoder partials and assembly, fused for the CPU (Numba).

Same names, layout and results as :mod:`aepar.kernels.ref.sparse_ae` (read its docstring
for the formulation). Two implementations behind one entry point:

SIMD (float64; float32 in leaves, as the model asks for them): register-tiled kernels, no
BLAS, one source for both precisions. The five products have a 25- or 64-wide
side, where OpenBLAS stays well below its own DGEMM rate, and element-wise passes between
them would stream the (m, ·) arrays through memory again; these kernels keep both in
registers and cache and take clearly less time per evaluation. The design (the sweeps
are in :mod:`.sparse_ae_panels`):

- Explicit vectors, 8 float64 or 16 float32 lanes (:mod:`.simd`), so that register tiles
  stay in registers: the tile kernels (:mod:`.sparse_tiles`) are generated source with
  one variable per accumulator, in shapes chosen for the target's register file (AVX-512
  or AVX2).
- The workspace packs x once (until x changes) into *panels* of PW samples (float64: 32
  on AVX-512, 8 on AVX2; float32: 32 and 16). Per panel one contiguous block holds x
  feature-major (v, PW), a2 (h, PW) and x sample-major (PW, v): the next block is
  prefetched while this one is worked on.
- Each product's element-wise epilogue runs on its accumulators, in registers:
  x W1 (lanes = samples, weights broadcast, RH hidden units × PW): σ and the ρ̂ sums;
  a2 W2 (lanes = visible units, a2 broadcast, 8 samples × TB vectors of units): σ, the error, δ3
  sample-major, its sums, and δ3 transposed in registers into a feature-major panel;
  δ3 W2ᵀ (like x W1): δ2 = (e + k)(a2 − a2²) and its sums.
- a2ᵀ δ3 and xᵀ δ2, per group of panels: sums over samples of a broadcast (a2 or δ2 of
  a sample) times a sample-major row (δ3 or x), tiles of OJ hidden units × OV vectors of visible units.

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
instead took as long). In float32 every sum of a leaf is float32 (as a float32 GEMM's),
and the leaves are added in float32 in the fixed tree, as rows of the model's precision
are everywhere else.

Float32 without leaves, or in leaves that are not whole panels: the BLAS path (np.dot on
256-row blocks with fused element-wise passes, the blocks' sums added in float64).

The sigmoid is :func:`.nbmath.sigmoid64` or :func:`.nbmath.sigmoid32` (vectorised), the KL
term's gradient and value come from :mod:`.sparsity`, and the packed offsets from
``sparse_ae_layout``. All scratch memory lives in a :class:`SparseAEWorkspace` made
once per model; an evaluation allocates nothing of size m.
"""
from __future__ import annotations

import functools

import numpy as np
from numba import njit

from ..memory import zeros
from ..ref import sparse_ae as _ref
from ..ref.sparse_ae import (check_shapes, leaf_rows, merge_plan, merge_rows, sparse_ae_layout,
                             sparse_ae_partials_size, sparse_ae_theta_layout, sparse_ae_theta_size)
from .nbmath import sigmoid64
from .simd import JIT
from .sparse_ae_panels import _activations_panels, _pack_panels, _partials_panels, padded_width
from .sparse_tiles import OJ, OV, RH, TB, panel_samples
from .sparsity import kl_grad_into, kl_sum
from .team import finish, forget, shared, wait_for_work

__all__ = ["sparse_ae_layout", "sparse_ae_partials_size", "sparse_ae_theta_layout",
           "sparse_ae_theta_size", "sparse_ae_workspace", "sparse_ae_activations",
           "sparse_ae_partials", "sparse_ae_assemble", "SparseAEWorkspace", "sparse_ae_shards"]

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

    SIMD (float64, or float32 with a ``leaf`` of whole panels): x packed into panel
    blocks (kept until a different or changed x comes) with every panel's hidden
    activations, one group's δ3/δ2, the accumulators, padded weights and the stack the
    leaves' sums are written onto (:meth:`leaf_stack`), all of x's precision; ``block`` is
    the group size in samples (default 64; a leaf is one group). Otherwise: the shard's
    hidden activations (m, h) and per-block buffers of ``block`` rows (256).
    """

    def __init__(self, m: int, visible: int, hidden: int, dtype=np.float64, block: int | None = None,
                 leaf: int | None = None):
        dtype = np.dtype(dtype)
        v, h = int(visible), int(hidden)
        self.m, self.visible, self.hidden, self.dtype = int(m), v, h, dtype
        self.leaf = None if leaf is None else int(leaf)
        pw = panel_samples(dtype)
        if self.leaf is not None and dtype == np.float64 and self.leaf % pw:
            raise ValueError(f"leaf of {self.leaf} samples: the float64 kernel needs a multiple of {pw}")
        self.simd = dtype == np.float64 or (dtype == np.float32 and self.leaf is not None and self.leaf % pw == 0)
        self.leaf_panels = (self.leaf or 0) // pw  # the SIMD kernels' panels a leaf
        self.acc = zeros(sparse_ae_partials_size(v, h))
        layout = sparse_ae_layout(v, h)
        self.views = {name: self.acc[o:o + int(np.prod(s))].reshape(s) for name, (o, s) in layout.items()}
        if self.simd:
            self._init_panels(block)
        else:
            self._init_blocks(block)

    def _init_panels(self, block):
        v, h, pw = self.visible, self.hidden, panel_samples(self.dtype)
        lanes = 64 // self.dtype.itemsize  # a vector's numbers (64 bytes): 8 float64, 16 float32
        vp = _round_up(v, lanes * np.lcm(TB, OV))
        hp = _round_up(h, np.lcm(RH, OJ))
        npan = -(-self.m // pw)
        self.block = int(self.leaf or block or DEFAULT_GROUP)  # a leaf is one group
        self.group = max(1, -(-self.block // pw))
        g = min(self.group, max(npan, 1))

        def z(n):
            return zeros(n, self.dtype)
        self.blocks = z(npan * (2 * vp + hp) * pw)
        self.zt = z(vp * pw)
        self.d3, self.d2 = z(g * pw * vp), z(g * 2 * hp * pw)
        self.act, self.db1 = z(hp * lanes), z(2 * hp * lanes)
        self.err, self.db2 = z(vp), z(vp)
        self.w1, self.w2, self.w2t = z(vp * hp), z(hp * vp), z(vp * hp)
        self.b1p, self.b2p, self.kv = z(hp), z(vp), z(hp)
        self.cmask = z(vp)
        self.cmask[:v] = 1.0
        self.mask = z(2 * pw)  # lanes of a full panel, then of the last panel
        self.mask[:pw + (self.m - (npan - 1) * pw if npan else pw)] = 1.0
        self.vp, self.hp = vp, hp
        self._packed, self._samples = None, None  # the x packed last, and its values at ~64 places
        # each leaf's Σ a2 from sparse_ae_activations, and the (W1, b1) its a2 in the
        # panels belong to (_hidden False: the panels hold no current a2)
        self.leaf_act = np.zeros((max(1, -(-self.m // (self.leaf or max(self.m, 1)))), h))
        self._hidden = False
        self._hidden_w1, self._hidden_b1 = np.empty(v * h), np.empty(h)
        self._stack = zeros((1, padded_width(v, h, vp, hp, True)), self.dtype)

    def leaf_stack(self, depth, fold):
        """The stack that a leaf's sums are written onto, padded (see
        :func:`.sparse_ae_panels.padded_width`), ``depth`` rows at least (the leaves'
        tree; one without it), kept for the next call."""
        width = padded_width(self.visible, self.hidden, self.vp, self.hp, fold)
        if self._stack.shape[0] < depth or self._stack.shape[1] != width:
            self._stack = zeros((max(depth, 1), width), self.dtype)
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

    def pack(self, x):
        """Pack ``x`` into the panels unless it is the array packed last time, unchanged
        (same object and the same values at ~64 spread-out places). The checks are small
        kernels because they run right after the big ones, when NumPy's Python for them
        would find nothing in cache."""
        step = max(1, x.size // 61)
        if self._packed is x and _same_samples(x, step, self._samples):
            return
        _pack_panels(x, self.blocks, self.vp, self.hp)
        self._packed, self._samples = x, x.reshape(-1)[::step].copy()
        self._hidden = False

    def keep_hidden(self, W1, b1):
        """The panels now hold a2 at (W1, b1)."""
        _keep_weights(W1, b1, self._hidden_w1, self._hidden_b1)
        self._hidden = True

    def holds_hidden(self, W1, b1) -> bool:
        """Whether the panels hold a2 at this (W1, b1) (and the x packed last)."""
        return self._hidden and _same_weights(W1, b1, self._hidden_w1, self._hidden_b1)


@njit(cache=True, nogil=True)
def _same_samples(x, step, samples):
    """x's elements [::step] in C order == samples, one by one (NaN equals nothing)."""
    flat = x.reshape(-1)
    for k in range(samples.size):
        if flat[k * step] != samples[k]:
            return False
    return True


@njit(cache=True, nogil=True)
def _keep_weights(W1, b1, kept_w1, kept_b1):
    v, h = W1.shape
    for i in range(v):
        for j in range(h):
            kept_w1[i * h + j] = W1[i, j]
    for j in range(h):
        kept_b1[j] = b1[j]


@njit(cache=True, nogil=True)
def _same_weights(W1, b1, kept_w1, kept_b1):
    """W1 and b1 equal to the kept ones, element for element (NaN equals nothing)."""
    v, h = W1.shape
    if v * h != kept_w1.size or b1.size != kept_b1.size:
        return False
    for i in range(v):
        for j in range(h):
            if W1[i, j] != kept_w1[i * h + j]:
                return False
    for j in range(h):
        if b1[j] != kept_b1[j]:
            return False
    return True


def sparse_ae_workspace(m: int, visible: int, hidden: int, dtype=np.float64, block: int | None = None,
                        leaf: int | None = None):
    """A :class:`SparseAEWorkspace` for ``m`` samples of a ``visible``-``hidden`` model
    (``leaf``: the samples per leaf the partials will be asked for, a multiple of 32 in
    float64; float32 runs the SIMD kernels in such leaves, else BLAS)."""
    return SparseAEWorkspace(m, visible, hidden, dtype, block, leaf)


def sparse_ae_activations(x, W1, b1, out, ws=None, leaf=None):
    """Σ a2 over the shard, or per leaf into the rows of ``out`` (see the reference);
    returns ``out``. In the SIMD path a2 stays in ``ws`` for ``sparse_ae_partials(...,
    rho_hat=...)`` at the same x, W1 and b1."""
    v, h = W1.shape
    m = x.shape[0]
    check_shapes("sparse_ae_activations", x, W1, b1)
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
        _activations_panels(*_activations_args(ws, W1, b1, rows, leaf))
        ws.keep_hidden(W1, b1)
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
    size) and row L holds the sums over samples [L leaf, (L + 1) leaf) alone. In the SIMD
    path the workspace keeps x packed between calls: pass the same array again, or a new one
    (an array changed in place is noticed only at the ~64 places it samples); with
    ``rho_hat`` it uses the a2 that :func:`sparse_ae_activations` left there (made again
    if it was not at these x, W1, b1). ``merges``: the leaves added up as they come (see
    the reference), on a small stack in the workspace (SIMD, in x's precision) or in rows of
    out's.
    """
    v, h = W1.shape
    m = x.shape[0]
    check_shapes("sparse_ae_partials", x, W1, b1, W2, b2)
    rows = _check_leaves(m, out, kl, leaf, rho_hat, merges)
    if ws is None or not ws.fits(x, W1, leaf):
        ws = SparseAEWorkspace(m, v, h, x.dtype, leaf=leaf)
    c = np.ascontiguousarray
    fold, given = kl is not None, rho_hat is not None
    rho, beta = (float(kl[0]), float(kl[1])) if fold else (0.0, 0.0)
    # the KL gradient: straight into the first h of the SIMD kernel's vector (zeros past them)
    k = ws.kv if ws.simd else np.zeros(h)
    if fold and given:
        if np.shape(rho_hat) != (h,):
            raise ValueError(f"sparse_ae_partials: rho_hat needs {h} values, got shape {np.shape(rho_hat)}")
        kl_grad_into(c(rho_hat, dtype=np.float64), rho, beta, k)
    else:
        k[:h] = 0.0
    if ws.simd:
        x = c(x)
        ws.pack(x)
        if given and not ws.holds_hidden(W1, b1):  # one activation row per leaf
            sparse_ae_activations(x, W1, b1, np.empty((1 if leaf is None else len(ws.leaf_act), h)), ws, leaf)
        _partials_panels(*_partials_args(ws, c(W1), c(b1), c(W2), c(b2), rows, fold, fold and given, rho, beta,
                                         leaf, merges))
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


def _activations_args(ws, W1, b1, rows, leaf):
    """:func:`_activations_panels`' arguments (W1, b1 C-contiguous, ``rows`` checked)."""
    return (ws.blocks, W1, b1, ws.w1, ws.b1p, ws.act, ws.mask, ws.vp, ws.hp,
            0 if leaf is None else ws.leaf_panels, rows, ws.leaf_act)


def _partials_args(ws, W1, b1, W2, b2, rows, fold, given, rho, beta, leaf, merges):
    """:func:`_partials_panels`' arguments (weights C-contiguous, ``rows`` checked)."""
    v, h = W1.shape
    if rows.dtype != ws.dtype:
        raise ValueError(f"sparse_ae_partials: out is {rows.dtype}, the samples {ws.dtype}")
    order, depth = _NO_MERGES, 1
    if merges is not None:
        depth, _, order = merge_plan(tuple(merges))
    stack = ws.leaf_stack(depth, fold)
    return (ws.blocks, ws.m, W1, b1, W2, b2, ws.w1, ws.w2, ws.w2t, ws.b1p, ws.b2p, ws.cmask, ws.kv, ws.zt, ws.d3,
            ws.d2, ws.act, ws.err, ws.db1, ws.db2, ws.mask, ws.group, fold, given, rho, beta,
            0 if leaf is None else ws.leaf_panels, _offsets(v, h), rows, ws.leaf_act, order, stack)


# ---------------------------------------------------------------- several shards at once
_ACTIVATIONS, _PARTIALS = 1, 2  # the team's jobs: the two rounds


@njit(**JIT)
def _rounds_job(op, act, part):
    """One shard's share of a round: act and part are its two rounds' arguments."""
    if op == _ACTIVATIONS:
        _activations_panels(*act)
    else:
        _partials_panels(*part)


@njit(**JIT)
def _rounds_serve(ctrl, k, budget, act, part):
    """Helper k's loop (:class:`.team.Team`): its shard's share of each round posted."""
    while True:
        op = wait_for_work(ctrl, k, budget)
        if op <= 0:
            return op
        _rounds_job(op, act, part)
        finish(ctrl, k)


def _same(a: tuple, b: tuple) -> bool:
    """The same objects (numbers: equal values) one by one."""
    return len(a) == len(b) and all(x is y or (type(x) is float and x == y) for x, y in zip(a, b))


class SparseAEShards(_ref.SparseAEShards):
    """The reference's shards, with SIMD shards' rounds on a :class:`.team.Team`: this
    thread takes shard 0 and helper k shard k + 1, each helper waiting for the next
    round in compiled code, where a hand-off through Python threads (``pmap``) cost tens
    of microseconds a shard and round. The arguments each helper holds are made and
    handed over when the arrays given change (the first time, and for another model):
    callers pass the same array objects every round (views kept, not made anew). One shard
    (one thread) keeps its arguments the same way and needs no helper: the checks and the
    arguments' making are then not repeated every round on every rank."""

    def __init__(self, parts, leaf=None, pmap=None):
        super().__init__(parts, leaf, pmap, (sparse_ae_activations, sparse_ae_partials))
        self.native = leaf is not None and all(
            isinstance(ws, SparseAEWorkspace) and ws.simd and ws.m == x.shape[0] and ws.leaf == int(leaf)
            and x.dtype == ws.dtype for x, ws, _ in self.parts)
        self._act = self._part = None  # (the arrays given, each shard's arguments) of each round

    def activations(self, W1, b1, outs):
        if not self.native:
            return super().activations(W1, b1, outs)
        key = (W1, b1, *outs)
        if self._act is None or not _same(self._act[0], key):
            c = np.ascontiguousarray
            args = []
            for (x, ws, _), out in zip(self.parts, outs):
                check_shapes("sparse_ae_activations", x, W1, b1)
                rows = leaf_rows(ws.m, out, None, self.leaf)
                if rows.shape[1] != W1.shape[1]:
                    raise ValueError(f"sparse_ae_activations: out needs {W1.shape[1]} columns, got {rows.shape[1]}")
                args.append(_activations_args(ws, c(W1), c(b1), rows, self.leaf))
            self._act = (key, args)
        for x, ws, _ in self.parts:
            ws.pack(x)
        self._run(_ACTIVATIONS)
        for _, ws, _ in self.parts:
            ws.keep_hidden(W1, b1)
        return outs

    def partials(self, W1, b1, W2, b2, outs, kl=None, rho_hat=None):
        if not self.native or kl is None or rho_hat is None:
            return super().partials(W1, b1, W2, b2, outs, kl, rho_hat)
        rho, beta = float(kl[0]), float(kl[1])
        key = (W1, b1, W2, b2, rho, beta, *outs)
        if self._part is None or not _same(self._part[0], key):
            c = np.ascontiguousarray
            args = []
            for (x, ws, merges), out in zip(self.parts, outs):
                check_shapes("sparse_ae_partials", x, W1, b1, W2, b2)
                rows = _check_leaves(ws.m, out, kl, self.leaf, rho_hat, merges)
                args.append(_partials_args(ws, c(W1), c(b1), c(W2), c(b2), rows, True, True, rho, beta,
                                           self.leaf, merges))
            self._part = (key, args)
        h = W1.shape[1]
        if np.shape(rho_hat) != (h,):
            raise ValueError(f"sparse_ae_partials: rho_hat needs {h} values, got shape {np.shape(rho_hat)}")
        k = self.parts[0][1].kv
        kl_grad_into(np.ascontiguousarray(rho_hat, dtype=np.float64), rho, beta, k)
        for x, ws, _ in self.parts:
            ws.kv[:] = k  # every shard folds the same KL gradient in
            ws.pack(x)
            if not ws.holds_hidden(W1, b1):  # a2 made again, one activation row per leaf
                sparse_ae_activations(x, W1, b1, np.empty((len(ws.leaf_act), h)), ws, self.leaf)
        self._run(_PARTIALS)
        return outs

    def __del__(self):
        try:
            forget((self._act, self._part))  # the helpers let go of this model's arrays
        except Exception:  # noqa: BLE001 (at interpreter exit, modules may be gone)
            pass

    def _run(self, op):
        """Round ``op`` on every shard: on the team once both rounds' arguments are known,
        else (or while the team is busy) one shard after another on this thread."""
        acts, parts = (None if r is None else r[1] for r in (self._act, self._part))
        # this thread's shares go through the kernels' dispatchers (a compiled _rounds_job
        # would be one more copy of both kernels to load from the cache)
        job = _rounds_job.py_func
        helpers = None  # one shard has none; several, once both rounds' arguments are bound
        if acts and parts and len(self.parts) > 1:
            helpers = shared(len(self.parts) - 1, _rounds_serve, job)
        if helpers is None or not helpers.busy.acquire(blocking=False):
            for i in range(len(self.parts)):
                job(op, acts and acts[i], parts and parts[i])
            return
        try:
            token = (self._act, self._part)
            if not helpers.holds(token):
                helpers.bind(list(zip(acts[1:], parts[1:])), token)
            helpers.run(op, (acts[0], parts[0]))
        finally:
            helpers.busy.release()


def sparse_ae_shards(parts, leaf=None, pmap=None):
    """A :class:`SparseAEShards` of ``parts`` ((x, ws, merges) per shard)."""
    return SparseAEShards(parts, leaf, pmap)


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
