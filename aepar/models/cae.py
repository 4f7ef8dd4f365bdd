"""A convolutional autoencoder (Bhargava & Surana's building block, a LeNet-like CAE).

Encoder: two rounds of 3x3 convolution (zero padding 1) + ReLU + 2x2 max-pooling, the
filters widening (default 16 then 32): (C, H, W) -> (f2, H/4, W/4), the code. Decoder:
two 2x2 transposed convolutions with stride 2, ReLU then a sigmoid output, back to
(C, H, W). The loss is the paper's (its eqs. 1-2): the squared error of an image summed
over its pixels, averaged over the images.

The trainer (:func:`aepar.parallel.data_parallel.train_epoch`) hands the model rows of a
shard: an image is one row of C*H*W values in [0, 1], reshaped to NCHW here. Parameters
are W1, b1 (conv C -> f1), W2, b2 (conv f1 -> f2), W3, b3 (transposed conv f2 -> f1),
W4, b4 (transposed conv f1 -> C), in the kernels' layouts (aepar.kernels conv).
"""
from __future__ import annotations

import math

import numpy as np

from aepar.rows import mean_squared_error
from aepar.models.trained import TrainedState, factors_by_group

__all__ = ["ConvAutoencoder", "CAE_STREAM", "DEFAULT_FILTERS", "check_image_shape"]

# random-stream id of a CAE's initialisation and shuffles: (seed, CAE_STREAM, ...)
CAE_STREAM = 3000
DEFAULT_FILTERS = (16, 32)
# two 2x2 poolings: the image sides must be multiples of 4 for the decoder to rebuild them
_POOL = 4


def check_image_shape(shape) -> tuple:
    """(C, H, W) as ints; ValueError (one line) unless the network can take such images:
    two 2x2 poolings need H and W to be positive multiples of 4."""
    if len(shape) != 3 or any(int(s) < 1 for s in shape):
        raise ValueError(f"images must be (channels, height, width), got {tuple(shape)}")
    c, h, w = (int(s) for s in shape)
    if h % _POOL or w % _POOL:
        raise ValueError(f"images of {h}x{w} pixels do not fit the CAE: two 2x2 poolings need height and "
                         f"width to be multiples of 4 (e.g. 28x28, 32x32)")
    return c, h, w


class ConvAutoencoder(TrainedState):
    """Parameters and cost/gradient of one CAE (see the module docstring).

    Parameters
    ----------
    be : aepar.backend.Backend
    shape : (C, H, W)
        The images; H and W multiples of 4.
    filters : (f1, f2)
        Feature maps of the two encoder convolutions (the decoder mirrors them).
    seed : int
        Initialisation and shuffles: PyTorch's default for Conv2d/ConvTranspose2d
        (weights and biases uniform in ±1/√fan_in), which the paper kept.
    batch : int
        Global minibatch unless the trainer is given another (the paper: 100).

    Attributes
    ----------
    params : dict
        W1..W4, b1..b4 on the backend's device.
    code_size : int
        Features per image of :meth:`encode`: f2 * H/4 * W/4.
    epochs_done : int
        Epochs completed (the trainer advances it).
    """

    n_extra = 1  # a step reports Σ over its rows of Σ_pixels (x − x̂)²

    def __init__(self, be, shape, filters=DEFAULT_FILTERS, seed=0, *, batch=100):
        self.be = be
        self.shape = check_image_shape(shape)
        self.filters = tuple(int(f) for f in filters)
        if len(self.filters) != 2 or min(self.filters) < 1:
            raise ValueError(f"filters must be two positive counts, got {filters}")
        c, h, w = self.shape
        f1, f2 = self.filters
        self.seed, self.batch, self.epochs_done = int(seed), int(batch), 0
        self.code_size = f2 * (h // _POOL) * (w // _POOL)
        rng = np.random.default_rng((self.seed, CAE_STREAM))
        # (weight shape, fan_in as PyTorch counts it: Cin*k*k for conv, Cout*k*k transposed)
        layout = {"1": ((f1, c, 3, 3), c * 9), "2": ((f2, f1, 3, 3), f1 * 9),
                  "3": ((f2, f1, 2, 2), f1 * 4), "4": ((f1, c, 2, 2), c * 4)}
        self.params = {}
        for i, (wshape, fan_in) in layout.items():
            bound = 1.0 / math.sqrt(fan_in)
            nb = wshape[1] if i in "34" else wshape[0]
            self.params[f"W{i}"] = be.asarray(rng.uniform(-bound, bound, wshape))
            self.params[f"b{i}"] = be.asarray(rng.uniform(-bound, bound, nb))
        self.optimizer = None  # set by the trainer: aepar.optim.Adam over self.params

    # ---- forward / backward --------------------------------------------------------------
    def _images(self, x):
        return x.reshape((x.shape[0],) + self.shape)

    def forward(self, x, starts=None):
        """Every intermediate of rows ``x``: a dict with the code ``p2`` and the output ``y``.
        ``starts``: the offsets of the blocks stacked in ``x`` (default: one block), each
        block's rows the bits of its pass alone."""
        K, p = self.be.K, self.params
        starts = (0, x.shape[0]) if starts is None else starts
        t = {"x": self._images(x)}
        t["a1"] = K.relu_forward(K.conv2d_forward_blocks(t["x"], p["W1"], p["b1"], 1, 1, starts))
        t["p1"], t["i1"] = K.maxpool2x2_forward(t["a1"])
        t["a2"] = K.relu_forward(K.conv2d_forward_blocks(t["p1"], p["W2"], p["b2"], 1, 1, starts))
        t["p2"], t["i2"] = K.maxpool2x2_forward(t["a2"])
        t["a3"] = K.relu_forward(K.conv2d_transpose_forward_blocks(t["p2"], p["W3"], p["b3"], 2, 0, starts))
        t["y"] = K.sigmoid_forward(K.conv2d_transpose_forward_blocks(t["a3"], p["W4"], p["b4"], 2, 0, starts))
        return t

    def loss_and_grad(self, x, grads, scale=None):
        """The paper's loss of a batch, ``scale`` · Σ_images Σ_pixels (x − x̂)², and its
        gradients *added* into ``grads`` (zero them first).

        Parameters
        ----------
        x : array (batch, C*H*W)
        grads : dict
            Arrays of the parameters' shapes.
        scale : float or None
            Default 1/batch (eq. 2's mean); data-parallel callers pass 1/global batch.

        Returns
        -------
        (loss, sq_err) : scalars
            The scaled loss and Σ (x − x̂)² over the batch (0-d arrays left on the GPU
            there: ``float()`` reads them and waits).
        """
        scale = 1.0 / x.shape[0] if scale is None else float(scale)
        (sq_err,) = self._blocks_gradients(x, (0, x.shape[0]), [grads], scale)
        return scale * sq_err, sq_err

    def _blocks_gradients(self, x, starts, grads, scale):
        """The gradients of the blocks stacked in ``x`` (offsets ``starts``), block k's into
        ``grads[k]``; returns each block's Σ (x − x̂)². A convolution, an activation and a
        pooling work image by image: the whole stack is one kernel call per layer, and only
        the weight and bias gradients and the loss are taken block by block (by the
        *_blocks kernels), so each block gets the bits of its pass alone."""
        K, p = self.be.K, self.params
        t = self.forward(x, starts)
        # mse_* carry a factor 1/2: scale 2s gives s·Σ(x − x̂)² and its gradient
        sq_errs = K.mse_forward_blocks(t["y"], t["x"], starts, scale=2.0)
        dy = K.sigmoid_backward(K.mse_backward(t["y"], t["x"], scale=2.0 * scale), t["y"])

        def each_block(name):
            return [g[name] for g in grads]
        da3 = K.relu_backward(K.conv2d_transpose_backward_blocks(dy, t["a3"], p["W4"], 2, 0, each_block("W4"),
                                                                 each_block("b4"), starts), t["a3"])
        dp2 = K.conv2d_transpose_backward_blocks(da3, t["p2"], p["W3"], 2, 0, each_block("W3"), each_block("b3"),
                                                 starts)
        da2 = K.relu_backward(K.maxpool2x2_backward(dp2, t["i2"], t["a2"].shape), t["a2"])
        dp1 = K.conv2d_backward_blocks(da2, t["p1"], p["W2"], 1, 1, each_block("W2"), each_block("b2"), starts)
        da1 = K.relu_backward(K.maxpool2x2_backward(dp1, t["i1"], t["a1"].shape), t["a1"])
        # the images' own gradient is not wanted: need_dx=False skips its products
        K.conv2d_backward_blocks(da1, t["x"], p["W1"], 1, 1, each_block("W1"), each_block("b1"), starts,
                                 need_dx=False)
        return sq_errs

    def encode(self, x):
        """Code rows (batch, code_size) of image rows ``x``: the classifier's features."""
        t = self.forward_encoder(x)
        return t.reshape(t.shape[0], -1)

    def forward_encoder(self, x):
        """The code of image rows ``x`` as (batch, f2, H/4, W/4)."""
        K, p = self.be.K, self.params
        a1 = K.relu_forward(K.conv2d_forward(self._images(x), p["W1"], p["b1"], 1, 1))
        a2 = K.relu_forward(K.conv2d_forward(K.maxpool2x2_forward(a1)[0], p["W2"], p["b2"], 1, 1))
        return K.maxpool2x2_forward(a2)[0]

    def reconstruct(self, x):
        """x̂ as rows (batch, C*H*W)."""
        y = self.forward(x)["y"]
        return y.reshape(y.shape[0], -1)

    # ---- the trainer's protocol ------------------------------------------------------------
    def grad_shapes(self) -> dict:
        return {k: tuple(v.shape) for k, v in self.params.items()}

    def leaf_gradient(self, x, rng, scale, grads):
        """One block's gradients (scaled by 1/global batch) into ``grads``; returns
        (Σ over its rows of Σ_pixels (x − x̂)²,)."""
        _, sq_err = self.loss_and_grad(x, grads, scale=scale)
        return (sq_err,)

    def block_factors(self, xs, rngs, scale, grads):
        """:meth:`leaf_gradient` of several blocks at once: one group of consecutive blocks
        per thread, each group's layers one kernel call (:meth:`_blocks_gradients`), every
        block's gradients and sum the bits it would have alone. None of the gradients is
        factored: returns ([(Σ (x − x̂)²,)], [{}]), one entry per block."""
        return factors_by_group(self.group_factors, self.be.xp, xs, rngs, scale, grads)

    def group_factors(self, x, starts, rngs, grads, scale):
        """:meth:`block_factors` of consecutive blocks of image rows stacked in ``x`` (block
        b: rows starts[b]:starts[b + 1]): ([(Σ (x − x̂)²,)] per block, {}). No noise: ``rngs``
        is not used."""
        return [(e,) for e in self._blocks_gradients(x, starts, grads, scale)], {}

    def apply(self, grads, epoch):
        self.optimizer.step(grads)

    @property
    def key(self) -> tuple:
        return (self.seed, CAE_STREAM)

    # ---- evaluation ------------------------------------------------------------------------------
    def recon_error(self, shard, reduce=None) -> float:
        """The paper's loss over every row of ``shard`` (all ranks'): mean over images of
        Σ_pixels (x − x̂)². ``reduce(shard, fn) -> vector`` sums over the ranks
        (aepar.parallel.data_parallel.reducer); None: this process holds every block."""
        return mean_squared_error(shard, self.reconstruct, self.be.K.mse_forward, reduce)

    def flops_per_sample(self) -> float:
        """One forward and backward pass: each convolution's multiply-adds, times 2 for the
        forward and 4 for the two backward products, but 2 for the first layer's backward
        (its input gradient, of the data, is not made: ``need_dx=False``)."""
        c, h, w = self.shape
        f1, f2 = self.filters
        first = c * f1 * 9 * h * w
        macs = (first + f1 * f2 * 9 * (h // 2) * (w // 2)
                + f2 * f1 * 4 * (h // 4) * (w // 4) + f1 * c * 4 * (h // 2) * (w // 2))
        return 6.0 * macs - 2.0 * first

    def __repr__(self):
        c, h, w = self.shape
        f1, f2 = self.filters
        return f"ConvAutoencoder({c}x{h}x{w}, filters {f1}-{f2}, code {self.code_size})"
