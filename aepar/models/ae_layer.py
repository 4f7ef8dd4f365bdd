"""A one-hidden-layer autoencoder as a layer pre-trainer (``--pretrainer ae``).

Sigmoid encoder h = σ(x W + bh) (identity code units for the last, linear layer), sigmoid
decoder x̂ = σ(h Wᵀ + bv) with the weights tied, so its parameters have the RBM's names
and shapes and drop into the unrolled stack the same way. Squared error, SGD with
momentum, weight cost on W; blocks, batches, shuffling and data parallelism as in
:class:`aepar.models.rbm.RBM` (same seeds, the same steps on any number of ranks).
"""
from __future__ import annotations

from aepar.models.rbm import RBM

__all__ = ["AELayer"]


class AELayer(RBM):
    """Tied-weight autoencoder layer with the :class:`RBM` constructor and methods.

    ``hidden="bernoulli"`` gives sigmoid code units, ``"gaussian"`` linear ones (no noise:
    the name only mirrors the RBM's code layer).
    """

    kind = "ae"

    @property
    def code_act(self) -> str:
        return "sigmoid" if self.hidden == "bernoulli" else "identity"

    def _forward(self, x):
        """(h, W transposed, x̂) for a batch."""
        K, p = self.be.K, self.params
        h = K.dense_forward(x, p["W"], p["bh"], self.code_act)
        # a contiguous copy: compiled kernels hand their operands to BLAS as they are
        Wt = self.be.xp.ascontiguousarray(p["W"].T)
        return h, Wt, K.dense_forward(h, Wt, p["bv"], "sigmoid")

    n_extra = 1  # a step reports Σ‖x̂ − x‖² over its rows
    # the RBM's fused step and factors are CD-1's: an autoencoder layer takes the general path
    fused_step = block_factors = None

    def leaf_gradient(self, x, rng, scale, grads):
        """Add one block's gradient of ½ Σ(x̂ − x)², scaled by ``scale``, into ``grads``.
        Returns (Σ‖x̂ − x‖²,)."""
        K, p = self.be.K, self.params
        h, Wt, y = self._forward(x)
        err = K.mse_forward(y, x, scale=2.0)  # Σ (x̂ − x)²
        dy = K.mse_backward(y, x, scale=scale)
        dWt = self.be.zeros((self.n_out, self.n_in))
        dh = K.dense_backward(dy, h, Wt, y, "sigmoid", dWt, grads["bv"])
        K.dense_backward(dh, x, p["W"], h, self.code_act, grads["W"], grads["bh"], need_dx=False)
        grads["W"] += dWt.T
        return (err,)

    def _encode(self, x):
        """Code units σ(x W + bh) (identity for the code layer): the next layer's input."""
        return self.be.K.dense_forward(x, self.params["W"], self.params["bh"], self.code_act)

    def _reconstruct(self, x):
        """x̂ = σ(h Wᵀ + bv)."""
        return self._forward(x)[2]

    def flops_per_sample(self) -> float:
        """Encoder and decoder products forward, three products backward."""
        return 10.0 * self.n_in * self.n_out + 10.0 * (self.n_in + self.n_out)

    def __repr__(self):
        return f"AELayer({self.n_in}-{self.n_out}, {self.code_act}, lr={self.lr})"
