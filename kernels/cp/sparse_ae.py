"""Sparse autoencoder partials and assembly on the GPU (CuPy).

Same names, layout and results as :mod:`aepar.kernels.ref.sparse_ae` (read its docstring
for the formulation). The five products are cuBLAS GEMMs over the whole shard; the
element-wise work is three fused ElementwiseKernels (bias + sigmoid; output sigmoid +
error + δ3; s and δ2), the column sums are CuPy reductions written straight into the
packed buffer. Scratch memory lives in a :class:`SparseAEWorkspace` made once per model.

Assembly is O(vh) work on the root: the packed buffer (a few thousand numbers) is copied
to the host once and assembled by the float64 reference.
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from ..ref import sparse_ae as _ref
from ..ref.sparse_ae import (leaf_rows, merge_rows, sparse_ae_layout, sparse_ae_partials_size,
                             sparse_ae_theta_layout, sparse_ae_theta_size)
from .sparsity import kl_sparsity_backward

__all__ = ["sparse_ae_layout", "sparse_ae_partials_size", "sparse_ae_theta_layout",
           "sparse_ae_theta_size", "sparse_ae_workspace", "sparse_ae_activations",
           "sparse_ae_partials", "sparse_ae_assemble", "SparseAEWorkspace", "sparse_ae_shards"]

# a2 = σ(z + b) in place (b broadcasts over rows)
_hidden_forward = cp.ElementwiseKernel(
    "T b", "T a",
    "a = (T)1 / ((T)1 + exp(-(a + b)))",
    "aepar_sae_hidden_forward")

# a3 = σ(z + b); diff = a3 − x; δ3 = diff a3 (1 − a3) (written over z); sq = diff²
_output_delta = cp.ElementwiseKernel(
    "T b, T x", "T z, T sq",
    """
    T a = (T)1 / ((T)1 + exp(-(z + b)));
    T d = a - x;
    sq = d * d;
    z = d * a * ((T)1 - a);
    """,
    "aepar_sae_output_delta")

# s = a (1 − a); es = e s
_hidden_delta_split = cp.ElementwiseKernel(
    "T e, T a", "T es, T s",
    "s = a * ((T)1 - a); es = e * s",
    "aepar_sae_hidden_delta_split")

# δ2 = (e + k) a (1 − a), written over e (k broadcasts over rows)
_hidden_delta_folded = cp.ElementwiseKernel(
    "T k, T a", "T e",
    "e = (e + k) * a * ((T)1 - a)",
    "aepar_sae_hidden_delta_folded")


class SparseAEWorkspace:
    """Device scratch arrays for :func:`sparse_ae_partials` on ``m`` samples."""

    def __init__(self, m: int, visible: int, hidden: int, dtype=np.float64, block: int | None = None,
                 leaf: int | None = None):
        dtype = np.dtype(dtype)
        self.leaf = leaf
        v, h = int(visible), int(hidden)
        self.m, self.visible, self.hidden, self.dtype = int(m), v, h, dtype
        m = max(self.m, 1)
        self.a2 = cp.empty((m, h), dtype)
        self.z3 = cp.empty((m, v), dtype)
        self.sq = cp.empty((m, v), dtype)
        self.e = cp.empty((m, h), dtype)
        self.g = cp.empty((m, 2 * h), dtype)
        self.t_vh = cp.empty((v, h), dtype)

    def fits(self, x, W1) -> bool:
        return x.shape[0] == self.m and W1.shape == (self.visible, self.hidden) and x.dtype == self.dtype


def sparse_ae_workspace(m: int, visible: int, hidden: int, dtype=np.float64, block: int | None = None,
                        leaf: int | None = None):
    """A :class:`SparseAEWorkspace` (``block`` is ignored: the GPU takes the whole shard)."""
    return SparseAEWorkspace(m, visible, hidden, dtype, block, leaf)


def _leaf_runs(m, leaf, n):
    """(first leaf, stop, rows per leaf): the full leaves, then the short last one."""
    full = m // leaf
    return [(lo, hi, rows) for lo, hi, rows in ((0, full, leaf), (full, n, m - full * leaf)) if hi > lo]


def _per_leaf(a, leaf, lo, hi, rows):
    """Rows of leaves lo..hi of ``a`` as (leaves, rows, ...)."""
    return a[lo * leaf:lo * leaf + (hi - lo) * rows].reshape((hi - lo, rows) + a.shape[1:])


def _hidden(x, W1, b1, ws):
    """a2 = σ(x W1 + b1) in the workspace."""
    a2 = ws.a2[:x.shape[0]]
    cp.matmul(x, W1, out=a2)
    _hidden_forward(b1, a2)
    return a2


def _leaf_act(a2, leaf, out):
    """out[L] = Σ a2 over leaf L (one reduction per run of leaves of one length)."""
    for lo, hi, rows in _leaf_runs(a2.shape[0], leaf, out.shape[0]):
        out[lo:hi] = _per_leaf(a2, leaf, lo, hi, rows).sum(axis=1)
    return out


def sparse_ae_activations(x, W1, b1, out, ws=None, leaf=None):
    """Σ a2 over the shard, or per leaf into the rows of ``out`` (see the reference):
    the same reductions, bit for bit, as the ``act`` slots of :func:`sparse_ae_partials`."""
    _ref.check_shapes("sparse_ae_activations", x, W1, b1)
    v, h = W1.shape
    m = x.shape[0]
    if ws is None or not ws.fits(x, W1):
        ws = SparseAEWorkspace(m, v, h, x.dtype)
    a2 = _hidden(x, W1, b1, ws)
    if leaf is None:
        cp.sum(a2, axis=0, out=out)
    else:
        _leaf_act(a2, int(leaf), leaf_rows(m, out, None, leaf))
    return out


def sparse_ae_partials(x, W1, b1, W2, b2, out, ws=None, kl=None, leaf=None, rho_hat=None, merges=None):
    """Fill the CuPy array ``out`` with this shard's packed sums; returns ``out``.

    With ``leaf`` (see the reference), the element-wise work runs over the whole shard
    and the sums are taken per leaf: batched GEMMs and reductions over the full leaves,
    then the short last one, each leaf's order fixed by its shape alone. With ``rho_hat``
    a2 is made again (one GEMM; the CPU kernels keep it from the activations instead).
    ``merges``: the leaves' rows then added in that tree (see the reference), a row at a time.
    """
    _ref.check_shapes("sparse_ae_partials", x, W1, b1, W2, b2)
    v, h = W1.shape
    m = x.shape[0]
    if ws is None or not ws.fits(x, W1):
        ws = SparseAEWorkspace(m, v, h, x.dtype)
    k = None
    if kl is not None and rho_hat is not None:
        k = kl_sparsity_backward(cp.asarray(rho_hat, dtype=cp.float64), kl[0], kl[1]).astype(x.dtype)
    if leaf is not None:
        rows = leaf_rows(m, out, kl, leaf, rho_hat, merges)
        if merges is None:
            return _partials_per_leaf(x, W1, b1, W2, b2, rows, ws, int(leaf), k)
        each = cp.empty((len(merges), rows.shape[1]), rows.dtype)
        _partials_per_leaf(x, W1, b1, W2, b2, each, ws, int(leaf), k)
        merge_rows(each, merges, rows)
        return out
    if merges is not None:
        raise ValueError("merges add leaves: give leaf too")
    layout = sparse_ae_layout(v, h)
    P = {name: out[o:o + int(np.prod(s))].reshape(s) for name, (o, s) in layout.items()}
    a2, z3, e = _hidden(x, W1, b1, ws), ws.z3, ws.e
    cp.sum(a2, axis=0, out=P["act"])
    cp.matmul(a2, W2, out=z3)
    _output_delta(b2, x, z3, ws.sq)                    # z3 is now δ3
    P["err"][...] = ws.sq.sum()
    cp.sum(z3, axis=0, out=P["b2"])
    cp.matmul(a2.T, z3, out=P["w2"])
    cp.matmul(z3, W2.T, out=e)
    if kl is None:
        es, s = ws.g[:, :h], ws.g[:, h:]
        _hidden_delta_split(e, a2, es, s)
        cp.sum(ws.g, axis=0, out=P["b1"])
        cp.matmul(x.T, ws.g, out=P["w1"])
    else:
        if k is None:
            k = kl_sparsity_backward(P["act"].astype(cp.float64) / m, kl[0], kl[1]).astype(e.dtype)
        _hidden_delta_folded(k, a2, e)                 # e is now δ2
        cp.matmul(x.T, e, out=ws.t_vh)
        P["w1"][:, :h] = ws.t_vh
        P["w1"][:, h:] = 0
        cp.sum(e, axis=0, out=P["b1"][:h])
        P["b1"][h:] = 0
    return out


def _partials_per_leaf(x, W1, b1, W2, b2, out, ws, leaf, k=None):
    """Per-leaf sums; with ``k`` (the global ρ̂'s KL term) folded into δ2, Q = 0."""
    v, h = W1.shape
    m = x.shape[0]
    z3, e, g = ws.z3[:m], ws.e[:m], ws.g[:m]
    a2 = _hidden(x, W1, b1, ws)
    cp.matmul(a2, W2, out=z3)
    _output_delta(b2, x, z3, ws.sq[:m])                # z3 is now δ3
    cp.matmul(z3, W2.T, out=e)
    if k is None:
        _hidden_delta_split(e, a2, g[:, :h], g[:, h:])
    else:
        _hidden_delta_folded(k, a2, e)                 # e is now δ2
    layout = sparse_ae_layout(v, h)
    n = out.shape[0]
    P = {name: out[:, o:o + int(np.prod(s))].reshape((n,) + s) for name, (o, s) in layout.items()}
    _leaf_act(a2, leaf, P["act"])
    for lo, hi, rows in _leaf_runs(m, leaf, n):
        xl, al, zl = (_per_leaf(a, leaf, lo, hi, rows) for a in (x, a2, z3))
        if k is None:
            gl = _per_leaf(g, leaf, lo, hi, rows)
            P["w1"][lo:hi] = cp.matmul(xl.transpose(0, 2, 1), gl)
            P["b1"][lo:hi] = gl.sum(axis=1)
        else:
            el = _per_leaf(e, leaf, lo, hi, rows)
            P["w1"][lo:hi, :, :h] = cp.matmul(xl.transpose(0, 2, 1), el)
            P["w1"][lo:hi, :, h:] = 0
            P["b1"][lo:hi, :h] = el.sum(axis=1)
            P["b1"][lo:hi, h:] = 0
        P["w2"][lo:hi] = cp.matmul(al.transpose(0, 2, 1), zl)
        P["b2"][lo:hi] = zl.sum(axis=1)
        P["err"][lo:hi, 0] = _per_leaf(ws.sq[:m], leaf, lo, hi, rows).sum(axis=(1, 2))
    return out


def _host(a):
    return a.get() if isinstance(a, cp.ndarray) else np.asarray(a)


def sparse_ae_assemble(partials, W1, W2, m, rho, beta, lam, grad=None):
    """Cost and float64 host gradient: one device-to-host copy, then the reference."""
    return _ref.sparse_ae_assemble(_host(partials), _host(W1), _host(W2), m, rho, beta, lam, grad)


def sparse_ae_shards(parts, leaf=None, pmap=None):
    """The reference's :class:`~aepar.kernels.ref.sparse_ae.SparseAEShards` over this set's
    kernels."""
    return _ref.SparseAEShards(parts, leaf, pmap, (sparse_ae_activations, sparse_ae_partials))
