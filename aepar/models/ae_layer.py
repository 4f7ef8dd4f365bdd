"""A one-hidden-layer autoencoder as a layer pre-trainer (``--pretrainer ae``).

Sigmoid encoder h = σ(x W + bh) (identity code units for the last, linear layer), sigmoid
decoder x̂ = σ(h Wᵀ + bv) with the weights tied, so its parameters have the RBM's names
and shapes and drop into the unrolled stack the same way. Squared error, SGD with
momentum, weight cost on W; blocks, batches, shuffling and data parallelism as in
:class:`aepar.models.rbm.RBM` (same seeds, the same steps on any number of ranks).
"""
from __future__ import annotations

from aepar.models.rbm import RBM
from aepar.models.trained import factors_by_group

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

    n_extra = 1  # a step reports Σ‖x̂ − x‖² over its rows
    factored = ("W",)  # the trainer adds the blocks' W gradients from block_factors' factors

    def fused_step(self, x, rng, epoch):
        """One whole batch on one process: the gradient, the weight cost and the momentum
        step in one kernel call (``tied_ae_update``: on the CPU the blocked path's bits, on
        the GPU ten launches instead of about twenty; no noise, so ``rng`` is not used).
        Returns (Σ‖x̂ − x‖²,)."""
        p, v = self.params, self.optimizer.velocity
        return (self.be.K.tied_ae_update(x, p["W"], p["bv"], p["bh"], self.code_act, v["W"], v["bv"], v["bh"],
                                         self.lr, self.momentum_at(epoch), self.weight_cost),)

    def fused_blocks_step(self, x, starts, rngs, merges, scale, epoch):
        """:meth:`group_factors`, the blocks' gradients and sums added in the tree ``merges``
        and the step in one kernel call (``tied_ae_update_blocks``), with the bits of the
        three. No noise: ``rngs`` is not used. Returns (Σ‖x̂ − x‖²,), the blocks' added in
        the tree."""
        p, v = self.params, self.optimizer.velocity
        return (self.be.K.tied_ae_update_blocks(x, p["W"], p["bv"], p["bh"], self.code_act, starts, merges, v["W"],
                                                v["bv"], v["bh"], self.lr, self.momentum_at(epoch), self.weight_cost,
                                                scale),)

    def leaf_gradient(self, x, rng, scale, grads):
        """Add one block's gradient of ½ Σ(x̂ − x)², scaled by ``scale``, into ``grads``.
        Returns (Σ‖x̂ − x‖²,)."""
        (sums,), (factors,) = self.block_factors([x], [rng], scale, [grads])
        A, D, _ = factors["W"]  # the parts (x, dz2) and (dz1, h); alpha is 1 (block_factors)
        xp = self.be.xp
        grads["W"] += xp.concatenate(A).T @ xp.concatenate(D)  # [x; dz2].T @ [dz1; h]: one product for both
        return sums

    def block_factors(self, xs, rngs, scale, grads):
        """:meth:`leaf_gradient` of several blocks, their W gradients left as factors: adds
        each block's bias gradients into its ``grads`` dict and returns ([(Σ‖x̂ − x‖²,)],
        [{"W": (A, D, 1.0)}]), one entry per block. The blocks are stacked in one group per
        thread, each group's layers one kernel call each (:meth:`group_factors`)."""
        return factors_by_group(self.group_factors, self.be.xp, xs, rngs, scale, grads)

    def group_factors(self, x, starts, rngs, grads, scale):
        """Consecutive blocks' stacked rows ``x`` (block b: rows starts[b]:starts[b + 1])
        forward and back in one kernel call (``tied_ae_factors_blocks``), with each block's
        own bits: adds block b's bias gradients into ``grads[b]`` and returns ([(Σ‖x̂ − x‖²,)]
        per block, {"W": (A, D, starts, 1.0)}). W is tied, so its gradient has an encoder
        part x.T @ dz1 and a decoder part (h.T @ dz2).T = dz2.T @ h: A = [x; dz2], D = [dz1;
        h], given as their parts, A = (x, dz2) and D = (dz1, h) (kernels' ``block_outer_sum``
        runs each block's chain over both; stacking them into one array was a copy of four
        activations a step). No noise: ``rngs`` is not used."""
        p = self.params
        errs, dz2, dz1, h = self.be.K.tied_ae_factors_blocks(x, p["W"], p["bv"], p["bh"], self.code_act,
                                                             [g["bv"] for g in grads], [g["bh"] for g in grads],
                                                             starts, scale)
        return [(err,) for err in errs], {"W": ((x, dz2), (dz1, h), starts, 1.0)}

    def _encode(self, x):
        """Code units σ(x W + bh) (identity for the code layer): the next layer's input."""
        return self.be.K.dense_forward(x, self.params["W"], self.params["bh"], self.code_act)

    def _reconstruct(self, x):
        """x̂ = σ(h Wᵀ + bv) (the tied decoder's weight: the view W.T, taken as it is)."""
        return self.be.K.dense_forward(self._encode(x), self.params["W"].T, self.params["bv"], "sigmoid")

    def flops_per_sample(self) -> float:
        """Encoder and decoder products forward, three products backward."""
        return 10.0 * self.n_in * self.n_out + 10.0 * (self.n_in + self.n_out)

    def __repr__(self):
        return f"AELayer({self.n_in}-{self.n_out}, {self.code_act}, lr={self.lr})"
