"""A feed-forward classifier: dense layers, then softmax cross-entropy over the classes.

The supervised fine-tuning of CMU 15-618 (accuracy after fine-tuning, 96.62%): the
encoder of a pre-trained stack (e.g. 784-1000-500-250-30) with a softmax layer of
``n_classes`` on top, trained by backprop on the labels. ``sizes=[784]`` (no hidden
layer) is plain softmax regression, the floor a network has to beat.

The trainer (:func:`aepar.parallel.data_parallel.train_epoch`) hands the model rows of a
shard and nothing else, so a classifier trains on rows ``[features..., label]``: the
label rides along as one trailing float column (:func:`with_labels`), exact for class
indices in float32 (integers below 2^24). Every method that takes *rows* (``leaf_gradient``,
``accuracy``, ``evaluate``) expects that column; ``predict``, ``forward`` and
``loss_and_grad`` take feature rows only.
"""
from __future__ import annotations

import numpy as np

from aepar.rows import BlockRows, local_sums
from aepar.models.trained import DenseBackprop, TrainedState

__all__ = ["Classifier", "with_labels", "split_labels", "CLASSIFY_STREAM", "HIDDEN_ACTS", "UNIT_ACTS", "HIDDEN_INIT",
           "OUTPUT_INIT"]

# random-stream id of the classifier's initialisation and shuffles: (seed, CLASSIFY_STREAM, ...),
# apart from the layers' (seed, layer) and fine-tuning's (seed, 1000)
CLASSIFY_STREAM = 2000
# activations a hidden layer may have
HIDDEN_ACTS = ("sigmoid", "identity", "relu")
# a pre-trained layer's hidden units -> the activation of its dense layer
UNIT_ACTS = {"bernoulli": "sigmoid", "gaussian": "identity"}
# standard deviation of the hidden layers' initial weights (the RBM init; see Classifier)
HIDDEN_INIT = 0.1
# standard deviation of the softmax layer's initial weights: near-uniform class
# probabilities (initial loss ~ log n_classes) whatever the encoder below emits
OUTPUT_INIT = 0.01
# labels must be exact in float32: integers below 2^24
_MAX_LABEL = 1 << 24


def with_labels(x, y, dtype=None) -> np.ndarray:
    """Rows ``[x_i..., y_i]``: the host array a classifier's shard is cut from.

    Parameters
    ----------
    x : array (n, d)
        Features.
    y : array (n,)
        Integer class labels in [0, 2^24) (exact as floats in float32 and float64).
    dtype : optional
        Of the result (default: x's floating dtype, float64 for integer x).

    Raises
    ------
    ValueError
        If the shapes do not match or a label is not a non-negative integer below 2^24.
    """
    x, y = np.asarray(x), np.asarray(y)
    if x.ndim != 2:
        raise ValueError(f"features must be (rows, features), not {x.shape}")
    if y.shape != (x.shape[0],):
        raise ValueError(f"{x.shape[0]} rows of features but labels of shape {y.shape}")
    if y.size:
        if y.dtype.kind not in "iu" and not (y.dtype.kind == "f" and np.all(np.isfinite(y))
                                             and np.array_equal(y, np.round(y))):
            raise ValueError(f"labels must be integers, got {y.dtype}")
        if y.min() < 0 or y.max() >= _MAX_LABEL:
            raise ValueError(f"labels must lie in [0, {_MAX_LABEL}), got [{y.min()}, {y.max()}]")
    if dtype is None:
        dtype = x.dtype if x.dtype.kind == "f" else np.float64
    out = np.empty((x.shape[0], x.shape[1] + 1), dtype=dtype)
    out[:, :-1] = x
    out[:, -1] = y
    return out


def split_labels(rows):
    """(features, labels) of rows built by :func:`with_labels`, on the rows' device:
    features C-contiguous in the rows' dtype, labels int64."""
    return rows[:, :-1].copy(), rows[:, -1].astype(np.int64)


def _split_blocks(xp, xs):
    """(features, labels) of several blocks of rows built by :func:`with_labels`: the
    features a BlockRows where the blocks lie in one array (the trainer's, split in one
    call), else a list; the labels a BlockRows of one array."""
    if isinstance(xs, BlockRows):
        feats, labels = split_labels(xs.stacked())
        starts = [s - xs.starts[0] for s in xs.starts]
        return BlockRows(feats, starts), BlockRows(labels, starts)
    parts = [split_labels(x) for x in xs]
    starts = np.cumsum([0] + [f.shape[0] for f, _ in parts])
    labels = xp.concatenate([y for _, y in parts]) if parts else xp.zeros(0, np.int64)
    return [f for f, _ in parts], BlockRows(labels, starts)


class Classifier(TrainedState, DenseBackprop):
    """Dense layers ``sizes`` = [n_in, h1, ..., hk] and a softmax layer of ``n_classes``.

    Rows given to :meth:`leaf_gradient`, :meth:`accuracy` and :meth:`evaluate` carry the
    label as a trailing float column (:func:`with_labels`); the trainer is
    :func:`aepar.parallel.data_parallel.train_epoch`, with shuffles from
    ``default_rng((seed, CLASSIFY_STREAM, epoch, block))``.

    Parameters
    ----------
    be : aepar.backend.Backend
    sizes : list of int
        The input size and the hidden layers' sizes; ``[n_in]`` alone is softmax regression.
    n_classes : int
    acts : list of str, optional
        Activation of each hidden layer (``HIDDEN_ACTS``; default sigmoid everywhere). The
        softmax layer's output is always the logits.
    seed : int
        Of the initialisation. Hidden layers: 0.1·N(0,1) weights, the RBMs' init (Hinton &
        Salakhutdinov): deep sigmoid networks learn from the first epochs with it, where the
        "scaled" N(0, 1/fan_in) and PyTorch's U(±1/√fan_in) stay near chance for several
        epochs (docs/performance-notes.md). Wide sigmoid layers whose
        pre-activations span a few units start with diverse features; near-linear ones do
        not. Softmax layer: ``OUTPUT_INIT``·N(0,1), near-uniform probabilities at the start.
        Biases zero.
    batch : int
        Global minibatch unless the trainer is given another.

    Attributes
    ----------
    params : dict
        "W1".."W{L}", "b1".."b{L}" (W_i: (dims[i-1], dims[i])), from the input; layer L is
        the softmax layer.
    dims : list of int
        ``sizes + [n_classes]``.
    acts : list of str
        Per dense layer; the last is "identity" (logits).
    """

    n_extra = 2  # a step reports Σ loss and Σ correct over its rows

    def __init__(self, be, sizes, n_classes, acts=None, seed=0, *, batch=100):
        sizes = [int(s) for s in sizes]
        if not sizes or any(s < 1 for s in sizes):
            raise ValueError(f"sizes must be at least the input size, all positive, got {sizes}")
        if int(n_classes) < 2:
            raise ValueError(f"need at least 2 classes, got {n_classes}")
        n_hidden = len(sizes) - 1
        acts = ["sigmoid"] * n_hidden if acts is None else list(acts)
        if len(acts) != n_hidden or any(a not in HIDDEN_ACTS for a in acts):
            raise ValueError(f"acts must be {n_hidden} of {HIDDEN_ACTS}, got {acts}")
        self.be, self.sizes, self.n_classes = be, sizes, int(n_classes)
        self.dims = sizes + [self.n_classes]
        self.n_layers = len(self.dims) - 1
        self.acts = acts + ["identity"]
        rng = np.random.default_rng((int(seed), CLASSIFY_STREAM))
        self.params = {}
        for i in range(self.n_layers):
            fan_in, fan_out = self.dims[i], self.dims[i + 1]
            std = OUTPUT_INIT if i == self.n_layers - 1 else HIDDEN_INIT
            self.params[f"W{i + 1}"] = be.asarray(std * rng.standard_normal((fan_in, fan_out)))
            self.params[f"b{i + 1}"] = be.zeros(fan_out)
        self.seed, self.batch = int(seed), int(batch)
        self.optimizer = None  # set by the trainer: aepar.optim.SGD or Adam over self.params

    @classmethod
    def from_layers(cls, be, layers, n_classes, seed=0, *, batch=100):
        """Pre-trained layers as the encoder, a fresh softmax layer on top.

        Parameters
        ----------
        layers : list
            Objects with ``params`` {"W", "bv", "bh"} (RBM, AELayer, ...) and ``hidden``
            ("bernoulli" -> sigmoid, "gaussian" -> identity, the linear code units). A layer
            without ``hidden`` follows the stack's convention (aepar.stack.make_layers):
            the last one "gaussian", the others "bernoulli".

        Layer i gives (W, bh) of dense layer i (the visible biases are not used); the
        arrays are copies, the layers are left as they were.
        """
        if not layers:
            raise ValueError("from_layers needs at least one layer")
        sizes = [int(layers[0].params["W"].shape[0])] + [int(l.params["W"].shape[1]) for l in layers]
        units = [getattr(l, "hidden", "gaussian" if i == len(layers) - 1 else "bernoulli")
                 for i, l in enumerate(layers)]
        bad = [u for u in units if u not in UNIT_ACTS]
        if bad:
            raise ValueError(f"hidden units must be one of {tuple(UNIT_ACTS)}, got {bad[0]!r}")
        model = cls(be, sizes, n_classes, [UNIT_ACTS[u] for u in units], seed, batch=batch)
        for i, layer in enumerate(layers):
            model.params[f"W{i + 1}"][...] = be.asarray(layer.params["W"])
            model.params[f"b{i + 1}"][...] = be.asarray(layer.params["bh"])
        return model

    # ---- forward / backward --------------------------------------------------------------
    def predict(self, x):
        """Class of each feature row (argmax of the logits), int array on the backend's device."""
        return self.forward(x)[-1].argmax(axis=1)

    def loss_and_grad(self, x, labels, grads, scale=None):
        """Softmax cross-entropy of a batch and its gradients, *added* into ``grads``.

        Parameters
        ----------
        x : array (batch, n_in)
            Feature rows.
        labels : int array (batch,)
        grads : dict
            Arrays of the parameters' shapes to add into (zero them first).
        scale : float or None
            Multiplies the summed loss and the gradients (default 1/batch; data-parallel
            callers pass 1/global batch).

        Returns
        -------
        (loss, correct) : scalars
            The scaled loss and how many rows the network (before this step) classifies right
            (0-d arrays left on the GPU there: ``float()`` reads them and waits).
        """
        scale = 1.0 / x.shape[0] if scale is None else float(scale)
        labels = BlockRows(self.be.xp.asarray(labels), [0, x.shape[0]])
        loss, correct = self._blocks_loss_and_grad([x], labels, [grads], scale)[0]
        return loss * scale, correct  # (the bits of the loss taken at this scale)

    def _blocks_loss_and_grad(self, xs, labels, grads, scale, factors=None):
        """:meth:`loss_and_grad` of every block in ``xs`` at once (``labels``: theirs, a
        BlockRows of one array), layer by layer, the gradients at ``scale``; with
        ``factors`` (one dict per block) the weight gradients are left there
        (:meth:`blocks_pass`). Returns [(Σ loss, correct)] per block: the loss unscaled,
        what the trainer sums (on a GPU a scaling is a launch a block)."""
        return self.blocks_pass(xs, self._head(scale), labels, grads, factors)

    def group_factors(self, x, starts, rngs, grads, scale):
        """:meth:`block_factors` of consecutive blocks of rows ``[features..., label]``
        stacked in ``x`` (block b: rows starts[b]:starts[b + 1]), each layer one kernel
        call: ([(Σ loss, correct)] per block, {name: (layer input, dz, starts, 1.0)}). No
        noise: ``rngs`` is not used."""
        feats, labels = split_labels(x)
        return self.group_pass(feats, starts, self._head(float(scale)), BlockRows(labels, starts), grads)

    def _head(self, scale):
        """The loss of a group's blocks at once, each block's sums its own, and d/d logits
        at ``scale`` (:meth:`blocks_pass`'s ``head``)."""
        K = self.be.K

        def head(logits, labels, starts):
            y = labels.stacked()
            losses, probs = K.softmax_xent_forward_blocks(logits, y, starts, scale=1.0)
            hits = probs.argmax(axis=1) == y  # (on the GPU the counts stay there, as the losses)
            return ([(loss, hits[lo:hi].sum()) for loss, lo, hi in zip(losses, starts[:-1], starts[1:])],
                    K.softmax_xent_backward(probs, y, scale=scale))  # d/dlogits: through "identity"
        return head

    # ---- the trainer's protocol ------------------------------------------------------------
    def grad_shapes(self) -> dict:
        return {k: tuple(p.shape) for k, p in self.params.items()}

    def leaf_gradient(self, x, rng, scale, grads):
        """One block's gradients (scaled by 1/global batch) into ``grads`` from rows
        ``[features..., label]``; returns (Σ loss, Σ correct) over its rows."""
        feats, labels = split_labels(x)
        return self._blocks_loss_and_grad([feats], BlockRows(labels, [0, x.shape[0]]), [grads], float(scale))[0]

    def block_factors(self, xs, rngs, scale, grads):
        """:meth:`leaf_gradient` of several blocks at once, their weight gradients left as
        factors (x.T @ dz per layer) and their biases' added into ``grads`` (one dict per
        block). Returns ([(Σ loss, Σ correct)], [{name: factors}]), one entry per block."""
        feats, labels = _split_blocks(self.be.xp, xs)
        factors = [{} for _ in xs]
        return self._blocks_loss_and_grad(feats, labels, grads, float(scale), factors), factors

    def apply(self, grads, epoch):
        self.optimizer.step(grads)

    @property
    def key(self) -> tuple:
        return (self.seed, CLASSIFY_STREAM)

    # ---- evaluation --------------------------------------------------------------------------
    def _sums(self, rows):
        """[Σ correct, Σ loss] of one chunk of labelled rows."""
        feats, labels = split_labels(rows)
        logits = self.forward(feats)[-1]
        loss, _ = self.be.K.softmax_xent_forward(logits, labels, scale=1.0)
        return [float((logits.argmax(axis=1) == labels).sum()), loss]

    def evaluate(self, shard, reduce=None) -> tuple[float, float]:
        """(accuracy, mean cross-entropy) over every labelled row of ``shard``.

        ``reduce(shard, fn) -> vector`` sums ``fn``'s float64 vector over every rank's rows
        (aepar.parallel.data_parallel.reducer); None: this process holds every block
        (:func:`aepar.rows.local_sums`).
        """
        total = (reduce or local_sums)(shard, self._sums)
        n = max(shard.n, 1)
        return float(total[0] / n), float(total[1] / n)

    def accuracy(self, shard, reduce=None) -> float:
        """Fraction of the labelled rows of ``shard`` (all ranks') classified right (see
        :meth:`evaluate` for ``reduce``)."""
        return self.evaluate(shard, reduce)[0]

    def flops_per_sample(self) -> float:
        """One forward and backward pass: three products per weight matrix."""
        return 6.0 * sum(self.dims[i] * self.dims[i + 1] for i in range(self.n_layers))

    def __repr__(self):
        hidden = ",".join(self.acts[:-1]) or "none"
        return f"Classifier({'-'.join(map(str, self.dims))}, hidden {hidden}, softmax)"
