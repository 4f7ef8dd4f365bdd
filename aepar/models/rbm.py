"""A restricted Boltzmann machine layer trained by CD-1 (Hinton & Salakhutdinov 2006).

The recipe (docs/architecture.md, "Training recipes"): learning rate 0.1 for weights and biases,
momentum 0.5 for the first 5 epochs then 0.9, weight cost 2e-4 on W only, batch 100,
W ~ 0.1 N(0, 1), zero biases, hidden *states* sampled for the negative phase, the
reconstruction kept as probabilities, the next layer trained on hidden probabilities.
The code layer uses linear hidden units with unit-variance Gaussian noise (lr 0.001).

The model provides the pieces of a step (a block's gradient, the optimiser's step, a fused
step); the trainer is :func:`aepar.parallel.data_parallel.train_epoch`: the rows are cut into
fixed blocks, every block shuffles its rows with its own stream
``default_rng((seed, layer_index, epoch, block))`` and draws the CD noise of its rows
from it, each block's CD gradient is computed alone and the blocks' gradients are added
in one fixed tree, then one SGD-with-momentum step (weight cost on W) runs on every rank.
The W gradients are added from the blocks' chains (``block_factors``: [v0; vk] and the
hidden rows, scaled as each kernel set factors them) by one ``block_outer_sum`` per tree
node, never written out block by block.
A given (seed, layer, epoch, data, blocks) gives bit-identical weights on 1 process or
any number of ranks and threads. With the data as one block (``--reduce-blocks 1``, one
process) a step is one fused kernel instead, ``rbm_cd_update``.
"""
from __future__ import annotations

import numpy as np

from aepar.models.trained import factors_by_group
from aepar.optim import SGD
from aepar.rows import Shard, mean_squared_error

__all__ = ["RBM"]

HIDDEN_UNITS = ("bernoulli", "gaussian")
# The CD noise is drawn in float32 whatever the backend's dtype: one stream for float32
# and float64 runs, at half the cost of float64 draws. Float32 uniforms are multiples of
# 2**-24, so a state is on with its probability to within 6e-8.
NOISE_DTYPE = np.float32


class RBM:
    """One RBM layer; ``params = {"W": (n_in, n_out), "bv": (n_in,), "bh": (n_out,)}`` on be.xp.

    Parameters
    ----------
    be : aepar.backend.Backend
    n_in, n_out : int
        Visible and hidden units.
    hidden : {"bernoulli", "gaussian"}
        Binary stochastic hidden units, or linear ones with unit-variance Gaussian noise
        (the code layer).
    lr, weight_cost : float
        Learning rate for weights and biases; L2 cost on W only.
    momentum : (float, float)
        Momentum before and from ``momentum_switch_epoch`` on (epochs count from 0).
    batch : int
        Global minibatch size (its rows come from every block of the data).
    seed, layer_index : int
        The weights come from ``default_rng((seed, layer_index))``; block b's shuffle and
        CD noise in epoch e from ``default_rng((seed, layer_index, e, b))``.
    """

    kind = "rbm"
    n_extra = 1  # a step reports Σ‖v1 − v0‖² over its rows

    def __init__(self, be, n_in, n_out, *, hidden="bernoulli", lr=0.1, weight_cost=2e-4,
                 momentum=(0.5, 0.9), momentum_switch_epoch=5, batch=100, seed=0, layer_index=0):
        if hidden not in HIDDEN_UNITS:
            raise ValueError(f"hidden units must be one of {HIDDEN_UNITS}, not {hidden!r}")
        if n_in < 1 or n_out < 1 or batch < 1:
            raise ValueError(f"RBM needs positive sizes, got {n_in}x{n_out}, batch {batch}")
        self.be, self.n_in, self.n_out, self.hidden = be, int(n_in), int(n_out), hidden
        self.lr, self.weight_cost = float(lr), float(weight_cost)
        self.momentum = tuple(float(m) for m in momentum)
        self.momentum_switch_epoch = int(momentum_switch_epoch)
        self.batch, self.seed, self.layer_index = int(batch), int(seed), int(layer_index)
        init = np.random.default_rng((self.seed, self.layer_index))
        self.params = {"W": be.asarray(0.1 * init.standard_normal((self.n_in, self.n_out))),
                       "bv": be.zeros(self.n_in), "bh": be.zeros(self.n_out)}
        self.optimizer = SGD(be, self.params, self.lr, self.momentum[0])
        self.epochs_done = 0

    # ---- the schedule ------------------------------------------------------------------
    def momentum_at(self, epoch: int) -> float:
        """Momentum of (0-based) ``epoch``: the first ``momentum_switch_epoch`` use the first value."""
        return self.momentum[0] if epoch < self.momentum_switch_epoch else self.momentum[1]

    @property
    def key(self) -> tuple:
        """The random-stream key of this layer's training."""
        return (self.seed, self.layer_index)

    # ---- training: one block's gradient, one step -----------------------------------------
    def grad_shapes(self) -> dict:
        return {k: tuple(p.shape) for k, p in self.params.items()}

    def leaf_gradient(self, x, rng, scale, grads):
        """Add one block's CD-1 gradient, scaled by ``scale`` (1/global batch), into
        ``grads``; its noise from the block's stream ``rng``. Returns (Σ‖v1 − v0‖²,)."""
        be, p = self.be, self.params
        noise = self._noise([rng], [0, x.shape[0]])
        _, _, err = be.K.rbm_cd_backward(x, p["W"], p["bv"], p["bh"], noise, self.hidden,
                                         grads["W"], grads["bv"], grads["bh"], scale)
        return (err,)

    factored = ("W",)  # the trainer adds the blocks' W gradients from block_factors' factors

    def block_factors(self, xs, rngs, scale, grads):
        """:meth:`leaf_gradient` of several blocks, their W gradients left as factors: adds
        each block's bias gradients into its ``grads`` dict and returns ([(Σ‖v1 − v0‖²,)],
        [{"W": (A, D, alpha)}]), one entry per block, the block's W gradient being
        alpha * A.T @ D (the same noise as leaf_gradient). The blocks are stacked in one
        group per thread, each group's chains one call of :meth:`group_factors`."""
        return factors_by_group(self.group_factors, self.be.xp, xs, rngs, scale, grads)

    def group_factors(self, x, starts, rngs, grads, scale):
        """The CD-1 chains of consecutive blocks' stacked rows ``x`` (block b: rows
        starts[b]:starts[b + 1], its noise from ``rngs[b]``) in one kernel call
        (``rbm_cd_factors_blocks``), with each block's own bits: adds block b's bias
        gradients into ``grads[b]`` and returns ([(Σ‖v1 − v0‖²,)] per block, {"W": (A, D,
        2 starts, alpha)}): block b's W gradient is alpha times its rows of A (2 starts[b]
        on), transposed, times its rows of D."""
        be, p = self.be, self.params
        noise = self._noise(rngs, starts)  # each block's draws from its own stream, as alone
        a, d, alpha, errs = be.K.rbm_cd_factors_blocks(
            x, p["W"], p["bv"], p["bh"], noise, self.hidden, [g["bv"] for g in grads],
            [g["bh"] for g in grads], starts, scale)
        return [(err,) for err in errs], {"W": (a, d, 2 * np.asarray(starts), alpha)}

    def fused_step(self, x, rng, epoch):
        """One whole batch on one process: CD-1, weight cost and the momentum step in one
        kernel (no gradient arrays). Returns (Σ‖v1 − v0‖²,)."""
        be, p, v = self.be, self.params, self.optimizer.velocity
        noise = self._noise([rng], [0, x.shape[0]])
        err = be.K.rbm_cd_update(x, p["W"], p["bv"], p["bh"], noise, self.hidden, v["W"], v["bv"],
                                 v["bh"], self.lr, self.momentum_at(epoch), self.weight_cost)
        return (err,)

    def fused_blocks_step(self, x, starts, rngs, merges, scale, epoch):
        """:meth:`group_factors`, the blocks' gradients and sums added in the tree ``merges``
        and :meth:`apply`'s step in one kernel call (``rbm_cd_update_blocks``), with the
        bits of the three. Returns (Σ‖v1 − v0‖²,), the blocks' added in the tree."""
        p, v = self.params, self.optimizer.velocity
        noise = self._noise(rngs, starts)
        return (self.be.K.rbm_cd_update_blocks(x, p["W"], p["bv"], p["bh"], noise, self.hidden, starts, merges,
                                               v["W"], v["bv"], v["bh"], self.lr, self.momentum_at(epoch),
                                               self.weight_cost, scale),)

    def apply(self, grads, epoch):
        """The step: SGD with the epoch's momentum, the weight cost added to W's gradient
        inside it (one pass over W)."""
        self.optimizer.step(grads, momentum=self.momentum_at(epoch), weight_decay={"W": self.weight_cost})

    def _noise(self, rngs, starts):
        """The chain's noise (1, rows, n_out) on the backend, rows starts[i]:starts[i+1] from
        the stream ``rngs[i]``: uniforms (bernoulli units), made by the kernel set where its
        arrays live, or standard normals (gaussian), drawn on the host."""
        be, rows = self.be, int(starts[-1])
        if self.hidden == "bernoulli":
            noise = be.xp.empty((1, rows, self.n_out), dtype=NOISE_DTYPE)
            be.K.uniform_rows(rngs, starts, noise[0])
            return noise
        noise = np.empty((1, rows, self.n_out), dtype=NOISE_DTYPE)
        for lo, hi, rng in zip(starts[:-1], starts[1:], rngs):
            rng.standard_normal(out=noise[:, lo:hi], dtype=NOISE_DTYPE)
        return be.xp.asarray(noise)

    # ---- checkpoints -----------------------------------------------------------------------
    def state(self) -> dict:
        """Parameters and velocities (host arrays) for a checkpoint."""
        out = {f"params/{k}": self.be.to_host(v) for k, v in self.params.items()}
        out.update({f"opt/{k}": self.be.to_host(v) for k, v in self.optimizer.state().items()})
        return out

    def load_state(self, state: dict):
        for k in self.params:
            self.params[k][...] = self.be.asarray(state[f"params/{k}"])
        self.optimizer.load_state({k[4:]: v for k, v in state.items() if k.startswith("opt/")})

    # ---- inference -----------------------------------------------------------------------
    def _encode(self, x):
        """Hidden probabilities (bernoulli) or means (gaussian) of one chunk of rows."""
        return self.be.K.rbm_hidden(x, self.params["W"], self.params["bh"], self.hidden)

    def _reconstruct(self, x):
        """Visible probabilities of one chunk after one deterministic up-down pass."""
        return self.be.K.rbm_visible(self._encode(x), self.params["W"], self.params["bv"])

    def transform(self, shard: Shard) -> Shard:
        """The next layer's input: :meth:`_encode` of every row, block by block."""
        return shard.map_rows(self._encode, self.n_out, self.be.xp, self.be.dtype)

    def reconstruct(self, shard: Shard) -> Shard:
        return shard.map_rows(self._reconstruct, self.n_in, self.be.xp, self.be.dtype)

    def recon_error(self, shard: Shard, reduce=None) -> float:
        """Mean over all rows of the squared error (summed over units) of :meth:`_reconstruct`.

        ``reduce(shard, fn) -> vector`` sums ``fn`` over every rank's rows
        (aepar.parallel.data_parallel.reducer); None: this process holds every block
        (:func:`aepar.rows.local_sums`).
        """
        return mean_squared_error(shard, self._reconstruct, self.be.K.mse_forward, reduce)

    def flops_per_sample(self) -> float:
        """Floating-point operations of one CD-1 step per sample (the five n_in x n_out
        products: up, down, up again, positive and negative statistics)."""
        return 10.0 * self.n_in * self.n_out + 12.0 * (self.n_in + self.n_out)

    def __repr__(self):
        return f"RBM({self.n_in}-{self.n_out}, {self.hidden}, lr={self.lr})"
