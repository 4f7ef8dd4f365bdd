"""What the models trained by backprop with an optimiser share: their state for a
checkpoint, and the backward pass through their dense layers."""
from __future__ import annotations

import numpy as np

from aepar.rows import BlockFactor, BlockRows, each, stacked_rows, thread_bands

__all__ = ["TrainedState", "DenseBackprop", "BlockActivations", "factors_by_group"]


class TrainedState:
    """``state()`` / ``load_state()`` of a model with ``be``, ``params`` (name -> array) and
    ``optimizer`` (None, or an aepar.optim optimiser over ``params``)."""

    def state(self) -> dict:
        """Parameters (``params/W1`` ...) and, with an optimiser set, its state (``opt/...``),
        as host arrays for a checkpoint."""
        out = {f"params/{k}": self.be.to_host(v) for k, v in self.params.items()}
        if self.optimizer is not None:
            out.update({f"opt/{k}": self.be.to_host(v) for k, v in self.optimizer.state().items()})
        return out

    def load_state(self, state: dict):
        """Inverse of :meth:`state`; the optimiser's part is loaded when both have one."""
        for k, v in self.params.items():
            value = np.asarray(state[f"params/{k}"])
            if value.shape != tuple(v.shape):
                raise ValueError(f"params/{k} has shape {value.shape}, this {type(self).__name__} {tuple(v.shape)}")
            v[...] = self.be.asarray(value)
        opt = {k[4:]: v for k, v in state.items() if k.startswith("opt/")}
        if opt and self.optimizer is not None:
            self.optimizer.load_state(opt)


def factors_by_group(group_factors, xp, xs, rngs, scale, grads):
    """A layer model's ``block_factors`` from its ``group_factors``: the blocks ``xs`` in one
    group of consecutive blocks per thread (:class:`BlockActivations`), each group one call
    of ``group_factors(rows, starts, rngs, grads, scale) -> ([sums per block], {name: (A, D,
    row starts, alpha)})``, whose factors are then handed on per block (block b's gradient
    of ``name``: alpha times its rows of A, transposed, times its rows of D)."""
    acts = BlockActivations(xs, xp)

    def group(x, starts, rngs, grads):
        sums, factors = group_factors(x, starts, rngs, grads, scale)
        rows = {name: (BlockRows(a, at), BlockRows(d, at), alpha) for name, (a, d, at, alpha) in factors.items()}
        return [(s, {name: BlockFactor(a, d, k, alpha) for name, (a, d, alpha) in rows.items()})
                for k, s in enumerate(sums)]
    out = [block for blocks in each(group, acts.layers[0], acts.starts, acts.split(list(rngs)),
                                    acts.split(list(grads))) for block in blocks]
    return [sums for sums, _ in out], [f for _, f in out]


def one_array(xp, items):
    """Consecutive blocks' arrays as one C-contiguous array (a block alone too: a kernel
    then takes a block's rows the same way alone or stacked)."""
    return xp.ascontiguousarray(items[0]) if len(items) == 1 else xp.concatenate(items)


class BlockActivations:
    """Several blocks of rows through the layers, stacked by groups: the blocks are split
    into one group of consecutive blocks per thread, and ``layers[l][g]`` holds the rows of
    group g's blocks at layer l in one array (its block k: rows ``starts[g][k]`` to
    ``starts[g][k + 1]``), so that a layer is one kernel call per group."""

    def __init__(self, xs, xp):
        """``xs``: the blocks' rows, a list of arrays or an aepar.rows.BlockRows."""
        bounds = thread_bands(len(xs)) if len(xs) else [0]
        self.groups = list(zip(bounds[:-1], bounds[1:]))
        self.xp = xp
        if isinstance(xs, BlockRows):  # the trainer gathers a step's rows in one call: a group's are a view
            self.starts = [np.array(xs.starts[lo:hi + 1]) - xs.starts[lo] for lo, hi in self.groups]
            self.layers = [[xp.ascontiguousarray(xs[lo:hi].stacked()) for lo, hi in self.groups]]
            return
        xs = list(xs)
        self.starts = [np.cumsum([0] + [x.shape[0] for x in xs[lo:hi]]) for lo, hi in self.groups]
        # the rows as they lie where a group's blocks come one after another in one array,
        # else stacked
        self.layers = [[xp.ascontiguousarray(stacked_rows(xp, xs[lo:hi], xs[lo].shape[1], xs[lo].dtype))
                        for lo, hi in self.groups]
                       if xs and all(x.ndim == 2 for x in xs) else self.stack(xs)]

    def stack(self, items) -> list:
        """Per-block arrays (block order) stacked per group (:func:`one_array`)."""
        return [one_array(self.xp, items[lo:hi]) for lo, hi in self.groups]

    def split(self, items) -> list:
        """Per-block items (block order) listed per group."""
        return [items[lo:hi] for lo, hi in self.groups]


class DenseBackprop:
    """The forward and backward passes of a model with dense layers ``W1, b1 .. W{n}, b{n}``
    (``be``, ``params``, ``n_layers``, ``acts``: the layers' activation names), on one
    block of rows or on several at once.

    Several blocks go through the network together, layer by layer (:class:`BlockActivations`):
    a layer's weights are read for every block while they are in cache, not once per block
    after the other layers have pushed them out (the fine-tuning stack's weights are 11 MB),
    and a group's blocks are one kernel call (``dense_forward_blocks``), whose bits are
    still those of each block alone."""

    @property
    def factored(self) -> tuple:
        """The weights whose block gradients the data-parallel trainer adds from the
        blocks' factors (``block_factors``) rather than from filled gradients."""
        return tuple(f"W{i + 1}" for i in range(self.n_layers))

    def forward(self, x):
        """Activations [x, a1, ..., a_n] of rows ``x`` (a_n: logits when the last layer is linear)."""
        return [layer[0] for layer in self.forward_blocks([x]).layers]

    def forward_blocks(self, xs) -> BlockActivations:
        """:meth:`forward` of every block in ``xs``, layer by layer: each thread takes its
        group through all the layers, one hand-off per pass (a thread pool's hand-off is
        not free: a layer at a time made eight per pass, and they ate what a second thread
        gained)."""
        acts = BlockActivations(xs, self.be.xp)
        per_group = each(self._through, acts.layers[0], acts.starts)
        acts.layers += [[outs[i] for outs in per_group] for i in range(self.n_layers)]
        return acts

    def _through(self, a, starts) -> list:
        """One group's rows ``a`` (blocks at ``starts``) forward: every layer's output."""
        K, p, out = self.be.K, self.params, []
        for i in range(self.n_layers):
            a = K.dense_forward_blocks(a, p[f"W{i + 1}"], p[f"b{i + 1}"], self.acts[i], starts)
            out.append(a)
        return out

    def blocks_pass(self, xs, head, targets, grads, factors=None) -> list:
        """Every block of ``xs`` forward, through ``head`` and back, in one hand-off to the
        threads: each takes its group of blocks through all the layers, the loss and back
        (nothing on the way needs another group's rows; three hand-offs, one per pass, cost
        a 2-vCPU VM about 200 µs each). ``head(output rows, targets, starts) -> ([result per
        block], d/d output rows)`` is called once per group, with its blocks' rows of the
        last layer (block k: rows starts[k]:starts[k + 1]) and their slice of ``targets``
        (a list or a BlockRows; None: the group's input rows, an autoencoder's), so that
        a loss can take all of a group's blocks in one call; returns the results per
        block, in block order. Bias gradients are added into ``grads`` (one dict per
        block), and weight gradients too, unless ``factors`` is given: then each block's
        ``factors[b][f"W{i}"]`` gets (layer input, dz, 1.0), its gradient being input.T @ dz."""
        xp = self.be.xp
        acts = BlockActivations(xs, xp)
        # each group's share of the targets: a slice (a BlockRows' slice is one too)
        targets = None if targets is None else [targets[lo:hi] for lo, hi in acts.groups]
        per_grads = acts.split(grads)
        per_group = each(lambda g: self._group_pass(acts.layers[0][g], acts.starts[g], head,
                                                    None if targets is None else targets[g], per_grads[g],
                                                    factors is not None),
                         range(len(acts.groups)))
        acts.layers = [[layers[i] for layers, _, _ in per_group] for i in range(self.n_layers + 1)]
        if factors is not None:
            self._put_factors(acts, [dzs for _, _, dzs in per_group], factors)
        return [h for _, heads, _ in per_group for h in heads]

    def _group_pass(self, x, starts, head, targets, grads, factored: bool) -> tuple:
        """One group's consecutive blocks ``x`` (block k: rows starts[k]:starts[k + 1])
        through the layers, ``head`` (``targets`` None: ``x``) and back: (its input and every
        layer's output, head's results per block, dz per weight where ``factored``)."""
        layers = [x] + self._through(x, starts)
        heads, da = head(layers[-1], x if targets is None else targets, starts)
        return layers, heads, self._back(layers, starts, da, grads, factored)

    def group_pass(self, x, starts, head, targets, grads) -> tuple:
        """:meth:`blocks_pass` of one group of blocks stacked in ``x`` (the trainer's
        ``group_factors``): (head's results per block, {f"W{i}": (layer input, dz, starts,
        1.0)}), the bias gradients added into ``grads`` (one dict per block)."""
        layers, heads, dzs = self._group_pass(x, starts, head, targets, grads, True)
        return heads, {f"W{i + 1}": (layers[i], dzs[f"W{i + 1}"], starts, 1.0) for i in range(self.n_layers)}

    def _back(self, layers, s, da, gs, factored: bool) -> dict:
        """One group from d/d(its output) ``da`` back through ``layers`` (its input and every
        layer's output; blocks at ``s``, their gradient dicts ``gs``). Returns its dz per
        weight where ``factored``, else {} (the weight gradients then added into ``gs``)."""
        K, p, xp = self.be.K, self.params, self.be.xp
        dzs = {}
        for i in reversed(range(self.n_layers)):
            W, act, need_dx = p[f"W{i + 1}"], self.acts[i], i > 0
            w_name, b_name = f"W{i + 1}", f"b{i + 1}"
            x, a = layers[i], layers[i + 1]
            if not factored and len(gs) == 1:  # one block (a GPU's batch): no row views to make
                da = K.dense_backward(da, x, W, a, act, gs[0][w_name], gs[0][b_name], need_dx=need_dx)
            elif not factored:
                dxs = [K.dense_backward(da[lo:hi], x[lo:hi], W, a[lo:hi], act, gb[w_name], gb[b_name],
                                        need_dx=need_dx) for lo, hi, gb in zip(s[:-1], s[1:], gs)]
                da = (dxs[0] if len(dxs) == 1 else xp.concatenate(dxs)) if need_dx else None
            else:
                da, dzs[w_name] = K.dense_backward_blocks(da, x, W, a, act, [gb[b_name] for gb in gs], s,
                                                          need_dx=need_dx)
        return dzs

    def _put_factors(self, acts, dzs, factors):
        """Each block's ``factors[b][f"W{i}"]``: (layer input, dz, 1.0), views of its group's
        arrays (``dzs``: each group's dz per weight)."""
        for i in range(self.n_layers):
            w_name = f"W{i + 1}"
            groups = [(BlockRows(x, s), BlockRows(d[w_name], s)) for x, d, s in zip(acts.layers[i], dzs, acts.starts)]
            blocks = (BlockFactor(a_rows, d_rows, k, 1.0) for a_rows, d_rows in groups for k in range(len(a_rows)))
            for f, factor in zip(factors, blocks):
                f[w_name] = factor
