"""The unrolled deep autoencoder (Hinton & Salakhutdinov 2006), e.g. 784-1000-500-250-30-250-500-1000-784.

Built from pre-trained layers: encoder layer i takes layer i's W and hidden bias, decoder
layer i its Wᵀ and visible bias; the decoder weights are copies, so encoder and decoder
are untied during fine-tuning. Logistic units everywhere except the linear code layer.

Loss: squared error ½ Σ(x̂ − x)² per image (the seed's choice, ``loss="mse"``) or pixel
cross-entropy from the output logits (``loss="xent"``, Hinton's fine-tuning objective).
The reported figure is :meth:`StackedAutoencoder.error_per_digit`: Σ over the pixels of
(x − x̂)², averaged over images, for either loss.

Data parallelism: the global minibatch is split over the ranks as in
:class:`aepar.models.rbm.GlobalBatches` (the same batches as one process), the gradients
are scaled by 1/global batch and summed in one packed Allreduce per step.
"""
from __future__ import annotations

import numpy as np

from aepar.models.rbm import GlobalBatches, _group, chunked
from aepar.parallel.data_parallel import GradientPacker

__all__ = ["StackedAutoencoder", "LOSSES", "FINETUNE_STREAM"]

LOSSES = ("mse", "xent")
# random-stream id of fine-tuning shuffles: (seed, FINETUNE_STREAM, epoch), apart from the layers'
FINETUNE_STREAM = 1000


class StackedAutoencoder:
    """Encoder sizes ``sizes`` = [n_in, h1, ..., code], unrolled into 2(len(sizes)-1) dense layers.

    Parameters
    ----------
    be : aepar.backend.Backend
    sizes : list of int
    loss : {"mse", "xent"}
    seed : int
        For the random initialisation used when no pre-trained layers are given
        (0.1·N(0,1) weights, zero biases).

    Attributes
    ----------
    params : dict
        "W1".."W{2n}", "b1".."b{2n}" (W_i: (dims[i-1], dims[i])), in order from the input.
    acts : list of str
        Activation of each dense layer ("identity" for the code and, with xent, the logits).
    """

    def __init__(self, be, sizes, *, loss="mse", seed=0):
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, not {loss!r}")
        if len(sizes) < 2:
            raise ValueError(f"need at least an input and a code size, got {sizes}")
        self.be, self.loss = be, loss
        self.sizes = [int(s) for s in sizes]
        n = len(self.sizes) - 1
        self.dims = self.sizes + self.sizes[-2::-1]
        self.n_layers = 2 * n
        # logistic units, linear code; with xent the last layer emits logits
        self.acts = ["sigmoid"] * (n - 1) + ["identity"] + ["sigmoid"] * (n - 1) + \
                    ["sigmoid" if loss == "mse" else "identity"]
        rng = np.random.default_rng((int(seed), FINETUNE_STREAM))
        self.params = {}
        for i in range(self.n_layers):
            self.params[f"W{i + 1}"] = be.asarray(0.1 * rng.standard_normal((self.dims[i], self.dims[i + 1])))
            self.params[f"b{i + 1}"] = be.zeros(self.dims[i + 1])
        self.grads = {k: be.xp.zeros_like(p) for k, p in self.params.items()}
        self._packer = None

    @classmethod
    def from_layers(cls, be, layers, *, loss="mse"):
        """Unroll pre-trained layers (objects with ``params`` {"W", "bv", "bh"}, e.g. RBM/AELayer).

        Encoder i: (W, bh) of layer i; decoder: (Wᵀ, bv) of the layers in reverse order.
        The arrays are copies: the layers are left as they were.
        """
        sizes = [int(layers[0].params["W"].shape[0])] + [int(l.params["W"].shape[1]) for l in layers]
        model = cls(be, sizes, loss=loss)
        n = len(layers)
        xp = be.xp
        for i, layer in enumerate(layers):
            p = layer.params
            model.params[f"W{i + 1}"][...] = be.asarray(p["W"])
            model.params[f"b{i + 1}"][...] = be.asarray(p["bh"])
            j = 2 * n - i  # the mirrored decoder layer
            model.params[f"W{j}"][...] = xp.ascontiguousarray(be.asarray(p["W"]).T)
            model.params[f"b{j}"][...] = be.asarray(p["bv"])
        return model

    # ---- forward / backward --------------------------------------------------------------
    def forward(self, x):
        """Activations [x, a1, ..., a_{2n}] of a batch; with xent the last one is the logits."""
        K, p = self.be.K, self.params
        acts = [x]
        for i in range(self.n_layers):
            acts.append(K.dense_forward(acts[-1], p[f"W{i + 1}"], p[f"b{i + 1}"], self.acts[i]))
        return acts

    def reconstruct(self, x):
        """x̂ in [0, 1] for the rows of ``x`` (chunked)."""
        be = self.be
        x = be.asarray(x)
        out = be.xp.empty_like(x)
        for s in chunked(x.shape[0]):
            y = self.forward(x[s])[-1]
            out[s] = y if self.loss == "mse" else be.K.sigmoid_forward(y)
        return out

    def encode(self, x):
        """The codes (linear units of the middle layer) of the rows of ``x``."""
        be, K, p = self.be, self.be.K, self.params
        x = be.asarray(x)
        n = self.n_layers // 2
        out = be.xp.empty((x.shape[0], self.sizes[-1]), dtype=be.dtype)
        for s in chunked(x.shape[0]):
            a = x[s]
            for i in range(n):
                a = K.dense_forward(a, p[f"W{i + 1}"], p[f"b{i + 1}"], self.acts[i])
            out[s] = a
        return out

    def loss_and_grad(self, x, scale=None):
        """Loss of a batch and its gradients, *added* into ``self.grads`` (zero them first).

        Parameters
        ----------
        x : array (batch, n_in)
            Inputs, also the targets.
        scale : float or None
            Multiplies the summed loss and the gradients (default 1/batch; data-parallel
            callers pass 1/global batch).

        Returns
        -------
        (loss, sq_err) : floats
            The scaled loss and Σ (x − x̂)² over the batch.
        """
        K, p, g = self.be.K, self.params, self.grads
        scale = 1.0 / x.shape[0] if scale is None else float(scale)
        acts = self.forward(x)
        out = acts[-1]
        if self.loss == "mse":
            loss = K.mse_forward(out, x, scale=scale)
            sq_err = loss * 2.0 / scale if scale else K.mse_forward(out, x, scale=2.0)
            da = K.mse_backward(out, x, scale=scale)
        else:
            loss, y = K.sigmoid_xent_forward(out, x, scale=scale)
            sq_err = K.mse_forward(y, x, scale=2.0)
            da = K.sigmoid_xent_backward(y, x, scale=scale)  # d/dlogits: through "identity"
        for i in reversed(range(self.n_layers)):
            da = K.dense_backward(da, acts[i], p[f"W{i + 1}"], acts[i + 1], self.acts[i],
                                  g[f"W{i + 1}"], g[f"b{i + 1}"], need_dx=i > 0)
        return loss, sq_err

    def zero_grads(self):
        for a in self.grads.values():
            a.fill(0)

    # ---- training and evaluation ---------------------------------------------------------
    def train_epoch(self, data, epoch, optimizer, comm=None, batch=100, seed=0):
        """One epoch of minibatch backprop over ``data`` (this rank's rows).

        The shuffle comes from ``default_rng((seed, FINETUNE_STREAM, epoch))`` over global
        row numbers, so 1 or many ranks see the same batches; each step's gradients (scaled
        by 1/global batch) are summed over ``comm`` in one packed Allreduce, then
        ``optimizer.step(grads)`` runs identically on every rank.

        Returns
        -------
        (mean loss per sample, mean squared error per digit), both over the epoch's batches
        as they were seen (before each step's update).
        """
        be, xp = self.be, self.be.xp
        data = be.asarray(data)
        if data.ndim != 2 or data.shape[1] != self.sizes[0]:
            raise ValueError(f"data of shape {data.shape}, expected (rows, {self.sizes[0]})")
        comm = _group(comm)
        batches = GlobalBatches(data.shape[0], batch, np.random.default_rng((int(seed), FINETUNE_STREAM, int(epoch))),
                                comm)
        total = np.zeros(2)
        for nb, _, idx in batches:
            self.zero_grads()
            sums = np.zeros(2)
            if idx.size:
                loss, sq_err = self.loss_and_grad(data[xp.asarray(idx)], scale=1.0 / nb)
                sums[:] = (loss * nb, sq_err)
            if comm is not None:
                if self._packer is None:
                    self._packer = GradientPacker(be, list(self.grads.values()))
                sums = self._packer.allreduce(comm, list(self.grads.values()), extra=sums)
            optimizer.step(self.grads)
            total += sums
        return float(total[0] / batches.n_total), float(total[1] / batches.n_total)

    def error_per_digit(self, x, comm=None) -> float:
        """Mean over the images of all ranks of Σ_pixels (x − x̂)², pixels in [0, 1]."""
        be = self.be
        x = be.asarray(x)
        sums = np.zeros(2)
        for s in chunked(x.shape[0]):
            sums[0] += be.K.mse_forward(self.reconstruct(x[s]), x[s], scale=2.0)
        sums[1] = x.shape[0]
        comm = _group(comm)
        if comm is not None:
            comm.allreduce(sums)
        return float(sums[0] / max(sums[1], 1.0))

    def flops_per_sample(self) -> float:
        """One forward and backward pass: three products per weight matrix."""
        return 6.0 * sum(self.dims[i] * self.dims[i + 1] for i in range(self.n_layers))

    def __repr__(self):
        return f"StackedAutoencoder({'-'.join(map(str, self.dims))}, loss={self.loss})"
