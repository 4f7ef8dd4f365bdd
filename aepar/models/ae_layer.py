"""A one-hidden-layer autoencoder as a layer pre-trainer (``--pretrainer ae``).

Sigmoid encoder h = σ(x W + bh) (identity code units for the last, linear layer), sigmoid
decoder x̂ = σ(h Wᵀ + bv) with the weights tied, so its parameters have the RBM's names
and shapes and drop into the unrolled stack the same way. Squared error, SGD with
momentum, weight cost on W; batches, shuffling and data parallelism as in
:class:`aepar.models.rbm.RBM` (same seeds, same global batches on any number of ranks).
"""
from __future__ import annotations

from aepar.models.rbm import RBM, GlobalBatches, _group

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

    def train_epoch(self, data, epoch, comm=None) -> float:
        """One epoch of minibatch SGD on ½ Σ(x̂ − x)² / batch; see :meth:`RBM.train_epoch`.

        Returns the mean squared reconstruction error per sample over the epoch.
        """
        be, K, xp = self.be, self.be.K, self.be.xp
        data = be.asarray(data)
        if data.ndim != 2 or data.shape[1] != self.n_in:
            raise ValueError(f"layer {self.layer_index}: data of shape {data.shape}, expected (rows, {self.n_in})")
        comm = _group(comm)
        batches = GlobalBatches(data.shape[0], self.batch, self._rng(epoch), comm)
        momentum = self.momentum_at(epoch)
        p, g = self.params, self.grads
        dWt = be.zeros((self.n_out, self.n_in))
        total_err = 0.0
        for nb, _, idx in batches:
            self._zero_grads()
            err = 0.0
            if idx.size:
                x = data[xp.asarray(idx)]
                h, Wt, y = self._forward(x)
                err = K.mse_forward(y, x, scale=2.0)  # Σ (x̂ − x)²
                dy = K.mse_backward(y, x, scale=1.0 / nb)  # global-batch mean
                dWt.fill(0)
                dh = K.dense_backward(dy, h, Wt, y, "sigmoid", dWt, g["bv"])
                K.dense_backward(dh, x, p["W"], h, self.code_act, g["W"], g["bh"], need_dx=False)
                g["W"] += dWt.T
            err = float(self._sum_over(comm, [err])[0])
            K.weight_decay_backward(p["W"], self.weight_cost, g["W"])
            self.optimizer.step(g, momentum=momentum)
            total_err += err
        self.epochs_done = max(self.epochs_done, int(epoch) + 1)
        return total_err / batches.n_total

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
