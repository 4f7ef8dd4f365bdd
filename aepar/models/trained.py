"""What the models trained by backprop with an optimiser share: their state for a
checkpoint, and the backward pass through their dense layers."""
from __future__ import annotations

import numpy as np

from aepar.rows import each

__all__ = ["TrainedState", "DenseBackprop"]


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


class DenseBackprop:
    """The forward and backward passes of a model with dense layers ``W1, b1 .. W{n}, b{n}``
    (``be``, ``params``, ``n_layers``, ``acts``: the layers' activation names), on one
    block of rows or on several at once.

    Several blocks go through the network together, layer by layer (:func:`aepar.rows.each`):
    each block's products are still its own kernel calls, so its bits are those of the block
    alone, but a layer's weights are read for every block in turn while they are in cache,
    not once per block after the other layers have pushed them out (the fine-tuning stack's
    weights are 11 MB)."""

    @property
    def factored(self) -> tuple:
        """The weights whose block gradients the data-parallel trainer adds from the
        blocks' factors (``block_factors``) rather than from filled gradients."""
        return tuple(f"W{i + 1}" for i in range(self.n_layers))

    def forward(self, x):
        """Activations [x, a1, ..., a_n] of rows ``x`` (a_n: logits when the last layer is linear)."""
        return [a[0] for a in self.forward_blocks([x])]

    def forward_blocks(self, xs):
        """:meth:`forward` of every block in ``xs``, layer by layer: ``acts[layer][block]``."""
        K, p = self.be.K, self.params
        acts = [list(xs)]
        for i in range(self.n_layers):
            W, b, act = p[f"W{i + 1}"], p[f"b{i + 1}"], self.acts[i]
            acts.append(each(lambda a: K.dense_forward(a, W, b, act), acts[-1]))
        return acts

    def backprop(self, acts, das, grads, factors=None):
        """From d/d(last output) back through every layer, for the blocks of
        :meth:`forward_blocks`' ``acts``: ``das``, ``grads`` (dicts) and ``factors`` hold one
        entry per block. Bias gradients are added into ``grads``, and weight gradients too,
        unless ``factors`` is given: then each block's ``factors[b][f"W{i}"]`` gets (layer
        input, dz, 1.0), its gradient being input.T @ dz."""
        K, p = self.be.K, self.params
        for i in reversed(range(self.n_layers)):
            W, act, need_dx = p[f"W{i + 1}"], self.acts[i], i > 0
            w_name, b_name = f"W{i + 1}", f"b{i + 1}"
            if factors is None:
                def step(da, x, a, g):
                    return K.dense_backward(da, x, W, a, act, g[w_name], g[b_name], need_dx=need_dx)
                das = each(step, das, acts[i], acts[i + 1], grads)
            else:
                def step(da, x, a, g):
                    return K.dense_backward_factors(da, x, W, a, act, g[b_name], need_dx=need_dx)
                out = each(step, das, acts[i], acts[i + 1], grads)
                for f, x, (_, dz) in zip(factors, acts[i], out):
                    f[w_name] = (x, dz, 1.0)
                das = [dx for dx, _ in out]
