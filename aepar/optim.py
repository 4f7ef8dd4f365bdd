"""Optimisers over dicts of named parameters, using the update kernels, and the L-BFGS
driver (scipy) for full-batch objectives."""
from __future__ import annotations

import numpy as np


class SGD:
    """SGD with momentum: v = momentum*v - lr*g; p += v (the RBM/backprop recipe)."""

    def __init__(self, be, params: dict, lr: float, momentum: float = 0.0):
        self.be, self.params, self.lr, self.momentum = be, params, lr, momentum
        self.velocity = {k: be.xp.zeros_like(p) for k, p in params.items()}

    def step(self, grads: dict, lr: float | None = None, momentum: float | None = None):
        lr = self.lr if lr is None else lr
        momentum = self.momentum if momentum is None else momentum
        for k, p in self.params.items():
            self.be.K.sgd_momentum_update(p, grads[k], self.velocity[k], lr, momentum)

    def state(self) -> dict:
        return {f"velocity/{k}": v for k, v in self.velocity.items()}

    def load_state(self, state: dict):
        for k in self.velocity:
            self.velocity[k][...] = self.be.asarray(state[f"velocity/{k}"])


class Adam:
    """Adam (Kingma & Ba) with bias correction."""

    def __init__(self, be, params: dict, lr: float = 1e-3, beta1=0.9, beta2=0.999, eps=1e-8):
        self.be, self.params = be, params
        self.lr, self.beta1, self.beta2, self.eps = lr, beta1, beta2, eps
        self.m = {k: be.xp.zeros_like(p) for k, p in params.items()}
        self.v = {k: be.xp.zeros_like(p) for k, p in params.items()}
        self.t = 0

    def step(self, grads: dict, lr: float | None = None):
        self.t += 1
        lr = self.lr if lr is None else lr
        for k, p in self.params.items():
            self.be.K.adam_update(p, grads[k], self.m[k], self.v[k], self.t, lr,
                                  self.beta1, self.beta2, self.eps)

    def state(self) -> dict:
        out = {f"m/{k}": a for k, a in self.m.items()}
        out.update({f"v/{k}": a for k, a in self.v.items()})
        out["t"] = np.array(self.t)
        return out

    def load_state(self, state: dict):
        for k in self.m:
            self.m[k][...] = self.be.asarray(state[f"m/{k}"])
            self.v[k][...] = self.be.asarray(state[f"v/{k}"])
        self.t = int(state["t"])


def lbfgs(fun, theta0: np.ndarray, maxiter: int, callback=None):
    """Minimise ``fun(theta) -> (cost, grad)`` with scipy's L-BFGS-B (float64 on the host).

    Returns scipy's OptimizeResult. ``callback(theta)`` runs after each iteration.
    """
    from scipy.optimize import minimize

    return minimize(fun, np.asarray(theta0, dtype=np.float64), jac=True, method="L-BFGS-B",
                    callback=callback, options={"maxiter": maxiter, "maxfun": 2 * maxiter + 20})
