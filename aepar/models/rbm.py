"""A restricted Boltzmann machine layer trained by CD-1 (Hinton & Salakhutdinov 2006).

The recipe (DESIGN.md, "Stacked autoencoder"): learning rate 0.1 for weights and biases,
momentum 0.5 for the first 5 epochs then 0.9, weight cost 2e-4 on W only, batch 100,
W ~ 0.1 N(0, 1), zero biases, hidden *states* sampled for the negative phase, the
reconstruction kept as probabilities, the next layer trained on hidden probabilities.
The code layer uses linear hidden units with unit-variance Gaussian noise (lr 0.001).

Data parallelism keeps the single-process algorithm exactly: every rank draws the same
permutation of the *global* row numbers and the same CD noise for the whole global batch
from ``np.random.default_rng((seed, layer_index, epoch))``, works on the rows of each
global batch that it holds, and one packed Allreduce per step sums the gradients. A given
(seed, layer, epoch, data) therefore gives the same weights on 1, 2 or 4 ranks, up to the
order of floating-point sums.

Without a replica group (one process, or a pipeline stage of one rank) a step is one
kernel call, :func:`rbm_cd_update` of the kernel set: CD-1 and the momentum step with the
weight cost, no gradient arrays. With one, the gradient goes through
``rbm_cd_backward``, the Allreduce and the optimiser; both are the same arithmetic up to
the order of the floating-point operations.
"""
from __future__ import annotations

import numpy as np

from aepar.optim import SGD
from aepar.parallel.data_parallel import GradientPacker

__all__ = ["RBM", "GlobalBatches", "chunked"]

HIDDEN_UNITS = ("bernoulli", "gaussian")
# The CD noise is drawn in float32 whatever the backend's dtype: one stream for float32
# and float64 runs, at half the cost of float64 draws. Float32 uniforms are multiples of
# 2**-24, so a state is on with its probability to within 6e-8.
NOISE_DTYPE = np.float32
# rows per call when transforming or evaluating a whole data set: bounds temporaries
CHUNK = 4096


class GlobalBatches:
    """Minibatches over the rows that all ranks of ``comm`` hold together.

    Rank r holds ``n_local`` consecutive rows of the global data set, after the rows of
    ranks 0..r-1 (any contiguous sharding in rank order, e.g.
    :func:`aepar.parallel.data_parallel.shard`). The permutation is drawn over global row
    numbers, so the batches are those one process holding everything would see; each
    rank yields the local indices of its members of every batch.

    Parameters
    ----------
    n_local : int
        Rows this rank holds.
    batch : int
        Global batch size (the last batch may be smaller).
    rng : numpy.random.Generator
        Draws the permutation; shared state on every rank.
    comm : aepar.comm.Comm or None
        The replica group (None: one process).
    """

    def __init__(self, n_local: int, batch: int, rng, comm=None):
        sizes = comm.allgather_obj(int(n_local)) if comm is not None and comm.size > 1 else [int(n_local)]
        rank = comm.rank if comm is not None and comm.size > 1 else 0
        self.n_total = int(sum(sizes))
        if self.n_total == 0:
            raise ValueError("no rows to train on (every rank's data is empty)")
        self.offset = int(sum(sizes[:rank]))
        self.n_local = int(n_local)
        self.batch = int(batch)
        self.perm = rng.permutation(self.n_total)

    def __len__(self):
        return -(-self.n_total // self.batch)

    def __iter__(self):
        """Yields (global batch size, boolean mask of this rank's members, local row indices)."""
        lo, hi = self.offset, self.offset + self.n_local
        for start in range(0, self.n_total, self.batch):
            rows = self.perm[start:start + self.batch]
            mine = (rows >= lo) & (rows < hi)
            yield rows.size, mine, rows[mine] - lo


def chunked(n: int, size: int = CHUNK):
    """Slices covering range(n) in pieces of at most ``size``."""
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


def _group(comm):
    return comm if comm is not None and comm.size > 1 else None


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
        Global minibatch size (split over the ranks of a data-parallel group).
    seed, layer_index : int
        The weights come from ``default_rng((seed, layer_index))``; the shuffle and the
        CD noise of epoch e from ``default_rng((seed, layer_index, e))``.
    """

    kind = "rbm"

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
        self.grads = {k: be.xp.zeros_like(p) for k, p in self.params.items()}
        self.optimizer = SGD(be, self.params, self.lr, self.momentum[0])
        self.epochs_done = 0
        self._packer = None

    # ---- the schedule ------------------------------------------------------------------
    def momentum_at(self, epoch: int) -> float:
        """Momentum of (0-based) ``epoch``: the first ``momentum_switch_epoch`` use the first value."""
        return self.momentum[0] if epoch < self.momentum_switch_epoch else self.momentum[1]

    def _rng(self, epoch: int):
        return np.random.default_rng((self.seed, self.layer_index, int(epoch)))

    def _zero_grads(self):
        for g in self.grads.values():
            g.fill(0)

    def _sum_over(self, comm, extra):
        """Sum the gradients (and ``extra`` scalars) over the replica group in one Allreduce."""
        if comm is None:
            return np.asarray(extra, dtype=np.float64)
        if self._packer is None:
            self._packer = GradientPacker(self.be, list(self.grads.values()))
        return self._packer.allreduce(comm, list(self.grads.values()), extra=extra)

    # ---- training ------------------------------------------------------------------------
    def train_epoch(self, data, epoch, comm=None) -> float:
        """One CD-1 epoch over ``data`` (this rank's rows).

        Shuffle and CD noise come from ``np.random.default_rng((seed, layer_index, epoch))``
        so a given (seed, layer, epoch, data) gives identical weights wherever it runs.
        With ``comm.size > 1`` (a data-parallel replica group) each step's gradients are
        summed over ``comm`` in one packed Allreduce and the global batch is split over the
        ranks (each rank works on the members of the batch that it holds).

        Parameters
        ----------
        data : array (n_local, n_in)
            This rank's rows, in the backend's array type (converted otherwise).
        epoch : int
            0-based epoch number: picks the momentum and the random stream.
        comm : aepar.comm.Comm or None

        Returns
        -------
        float
            Mean squared reconstruction error per sample (sum over units) over the epoch,
            over all ranks' rows.
        """
        be, K, xp = self.be, self.be.K, self.be.xp
        data = be.asarray(data)
        if data.ndim != 2 or data.shape[1] != self.n_in:
            raise ValueError(f"layer {self.layer_index}: data of shape {data.shape}, expected (rows, {self.n_in})")
        comm = _group(comm)
        rng = self._rng(epoch)
        batches = GlobalBatches(data.shape[0], self.batch, rng, comm)
        momentum = self.momentum_at(epoch)
        p, g, vel = self.params, self.grads, self.optimizer.velocity
        # buffers for the epoch: the noise is drawn on the host (one stream for every backend)
        noise = np.empty((1, self.batch, self.n_out), dtype=NOISE_DTYPE)
        rows = xp.empty((self.batch, self.n_in), dtype=data.dtype)
        total_err = 0.0
        for nb, mine, idx in batches:
            # The whole global batch's noise, so row i sees the same numbers on any rank.
            u = self._draw(rng, noise[:, :nb])
            if comm is None:
                # one process: CD-1 and the momentum step in one kernel, no gradient arrays
                v0 = xp.take(data, xp.asarray(idx), axis=0, out=rows[:nb])
                err = K.rbm_cd_update(v0, p["W"], p["bv"], p["bh"], xp.asarray(u), self.hidden,
                                      vel["W"], vel["bv"], vel["bh"], self.lr, momentum, self.weight_cost)
                total_err += err
                continue
            self._zero_grads()
            err = 0.0
            if idx.size:
                v0 = xp.take(data, xp.asarray(idx), axis=0, out=rows[:idx.size])  # batch order: row i meets noise row i
                mine_u = u if idx.size == nb else u[:, mine, :]
                _, _, err = K.rbm_cd_backward(v0, p["W"], p["bv"], p["bh"], xp.asarray(mine_u), self.hidden,
                                              g["W"], g["bv"], g["bh"])
                if idx.size != nb:  # the kernel averaged over our rows: weight to the global mean
                    for a in g.values():
                        a *= idx.size / nb
            err = float(self._sum_over(comm, [err])[0])
            K.weight_decay_backward(p["W"], self.weight_cost, g["W"])
            self.optimizer.step(g, momentum=momentum)
            total_err += err
        self.epochs_done = max(self.epochs_done, int(epoch) + 1)
        return total_err / batches.n_total

    def _draw(self, rng, out):
        """CD noise into ``out``: uniforms (bernoulli units) or standard normals (gaussian)."""
        if self.hidden == "bernoulli":
            rng.random(out=out, dtype=NOISE_DTYPE)
        else:
            rng.standard_normal(out=out, dtype=NOISE_DTYPE)
        return out

    # ---- inference -----------------------------------------------------------------------
    def _encode(self, x):
        """Hidden probabilities (bernoulli) or means (gaussian) of one chunk of rows."""
        return self.be.K.rbm_hidden(x, self.params["W"], self.params["bh"], self.hidden)

    def _reconstruct(self, x):
        """Visible probabilities of one chunk after one deterministic up-down pass."""
        return self.be.K.rbm_visible(self._encode(x), self.params["W"], self.params["bv"])

    def transform(self, data):
        """The next layer's input: :meth:`_encode` of ``data``, chunk by chunk."""
        return self._chunkwise(self._encode, data, self.n_out)

    def reconstruct(self, data):
        """:meth:`_reconstruct` of ``data``, chunk by chunk."""
        return self._chunkwise(self._reconstruct, data, self.n_in)

    def _chunkwise(self, fn, data, width):
        be = self.be
        data = be.asarray(data)
        out = be.xp.empty((data.shape[0], width), dtype=be.dtype)
        for s in chunked(data.shape[0]):
            out[s] = fn(data[s])
        return out

    def recon_error(self, data, comm=None) -> float:
        """Mean over all ranks' rows of the squared error (summed over units) of :meth:`reconstruct`."""
        return _mean_sq_error(self.be, data, self.reconstruct, comm)

    def flops_per_sample(self) -> float:
        """Floating-point operations of one CD-1 step per sample (the five n_in x n_out
        products: up, down, up again, positive and negative statistics)."""
        return 10.0 * self.n_in * self.n_out + 12.0 * (self.n_in + self.n_out)

    def __repr__(self):
        return f"RBM({self.n_in}-{self.n_out}, {self.hidden}, lr={self.lr})"


def _mean_sq_error(be, data, reconstruct, comm=None) -> float:
    """Σ over rows and units of (x - reconstruct(x))² summed over ranks, / total rows."""
    data = be.asarray(data)
    total = 0.0
    for s in chunked(data.shape[0]):
        total += be.K.mse_forward(reconstruct(data[s]), data[s], scale=2.0)
    sums = np.array([total, data.shape[0]], dtype=np.float64)
    comm = _group(comm)
    if comm is not None:
        comm.allreduce(sums)
    return float(sums[0] / max(sums[1], 1.0))
