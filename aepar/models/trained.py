"""What every model trained by backprop with an optimiser shares: its state for a checkpoint."""
from __future__ import annotations

import numpy as np

__all__ = ["TrainedState"]


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
