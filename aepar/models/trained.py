"""What the models trained by backprop with an optimiser share: their state for a
checkpoint, and the backward pass through their dense layers."""
from __future__ import annotations

import numpy as np

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
    """The backward pass of a model with dense layers ``W1, b1 .. W{n}, b{n}`` (``be``,
    ``params``, ``n_layers``, ``acts``: the layers' activation names)."""

    @property
    def factored(self) -> tuple:
        """The weights whose block gradients the data-parallel trainer adds from the
        blocks' factors (``leaf_factors``) rather than from filled gradients."""
        return tuple(f"W{i + 1}" for i in range(self.n_layers))

    def backprop(self, acts, da, grads, factors=None):
        """From d/d(last output) ``da`` back through every layer (``acts``: the forward's
        activations, input first): bias gradients added into ``grads``, and weight
        gradients too, unless ``factors`` is given: then ``factors[f"W{i}"]`` gets (layer
        input, dz, 1.0), the gradient being input.T @ dz."""
        K, p = self.be.K, self.params
        for i in reversed(range(self.n_layers)):
            W, b, act = p[f"W{i + 1}"], grads[f"b{i + 1}"], self.acts[i]
            if factors is None:
                da = K.dense_backward(da, acts[i], W, acts[i + 1], act, grads[f"W{i + 1}"], b, need_dx=i > 0)
            else:
                da, dz = K.dense_backward_factors(da, acts[i], W, acts[i + 1], act, b, need_dx=i > 0)
                factors[f"W{i + 1}"] = (acts[i], dz, 1.0)
