"""The unrolled deep autoencoder (Hinton & Salakhutdinov 2006), e.g. 784-1000-500-250-30-250-500-1000-784.

Built from pre-trained layers: encoder layer i takes layer i's W and hidden bias, decoder
layer i its Wᵀ and visible bias; the decoder weights are copies, so encoder and decoder
are untied during fine-tuning. Logistic units everywhere except the linear code layer.

Loss: squared error ½ Σ(x̂ − x)² per image (the paper's choice, ``loss="mse"``) or pixel
cross-entropy from the output logits (``loss="xent"``, Hinton's fine-tuning objective).
The reported figure is :meth:`StackedAutoencoder.error_per_digit`: Σ over the pixels of
(x − x̂)², averaged over images, for either loss.

The model provides the pieces of a step (a block's gradient, the optimiser's step); the
trainer is :func:`aepar.parallel.data_parallel.train_epoch` - fixed blocks of rows, each
block's gradient (scaled by 1/global batch) computed alone, the blocks added in one fixed
tree: the same steps on 1 process or any number of ranks and threads; shuffles from
``default_rng((seed, FINETUNE_STREAM, epoch, block))``.
"""
from __future__ import annotations

import numpy as np

from aepar.models.trained import DenseBackprop
from aepar.rows import Shard, mean_squared_error

__all__ = ["StackedAutoencoder", "LOSSES", "FINETUNE_STREAM"]

LOSSES = ("mse", "xent")
# random-stream id of fine-tuning shuffles: (seed, FINETUNE_STREAM, epoch), apart from the layers'
FINETUNE_STREAM = 1000


class StackedAutoencoder(DenseBackprop):
    """Encoder sizes ``sizes`` = [n_in, h1, ..., code], unrolled into 2(len(sizes)-1) dense layers.

    Parameters
    ----------
    be : aepar.backend.Backend
    sizes : list of int
    loss : {"mse", "xent"}
    seed : int
        For the random initialisation used when no pre-trained layers are given
        (0.1·N(0,1) weights, zero biases).
    batch : int
        Global minibatch of fine-tuning unless the trainer is given another (the paper's 100).

    Attributes
    ----------
    params : dict
        "W1".."W{2n}", "b1".."b{2n}" (W_i: (dims[i-1], dims[i])), in order from the input.
    acts : list of str
        Activation of each dense layer ("identity" for the code and, with xent, the logits).
    """

    n_extra = 2  # a step reports Σ loss and Σ‖x̂ − x‖² over its rows

    def __init__(self, be, sizes, *, loss="mse", seed=0, batch=100):
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
        self.seed, self.batch = int(seed), int(batch)
        self.optimizer = None  # set by the trainer: aepar.optim.SGD or Adam over self.params

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
    def _reconstruct(self, x):
        """x̂ in [0, 1] for one chunk of rows."""
        y = self.forward(x)[-1]
        return y if self.loss == "mse" else self.be.K.sigmoid_forward(y)

    def _encode(self, x):
        K, p = self.be.K, self.params
        a = x
        for i in range(self.n_layers // 2):
            a = K.dense_forward(a, p[f"W{i + 1}"], p[f"b{i + 1}"], self.acts[i])
        return a

    def reconstruct(self, shard: Shard) -> Shard:
        """x̂ in [0, 1] for every row of ``shard``, block by block."""
        return shard.map_rows(self._reconstruct, self.sizes[0], self.be.xp, self.be.dtype)

    def encode(self, shard: Shard) -> Shard:
        """The codes (linear units of the middle layer) of every row of ``shard``."""
        return shard.map_rows(self._encode, self.sizes[-1], self.be.xp, self.be.dtype)

    def loss_and_grad(self, x, grads, scale=None):
        """Loss of a batch and its gradients, *added* into ``grads`` (zero them first).

        Parameters
        ----------
        x : array (batch, n_in)
            Inputs, also the targets.
        grads : dict
            Arrays of the parameters' shapes to add into.
        scale : float or None
            Multiplies the summed loss and the gradients (default 1/batch; data-parallel
            callers pass 1/global batch).

        Returns
        -------
        (loss, sq_err) : scalars
            The scaled loss and Σ (x − x̂)² over the batch (0-d arrays left on the GPU
            there: ``float()`` reads them and waits).
        """
        scale = 1.0 / x.shape[0] if scale is None else float(scale)
        loss, sq_err = self._blocks_loss_and_grad([x], [grads], scale)[0]
        return loss * scale, sq_err  # (the bits of the loss taken at this scale)

    def _blocks_loss_and_grad(self, xs, grads, scale, factors=None):
        """:meth:`loss_and_grad` of every block in ``xs`` (one ``grads`` dict each) at once,
        layer by layer, the gradients at ``scale``; with ``factors`` (one dict per block)
        the weight gradients are left there (:meth:`blocks_pass`). Returns [(Σ loss,
        sq_err)] per block: the loss unscaled, what the trainer sums (on a GPU a scaling
        is a launch a block)."""
        return self.blocks_pass(xs, self._head(scale), None, grads, factors)

    def group_factors(self, x, starts, rngs, grads, scale):
        """:meth:`block_factors` of consecutive blocks stacked in ``x`` (block b: rows
        starts[b]:starts[b + 1]), each layer one kernel call: ([(Σ loss, Σ‖x̂ − x‖²)] per
        block, {name: (layer input, dz, starts, 1.0)}). No noise: ``rngs`` is not used."""
        return self.group_pass(x, starts, self._head(float(scale)), None, grads)

    def _head(self, scale):
        """The loss of a group's blocks at once, each block's sums its own, and d/d output
        at ``scale`` (:meth:`blocks_pass`'s ``head``)."""
        K = self.be.K

        def head(out, x, starts):
            if self.loss == "mse":
                sums = (K.mse_forward_blocks(out, x, starts, scale=s) for s in (1.0, 2.0))  # loss, sq_err
                return list(zip(*sums)), K.mse_backward(out, x, scale=scale)
            losses, y = K.sigmoid_xent_forward_blocks(out, x, starts, scale=1.0)
            # d/dlogits: through "identity"
            return (list(zip(losses, K.mse_forward_blocks(y, x, starts, scale=2.0))),
                    K.sigmoid_xent_backward(y, x, scale=scale))
        return head

    # ---- training and evaluation ---------------------------------------------------------
    def grad_shapes(self) -> dict:
        return {k: tuple(p.shape) for k, p in self.params.items()}

    def leaf_gradient(self, x, rng, scale, grads):
        """One block's gradients (scaled by 1/global batch) into ``grads``; returns
        (Σ loss, Σ‖x̂ − x‖²) over its rows."""
        return self._blocks_loss_and_grad([x], [grads], float(scale))[0]

    def block_factors(self, xs, rngs, scale, grads):
        """:meth:`leaf_gradient` of several blocks at once, their weight gradients left as
        factors (x.T @ dz per layer) and their biases' added into ``grads`` (one dict per
        block). Returns ([(Σ loss, Σ‖x̂ − x‖²)], [{name: factors}]), one entry per block."""
        factors = [{} for _ in xs]
        return self._blocks_loss_and_grad(xs, grads, float(scale), factors), factors

    def apply(self, grads, epoch):
        self.optimizer.step(grads)

    @property
    def key(self) -> tuple:
        return (self.seed, FINETUNE_STREAM)

    def error_per_digit(self, shard: Shard, reduce=None) -> float:
        """Mean over all images of Σ_pixels (x − x̂)², pixels in [0, 1].

        ``reduce(shard, fn) -> vector`` sums ``fn`` over every rank's rows
        (aepar.parallel.data_parallel.reducer); None: this process holds every block
        (:func:`aepar.rows.local_sums`).
        """
        return mean_squared_error(shard, self._reconstruct, self.be.K.mse_forward, reduce)

    def flops_per_sample(self) -> float:
        """One forward and backward pass: three products per weight matrix."""
        return 6.0 * sum(self.dims[i] * self.dims[i + 1] for i in range(self.n_layers))

    def __repr__(self):
        return f"StackedAutoencoder({'-'.join(map(str, self.dims))}, loss={self.loss})"
