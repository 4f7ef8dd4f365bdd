"""Ng's sparse autoencoder (CS294A/UFLDL): one sigmoid hidden layer, sigmoid outputs.

J(θ) = (1/2m) Σ‖a3 − x‖² + (λ/2)(‖W1‖² + ‖W2‖²) + β Σ_j KL(ρ ‖ ρ̂_j),

with ρ̂ the mean hidden activation over all m samples on all ranks. A model holds one
shard of the samples; :meth:`SparseAutoencoder.partials` fills the packed buffer of sums
that ONE reduction turns into the global ones, and :meth:`SparseAutoencoder.assemble`
(on the root) turns the summed buffer into J and ∂J/∂θ (see
:mod:`aepar.kernels.ref.sparse_ae` for the formulation and the buffer layout).

θ is a flat float64 vector on the host (the optimiser's), packed W1 (v×h, row-major),
W2 (h×v, row-major), b1 (h), b2 (v). The kernels work in the model dtype on the
backend's device; a θ buffer of that dtype is what the ranks broadcast.
"""
from __future__ import annotations

import numpy as np

__all__ = ["SparseAutoencoder", "init_theta"]


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

    Use :meth:`attach` to give it its samples, then :meth:`partials` on every rank and
    :meth:`assemble` on the root (or :meth:`cost_grad` in one process).
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
        self.x = None
        self.m_total = 0
        self.ws = None
        self._theta_buf = None  # for cost_grad

    # ---- data -----------------------------------------------------------------------
    def attach(self, x_local, m_total: int | None = None, block: int | None = None):
        """Give the model its shard ``x_local`` (m_local, v) of ``m_total`` samples in all.

        The shard is copied to the backend in the model dtype (a private copy: the CPU
        kernels keep it repacked in their workspace, which must not go stale); the
        workspace is made here, once. When the shard is everything (one process), the KL
        gradient is folded into the backward pass directly (one GEMM fewer).
        """
        x_local = np.asarray(x_local)
        if x_local.ndim != 2 or x_local.shape[1] != self.visible:
            raise ValueError(f"samples must be (m, {self.visible}), got {x_local.shape}")
        self.x = self.be.xp.array(self.be.asarray(x_local), order="C", copy=True)
        self.m_total = int(x_local.shape[0] if m_total is None else m_total)
        self.ws = self.K.sparse_ae_workspace(self.x.shape[0], self.visible, self.hidden,
                                             self.be.dtype, block)
        return self

    @property
    def m_local(self) -> int:
        return 0 if self.x is None else int(self.x.shape[0])

    @property
    def whole(self) -> bool:
        """True when this shard holds every sample."""
        return self.m_local == self.m_total

    # ---- parameters -----------------------------------------------------------------
    def views(self, theta) -> dict:
        """W1, W2, b1, b2 as views into a packed θ (any array type and dtype)."""
        return {name: theta[start:end].reshape(shape) for name, start, end, shape in self._slices}

    def init_theta(self, seed) -> np.ndarray:
        return init_theta(self.visible, self.hidden, seed)

    def params(self, theta) -> dict:
        """Host float64 copies of W1, W2, b1, b2 (for checkpoints and figures)."""
        theta = self.be.to_host(theta).astype(np.float64, copy=False)
        return {name: np.array(a) for name, a in self.views(theta).items()}

    def new_partials(self):
        """A packed partials buffer on the backend, in the model dtype."""
        return self.be.zeros(self.n_partials)

    # ---- cost and gradient ----------------------------------------------------------
    def partials(self, theta, out):
        """This shard's packed sums at ``theta`` (a backend array of the model dtype)."""
        if self.x is None:
            raise RuntimeError("attach() the samples first")
        p = self.views(theta)
        kl = (self.rho, self.beta) if self.whole else None
        return self.K.sparse_ae_partials(self.x, p["W1"], p["b1"], p["W2"], p["b2"], out, self.ws, kl)

    def assemble(self, partials, theta64, grad=None):
        """(J, ∂J/∂θ) from the partials summed over every shard; float64 on the host."""
        p = self.views(np.asarray(theta64, dtype=np.float64))
        return self.K.sparse_ae_assemble(partials, p["W1"], p["W2"], self.m_total,
                                         self.rho, self.beta, self.lam, grad)

    def cost_grad(self, theta64):
        """J and ∂J/∂θ in one process (the shard must be everything)."""
        if not self.whole:
            raise RuntimeError("cost_grad needs every sample on this process; use a RootOptimizer")
        if self._theta_buf is None:
            self._theta_buf = self.be.zeros(self.n_theta)
            self._partials = self.new_partials()
        self._theta_buf[...] = self.be.asarray(theta64)
        self.partials(self._theta_buf, self._partials)
        return self.assemble(self._partials, theta64)
