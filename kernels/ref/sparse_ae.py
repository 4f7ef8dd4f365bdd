"""Sparse autoencoder (Ng, CS294A / UFLDL) cost and gradient, split for data parallelism.

J(θ) = (1/2m) Σ‖a3 − x‖² + (λ/2)(‖W1‖² + ‖W2‖²) + β Σ_j KL(ρ ‖ ρ̂_j),
a2 = σ(x W1 + b1), a3 = σ(a2 W2 + b2), ρ̂ = mean of a2 over ALL m samples.

The KL gradient k_j = β(−ρ/ρ̂_j + (1−ρ)/(1−ρ̂_j)) needs the global ρ̂, but it enters
δ2 = (δ3 W2ᵀ + k) ⊙ s (s = a2(1 − a2)) linearly, so with e = δ3 W2ᵀ

    ∂J/∂W1 = (P + Q·diag(k))/m + λW1,   P = xᵀ(e ⊙ s),  Q = xᵀ s
    ∂J/∂b1 = (Σ e ⊙ s + k ⊙ Σ s)/m

and a shard can send everything the root needs in ONE packed buffer (sums over its own
samples only), reduced once per evaluation:

    sparse_ae_partials(x, W1, b1, W2, b2, out)      per shard  -> packed sums
    sparse_ae_assemble(partials, W1, W2, m, ...)    on the root -> (cost, ∂J/∂θ)

Shapes follow the kernel conventions: x (m, v), W1 (v, h), b1 (h,), W2 (h, v), b2 (v,).

Packed partials layout (``sparse_ae_layout``; offsets in this order, row-major blocks):

====  ========  ==========================================================
name  shape     sum over the shard's samples
====  ========  ==========================================================
w1    (v, 2h)   [P | Q]: columns :h hold xᵀ(e ⊙ s), columns h: hold xᵀ s
b1    (2h,)     [Σ e ⊙ s | Σ s]
w2    (h, v)    a2ᵀ δ3, δ3 = (a3 − x) ⊙ a3(1 − a3)
b2    (v,)      Σ δ3
act   (h,)      Σ a2   (ρ̂ = act / m)
err   (1,)      Σ ‖a3 − x‖²
====  ========  ==========================================================

With ``kl=(rho, beta)`` k is known before the backward pass and folded into δ2 directly:
the P slots hold xᵀδ2 and Σδ2 and the Q slots are left zero. ``sparse_ae_assemble``
gives the same result either way (P + Q·diag(k) with Q = 0), and the fast kernels skip
one GEMM (a sixth of the work). k needs the global ρ̂: either the shard holds all m
samples (one process), or the caller passes ``rho_hat``, the fixed-tree total of every
shard's ``sparse_ae_activations`` over m. That is the paper's evaluation in two rounds:

    sparse_ae_activations(x, W1, b1, act)               per shard -> Σ a2 per leaf
    (sum over every leaf and shard; ρ̂ = total / m on every rank)
    sparse_ae_partials(..., kl=(rho, beta), leaf, rho_hat=ρ̂)   -> packed sums, Q = 0

A process that cuts its samples into several shards (one per thread) evaluates them
round by round through ``sparse_ae_shards`` (:class:`SparseAEShards`): the same calls,
every shard's in one go, so that a kernel set can run the shares its own way.

Parameter vector θ (``sparse_ae_theta_layout``): W1 (v×h, row-major), W2 (h×v,
row-major), b1 (h), b2 (v); ``sparse_ae_assemble`` returns ∂J/∂θ in that order.

This module is the NumPy reference: the textbook formulation, allocating freely.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from .blocksum import stack_depth
from .sparsity import kl_sparsity_backward, kl_sparsity_forward

__all__ = ["sparse_ae_layout", "sparse_ae_partials_size", "sparse_ae_theta_layout",
           "sparse_ae_theta_size", "sparse_ae_workspace", "sparse_ae_activations",
           "sparse_ae_partials", "sparse_ae_assemble", "sparse_ae_shards"]


def sparse_ae_layout(visible: int, hidden: int) -> dict:
    """Packed partials layout: name -> (offset, shape), in buffer order (module docstring)."""
    v, h = int(visible), int(hidden)
    layout, offset = {}, 0
    for name, shape in (("w1", (v, 2 * h)), ("b1", (2 * h,)), ("w2", (h, v)), ("b2", (v,)),
                        ("act", (h,)), ("err", (1,))):
        layout[name] = (offset, shape)
        offset += math.prod(shape)  # math's: np.prod's overhead was paid on every evaluation
    return layout


def sparse_ae_partials_size(visible: int, hidden: int) -> int:
    """Length of the packed partials buffer: 3vh + 3h + v + 1."""
    return 3 * visible * hidden + 3 * hidden + visible + 1


def sparse_ae_theta_layout(visible: int, hidden: int) -> dict:
    """θ layout: name -> (offset, shape) for W1 (v,h), W2 (h,v), b1 (h,), b2 (v,)."""
    v, h = int(visible), int(hidden)
    return {"W1": (0, (v, h)), "W2": (v * h, (h, v)), "b1": (2 * v * h, (h,)),
            "b2": (2 * v * h + h, (v,))}


def sparse_ae_theta_size(visible: int, hidden: int) -> int:
    return 2 * visible * hidden + hidden + visible


def _views(buf, layout):
    return {name: buf[o:o + int(np.prod(shape))].reshape(shape) for name, (o, shape) in layout.items()}


def sparse_ae_workspace(m: int, visible: int, hidden: int, dtype=np.float64, block: int | None = None,
                        leaf: int | None = None):
    """Scratch memory for ``sparse_ae_partials`` on ``m`` samples (the reference needs none)."""
    return None


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def check_shapes(name, x, W1, b1, W2=None, b2=None):
    """x, b1 (and W2, b2) against W1's (v, h): a ValueError naming the one that does not
    fit. The Numba tiles read through raw pointers, where a wrong shape would read and
    write past the arrays' ends; every set refuses alike."""
    v, h = W1.shape
    want = {"x": (x.shape[0], v), "b1": (h,), "W2": (h, v), "b2": (v,)}
    for label, a in (("x", x), ("b1", b1), ("W2", W2), ("b2", b2)):
        if a is not None and a.shape != want[label]:
            raise ValueError(f"{name}: {label} has shape {a.shape}, W1 {W1.shape} needs {want[label]}")


def sparse_ae_activations(x, W1, b1, out, ws=None, leaf=None):
    """Σ a2 over the shard's samples into ``out`` (h,), or with ``leaf`` per leaf into the
    rows of ``out`` (ceil(m / leaf), h); returns ``out``. The same sums as the ``act`` slots
    of :func:`sparse_ae_partials`, bit for bit (the fast sets also keep a2 in ``ws`` for
    the ``sparse_ae_partials(..., rho_hat=...)`` that follows)."""
    check_shapes("sparse_ae_activations", x, W1, b1)
    if leaf is not None:
        rows = leaf_rows(x.shape[0], out, None, leaf)
        for i, i0 in enumerate(range(0, x.shape[0], int(leaf))):
            sparse_ae_activations(x[i0:i0 + int(leaf)], W1, b1, rows[i], ws)
        return out
    out[...] = _sigmoid(x @ W1 + b1).sum(axis=0)
    return out


def sparse_ae_partials(x, W1, b1, W2, b2, out, ws=None, kl=None, leaf=None, rho_hat=None, merges=None):
    """Fill ``out`` (packed, module docstring) with this shard's sums; returns ``out``.

    Parameters
    ----------
    x : (m, v) array, the shard's samples (in the model dtype)
    W1, b1, W2, b2 : parameters (model dtype)
    out : (sparse_ae_partials_size(v, h),) array of the model dtype, overwritten; with
        ``leaf``, (ceil(m / leaf), size): row L holds the sums over samples
        [L leaf, (L + 1) leaf) alone (the blocks a rank-independent sum adds up in a fixed
        tree, aepar.rows)
    ws : workspace from ``sparse_ae_workspace`` (unused by the reference)
    kl : (rho, beta) to fold the KL term (needs the global ρ̂: the shard is the whole data
        set, or ``rho_hat`` is given), else None
    leaf : samples per leaf, or None for one sum over the shard
    rho_hat : with ``kl``, ρ̂ over every sample of every shard (h,), float64
    merges : with ``leaf``, the leaves' sums are added up as they come, in the postfix tree
        that ``merges`` gives (one count per leaf: how many additions of the two newest
        partial sums follow it; aepar.rows.cover_merges), and ``out`` has one row per sum
        left (the tree nodes, in order) instead of one per leaf
    """
    check_shapes("sparse_ae_partials", x, W1, b1, W2, b2)
    if leaf is None and merges is not None:
        raise ValueError("merges add leaves: give leaf too")
    if leaf is not None:
        rows = leaf_rows(x.shape[0], out, kl, leaf, rho_hat, merges)
        each = rows if merges is None else np.empty((len(merges), out.shape[1]), out.dtype)
        for i, i0 in enumerate(range(0, x.shape[0], int(leaf))):
            sparse_ae_partials(x[i0:i0 + int(leaf)], W1, b1, W2, b2, each[i], ws, kl, rho_hat=rho_hat)
        if merges is not None:
            merge_rows(each, merges, rows)
        return out
    v, h = W1.shape
    P = _views(out, sparse_ae_layout(v, h))
    a2 = _sigmoid(x @ W1 + b1)
    a3 = _sigmoid(a2 @ W2 + b2)
    diff = a3 - x
    d3 = diff * a3 * (1 - a3)
    s = a2 * (1 - a2)
    e = d3 @ W2.T
    if kl is None:
        es = e * s
        P["w1"][:, :h] = x.T @ es
        P["w1"][:, h:] = x.T @ s
        P["b1"][:h] = es.sum(axis=0)
        P["b1"][h:] = s.sum(axis=0)
    else:
        rho, beta = kl
        # k = d/dρ̂ of β Σ KL(ρ‖ρ̂): the per-unit term added to δ2 (before ⊙ s)
        if rho_hat is None:
            rho_hat = a2.sum(axis=0, dtype=np.float64) / x.shape[0]
        k = kl_sparsity_backward(np.asarray(rho_hat, dtype=np.float64), rho, beta)
        d2 = (e + k.astype(e.dtype)) * s
        P["w1"][:, :h] = x.T @ d2
        P["w1"][:, h:] = 0
        P["b1"][:h] = d2.sum(axis=0)
        P["b1"][h:] = 0
    P["w2"][...] = a2.T @ d3
    P["b2"][...] = d3.sum(axis=0)
    P["act"][...] = a2.sum(axis=0)
    P["err"][...] = np.sum(diff * diff)
    return out


class SparseAEShards:
    """Several shards of one model, evaluated a round at a time.

    ``parts``: one ``(x, ws, merges)`` per shard (its samples, its workspace, the
    postfix merges of its leaves or None); each round writes shard i's sums into
    ``outs[i]``, exactly as :func:`sparse_ae_activations` and :func:`sparse_ae_partials`
    called on it with ``leaf``. ``pmap(fn, items)`` runs a round's shares (aepar passes
    its threads' map; default: one after another). The Numba set runs float64 shards
    on helper threads waiting in compiled code instead (:mod:`aepar.kernels.nb.team`).
    """

    def __init__(self, parts, leaf=None, pmap=None, kernels=None):
        self.parts = [tuple(p) for p in parts]
        self.leaf = leaf
        self.pmap = pmap or (lambda fn, items: [fn(i) for i in items])
        self._activations, self._partials = kernels or (sparse_ae_activations, sparse_ae_partials)

    def activations(self, W1, b1, outs):
        """Σ a2 of every shard: ``outs[i]`` as ``sparse_ae_activations`` gives it."""
        def one(i):
            x, ws, _ = self.parts[i]
            self._activations(x, W1, b1, outs[i], ws, self.leaf)
        self.pmap(one, range(len(self.parts)))
        return outs

    def partials(self, W1, b1, W2, b2, outs, kl=None, rho_hat=None):
        """The packed sums of every shard: ``outs[i]`` as ``sparse_ae_partials`` gives it."""
        def one(i):
            x, ws, merges = self.parts[i]
            self._partials(x, W1, b1, W2, b2, outs[i], ws, kl, self.leaf, rho_hat, merges)
        self.pmap(one, range(len(self.parts)))
        return outs


def sparse_ae_shards(parts, leaf=None, pmap=None):
    """A :class:`SparseAEShards` of ``parts`` ((x, ws, merges) per shard)."""
    return SparseAEShards(parts, leaf, pmap)


def leaf_rows(m, out, kl, leaf, rho_hat=None, merges=None):
    """Check the per-leaf output of ``m`` samples (or with ``merges``, one row per node);
    returns ``out``."""
    if kl is not None and rho_hat is None:
        raise ValueError("per-leaf partials fold the KL term only with rho_hat (every sample's ρ̂)")
    n = -(-int(m) // int(leaf))
    if merges is not None:
        depth, nodes, _ = merge_plan(tuple(merges))
        if len(merges) != n or depth == 0:
            raise ValueError(f"merges {list(merges)[:8]}... do not add up {n} leaves")
        n = nodes
    if out.ndim != 2 or out.shape[0] != n:
        raise ValueError(f"{m} samples in leaves of {leaf} need out of shape ({n}, size), got {out.shape}")
    return out


@functools.lru_cache(maxsize=64)  # a run's merges are the same at every evaluation
def merge_plan(merges: tuple) -> tuple:
    """(the most partial sums the postfix tree of ``merges`` holds at once, 0 if it pops an
    empty stack; the sums it leaves; the merges as a read-only int64 array)."""
    order = np.array(merges, np.int64)
    order.setflags(write=False)  # shared by every call with these merges
    return stack_depth(merges), len(merges) - sum(merges), order


def merge_rows(rows, merges, out):
    """The rows added in the postfix tree of ``merges`` (in place), the sums left into the
    rows of ``out`` in order (NumPy or CuPy arrays)."""
    stack = []
    for row, count in zip(rows, merges):
        stack.append(row)
        for _ in range(int(count)):
            right = stack.pop()
            stack[-1] += right
    for i, row in enumerate(stack):
        out[i] = row
    return out


def sparse_ae_assemble(partials, W1, W2, m, rho, beta, lam, grad=None):
    """Cost and gradient from the summed partials (float64 on the host).

    Parameters
    ----------
    partials : packed buffer summed over all shards (any float dtype)
    W1, W2 : the weights (for the decay term; pass the optimiser's float64 values)
    m : total number of samples over all shards
    rho, beta, lam : sparsity target, sparsity weight, weight decay
    grad : optional float64 (sparse_ae_theta_size(v, h),) array to fill

    Returns
    -------
    (float, numpy.ndarray)
        J(θ) and ∂J/∂θ packed as θ (W1, W2, b1, b2).
    """
    v, h = W1.shape
    P = _views(np.asarray(partials, dtype=np.float64), sparse_ae_layout(v, h))
    W1 = np.asarray(W1, dtype=np.float64)
    W2 = np.asarray(W2, dtype=np.float64)
    if grad is None:
        grad = np.empty(sparse_ae_theta_size(v, h))
    G = _views(grad, sparse_ae_theta_layout(v, h))
    rho_hat = P["act"] / m
    k = kl_sparsity_backward(rho_hat, rho, beta)
    cost = (P["err"][0] / (2 * m) + 0.5 * lam * (np.sum(W1 * W1) + np.sum(W2 * W2))
            + kl_sparsity_forward(rho_hat, rho, beta))
    G["W1"][...] = (P["w1"][:, :h] + P["w1"][:, h:] * k) / m + lam * W1
    G["W2"][...] = P["w2"] / m + lam * W2
    G["b1"][...] = (P["b1"][:h] + k * P["b1"][h:]) / m
    G["b2"][...] = P["b2"] / m
    return float(cost), grad
