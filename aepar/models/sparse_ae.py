"""Ng's sparse autoencoder (CS294A/UFLDL): one sigmoid hidden layer, sigmoid outputs.

J(θ) = (1/2m) Σ‖a3 − x‖² + (λ/2)(‖W1‖² + ‖W2‖²) + β Σ_j KL(ρ ‖ ρ̂_j),

with ρ̂ the mean hidden activation over all m samples on all ranks. The samples are cut
into fixed blocks of :data:`LEAF` (aepar.rows); a model holds some of the blocks. An
evaluation has the paper's two rounds: :meth:`SparseAutoencoder.shared_sums` gives each
block's Σ a2, whose fixed-tree total every rank then holds (ρ̂ = total / m, so the KL
term's gradient is known before the backward pass); :meth:`SparseAutoencoder.partials`
fills one packed buffer of sums per block with it folded in, which a second fixed-tree
reduction sums on the root (the same bits on any number of ranks and threads), and
:meth:`SparseAutoencoder.assemble` turns the summed buffer into J and ∂J/∂θ (see
:mod:`aepar.kernels.ref.sparse_ae` for the formulation and the buffer layout).

θ is a flat float64 vector on the host (the optimiser's), packed W1 (v×h, row-major),
W2 (h×v, row-major), b1 (h), b2 (v). The kernels work in the model dtype on the
backend's device; a θ buffer of that dtype is what the ranks broadcast.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aepar.rows import (Blocks, cover_merges, parallel_map, thread_bands, tree_node_from, tree_sum_rows,
                        tree_top)

__all__ = ["SparseAutoencoder", "init_theta", "LEAF"]

# Samples per block of the rank-independent sum: a multiple of the SIMD kernels' panels
# (32 samples at most, either precision), small enough that 16 ranks share 10,000 patches
# evenly.
LEAF = 128


@dataclass
class _Chunk:
    """A thread's contiguous run of this rank's blocks: its samples, workspace and rows of
    the per-block output."""

    x: object
    ws: object
    rows: slice
    nodes: list        # the tree nodes its blocks make up, and the merges that add them
    merges: tuple


def init_theta(visible: int, hidden: int, seed) -> np.ndarray:
    """UFLDL initialisation: W uniform in ±√6/√(v+h+1) (W1 drawn first, then W2), b = 0.

    Returns the packed float64 θ (W1, W2, b1, b2).
    """
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    r = np.sqrt(6.0) / np.sqrt(visible + hidden + 1)
    W1 = rng.uniform(-r, r, size=(visible, hidden))
    W2 = rng.uniform(-r, r, size=(hidden, visible))
    return np.concatenate([W1.ravel(), W2.ravel(), np.zeros(hidden + visible)])


class SparseAutoencoder:
    """The model on one shard of the samples.

    Parameters
    ----------
    be : aepar.backend.Backend
        Array module, kernel set and dtype.
    visible, hidden : int
        Layer sizes (v = patch², h).
    rho, beta, lam : float
        Sparsity target ρ, sparsity weight β, weight decay λ.

    Use :meth:`attach` to give it its samples, then :meth:`shared_sums` and
    :meth:`partials` on every rank and :meth:`assemble` on the root (or :meth:`cost_grad`
    in one process).
    """

    def __init__(self, be, visible: int, hidden: int, *, rho: float = 0.01, beta: float = 3.0,
                 lam: float = 1e-4):
        self.be, self.K = be, be.K
        self.visible, self.hidden = int(visible), int(hidden)
        self.rho, self.beta, self.lam = float(rho), float(beta), float(lam)
        self.theta_layout = self.K.sparse_ae_theta_layout(self.visible, self.hidden)
        self._slices = [(name, o, o + int(np.prod(shape)), shape)
                        for name, (o, shape) in self.theta_layout.items()]
        self.n_theta = self.K.sparse_ae_theta_size(self.visible, self.hidden)
        self.n_partials = self.K.sparse_ae_partials_size(self.visible, self.hidden)
        self.n_shared = self.hidden  # Σ a2 per block: ρ̂ m once summed over every block
        self.x = None
        self.blocks = None
        self._chunks = []
        self._theta_buf = None  # for cost_grad
        self._kept_views = {}   # id of a θ array -> (it, its views)
        self._shards = None     # the kernels' evaluation of every chunk, a round at a time
        self._round_rows = {}   # (id, width, nodes) of an output buffer -> (it, each chunk's rows of it)

    # ---- data -----------------------------------------------------------------------
    def attach(self, x_local, blocks: Blocks | None = None):
        """Give the model the samples of its blocks.

        Parameters
        ----------
        x_local : (rows, v) array
            The rows of ``blocks.first`` .. ``blocks.stop`` of the whole sample set.
        blocks : Blocks
            The fixed decomposition of all samples into blocks of :data:`LEAF` and this
            rank's share (default: one process holding everything).

        The samples are copied to the backend in the model dtype (private copies: the
        CPU kernels keep them repacked in their workspaces, which must not go stale) and
        split into one contiguous run of blocks per thread, each with its workspace.
        """
        x_local = np.asarray(x_local)
        if x_local.ndim != 2 or x_local.shape[1] != self.visible:
            raise ValueError(f"samples must be (m, {self.visible}), got {x_local.shape}")
        blocks = blocks or Blocks.fixed(x_local.shape[0], LEAF)
        if x_local.shape[0] != blocks.rows.stop - blocks.rows.start:
            raise ValueError(f"{x_local.shape[0]} samples for blocks holding {blocks.rows}")
        self.blocks = blocks
        self.x = self.be.xp.array(self.be.asarray(x_local), order="C", copy=True)
        mine = blocks.stop - blocks.first
        cuts = thread_bands(mine)
        self._chunks = []
        for a, b in zip(cuts[:-1], cuts[1:]):
            lo, hi = blocks.local(blocks.first + int(a)).start, blocks.local(blocks.first + int(b) - 1).stop
            x = self.x[lo:hi]
            ws = self.K.sparse_ae_workspace(hi - lo, self.visible, self.hidden, self.be.dtype, leaf=LEAF)
            nodes, merges = cover_merges(blocks.first + int(a), blocks.first + int(b), blocks.count)
            self._chunks.append(_Chunk(x, ws, slice(int(a), int(b)), nodes, merges))
        self._shards = self.K.sparse_ae_shards([(c.x, c.ws, c.merges) for c in self._chunks], LEAF, parallel_map)
        self._round_rows = {}
        return self

    @property
    def m_local(self) -> int:
        return 0 if self.x is None else int(self.x.shape[0])

    @property
    def m_total(self) -> int:
        return 0 if self.blocks is None else self.blocks.n

    # ---- parameters -----------------------------------------------------------------
    def views(self, theta) -> dict:
        """W1, W2, b1, b2 as views into a packed θ (any array type and dtype)."""
        return {name: theta[start:end].reshape(shape) for name, start, end, shape in self._slices}

    def _views_of(self, theta) -> dict:
        """:meth:`views` of ``theta``, kept while it is the same array: the root optimiser's
        buffer that the rounds are given, the optimiser's trial point that the root
        assembles at (cost_grad's). Each set of views costs a few NumPy calls, and every
        rank waits for the root's part of an evaluation."""
        kept = self._kept_views.get(id(theta))
        if kept is None or kept[0] is not theta:
            if len(self._kept_views) > 4:  # arrays of earlier callers
                self._kept_views.clear()
            kept = self._kept_views[id(theta)] = (theta, self.views(theta))
        return kept[1]

    def init_theta(self, seed) -> np.ndarray:
        return init_theta(self.visible, self.hidden, seed)

    def params(self, theta) -> dict:
        """Host float64 copies of W1, W2, b1, b2 (for checkpoints and figures)."""
        theta = self.be.to_host(theta).astype(np.float64, copy=False)
        return {name: np.array(a) for name, a in self.views(theta).items()}

    def new_leaves(self, width=None):
        """A (own blocks, ``width``: n_partials) buffer on the backend, in the model dtype."""
        return self.be.zeros((self.blocks.stop - self.blocks.first, width or self.n_partials))

    # ---- cost and gradient ----------------------------------------------------------
    def shared_sums(self, theta, rows):
        """Each own block's Σ a2 at ``theta`` into the rows of ``rows`` (its first
        ``n_shared`` columns): the first round, whose total :meth:`partials` needs."""
        if self.x is None:
            raise RuntimeError("attach() the samples first")
        p = self._views_of(theta)
        self._shards.activations(p["W1"], p["b1"], self._rows_of(rows, self.n_shared, nodes=False))
        return rows

    def _rows_of(self, buf, width, nodes):
        """Each chunk's rows of ``buf``, its first ``width`` columns: a row per block, or
        with ``nodes`` per tree node of the chunk. Kept while ``buf`` is the same array,
        so that the kernels are given the same views every round."""
        kept = self._round_rows.get((id(buf), width, nodes))
        if kept is None or kept[0] is not buf:
            if len(self._round_rows) > 8:  # buffers of earlier callers
                self._round_rows.clear()
            spans = [slice(c.rows.start, c.rows.start + len(c.nodes)) if nodes else c.rows for c in self._chunks]
            kept = self._round_rows[(id(buf), width, nodes)] = (buf, [buf[span, :width] for span in spans])
        return kept[1]

    def partials(self, theta, leaves, shared) -> dict:
        """The packed sums of this rank's blocks at ``theta``, added up in the fixed tree as
        far as each thread's run of blocks goes: {tree node (level, start): its sums}, each
        a row of ``leaves`` (the first rows of its thread's run; the sums in its first
        ``n_partials`` columns). ``shared`` is the fixed-tree total of every block's
        :meth:`shared_sums` at the same θ (ρ̂ m), which folds the KL term into the
        backward pass."""
        if self.x is None:
            raise RuntimeError("attach() the samples first")
        p = self._views_of(theta)
        rho_hat = np.asarray(self.be.to_host(shared), dtype=np.float64)[:self.n_shared] / self.m_total
        self._shards.partials(p["W1"], p["b1"], p["W2"], p["b2"], self._rows_of(leaves, self.n_partials, nodes=True),
                              (self.rho, self.beta), rho_hat)
        return {node: leaves[chunk.rows.start + i] for chunk in self._chunks for i, node in enumerate(chunk.nodes)}

    def assemble(self, partials, theta64, grad=None):
        """(J, ∂J/∂θ) from the partials summed over every block; float64 on the host."""
        p = self._views_of(np.asarray(theta64, dtype=np.float64))
        return self.K.sparse_ae_assemble(partials, p["W1"], p["W2"], self.m_total,
                                         self.rho, self.beta, self.lam, grad)

    def cost_grad(self, theta64):
        """J and ∂J/∂θ in one process (every block on this process), summed in the same
        fixed tree as over ranks."""
        if self.blocks.first != 0 or self.blocks.stop != self.blocks.count:
            raise RuntimeError("cost_grad needs every block on this process; use a RootOptimizer")
        if self._theta_buf is None:
            self._theta_buf = self.be.zeros(self.n_theta)
            self._shared = self.new_leaves(self.n_shared)
            self._leaves = self.new_leaves()
        self._theta_buf[...] = self.be.asarray(theta64)
        self.shared_sums(self._theta_buf, self._shared)
        shared = tree_sum_rows(self._shared)
        known = self.partials(self._theta_buf, self._leaves, shared)
        return self.assemble(tree_node_from(tree_top(self.blocks.count), 0, known, self.blocks.count), theta64)
