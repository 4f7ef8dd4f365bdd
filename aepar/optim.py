"""Optimisers over dicts of named parameters, using the update kernels, their learning-rate
schedules, and the L-BFGS driver (scipy) for full-batch objectives."""
from __future__ import annotations

import functools
import importlib.metadata
import math
import os
import sys

import numpy as np

from aepar.rows import calls_in_turns, parallel_map, threads, weight_bands

# a step that updates fewer elements than this, with no factored gradient, runs on the
# calling thread: a hand-off to the other threads and back would cost more than it saves
# (the CAE's Adam step, about ten thousand elements: docs/performance-notes.md)
HAND_OFF_ELEMENTS = 1 << 16
# a parameter of fewer elements than this is stepped whole by one thread, not cut into a
# band per thread: a band's call costs more Python (run in turn under the interpreter lock)
# than half its arithmetic saves (a layer's biases: docs/performance-notes.md)
BAND_ELEMENTS = 1 << 14


def in_bands(update, *arrays_per_param, extras=None, more=()):
    """``update(*arrays, *extra)`` on every parameter's arrays, each whole or cut into a
    band of rows per thread (:func:`aepar.rows.weight_bands`; whole below
    :data:`BAND_ELEMENTS`), and ``more`` ((a call of no arguments, the elements it
    updates) each), all in one hand-off to this rank's threads,
    each call given to a thread by :func:`aepar.rows.calls_in_turns` (``extras``: one tuple
    of arguments per parameter). The updates are element-wise, so a band gives the bits the
    whole array would (on one thread Adam's update was a large share of a 2-thread
    fine-tuning epoch)."""
    extras = extras or [()] * len(arrays_per_param[0])
    if threads() == 1:  # one band per parameter: the whole of it (a GPU's run, or one core)
        for call, _ in more:
            call()
        for arrays, extra in zip(zip(*arrays_per_param), extras):
            update(*arrays, *extra)
        return
    calls = list(more)
    params = list(zip(*arrays_per_param))
    widths = [a[0].size // max(a[0].shape[0], 1) for a in params]
    cut = [i for i, a in enumerate(params) if a[0].size >= BAND_ELEMENTS]
    bands = [[0, a[0].shape[0]] for a in params]
    for i, bounds in zip(cut, weight_bands([(params[i][0].shape[0], widths[i]) for i in cut])):
        bands[i] = bounds
    for arrays, extra, width, bounds in zip(params, extras, widths, bands):
        calls += [(functools.partial(update, *(a[lo:hi] for a in arrays), *extra), (hi - lo) * width)
                  for lo, hi in zip(bounds[:-1], bounds[1:])]
    parallel_map(lambda call: call(), calls_in_turns([c for c, _ in calls], [n for _, n in calls]))


def _on_one_thread(params: dict, grads: dict) -> bool:
    """Whether a step runs on the calling thread alone: one thread, or a step too small for
    a hand-off (:data:`HAND_OFF_ELEMENTS`, no factored gradient)."""
    return threads() == 1 or (sum(p.size for p in params.values()) < HAND_OFF_ELEMENTS
                              and not any(isinstance(g, FactoredGradient) for g in grads.values()))


class FactoredGradient:
    """A weight's gradient left as its blocks' factors, Σ_b alphas[b] A_b.T @ D_b added in
    the fixed tree ``merges`` (``block_outer_sum``), in bands of the weight's rows, one per
    thread or the whole weight (:func:`aepar.rows.weight_bands`): (A's columns of the band,
    D, starts, alphas, first row, end row). The
    data-parallel trainer hands it to the step where one process holds every block: SGD
    takes it inside its step (``block_outer_sum_sgd``: written out, the gradient is a pass
    over memory the size of the weight, and the step another over it), Adam writes each
    band into ``out`` and steps it in the same call, LARS has it all written first (its
    rates need the norms; :func:`written`)."""

    def __init__(self, K, bands, merges, out):
        self.K, self.bands, self.merges, self.out = K, bands, merges, out

    def sized(self, calls) -> list:
        """``calls`` (one per band: :meth:`write_calls`, :meth:`step_calls`) paired with the
        elements of their bands: :func:`in_bands`' ``more``."""
        return [(call, (hi - lo) * self.out.shape[1]) for call, (*_, lo, hi) in zip(calls, self.bands)]

    def write_calls(self, then=None) -> list:
        """Writing the gradient into ``out``, as calls of no arguments, one per band;
        ``then(lo, hi)``, if given, runs in the same call right after its band's rows
        lo:hi are written (an element-wise step of those rows: no second hand-off)."""
        def write(A, D, starts, alphas, lo, hi):
            self.K.block_outer_sum(A, D, starts, self.merges, alphas, self.out[lo:hi])
            if then is not None:
                then(lo, hi)
        return [functools.partial(write, *band) for band in self.bands]

    def step_calls(self, p, v, lr: float, momentum: float, weight_decay: float) -> list:
        """SGD with momentum on ``p`` and its velocity ``v`` with this gradient, as calls
        of no arguments, one per band (the same bits as ``sgd_momentum_update`` with the
        gradient written out)."""
        return [functools.partial(self.K.block_outer_sum_sgd, A, D, starts, self.merges, alphas, p[lo:hi], v[lo:hi],
                                  lr, momentum, weight_decay) for A, D, starts, alphas, lo, hi in self.bands]


def written(grads: dict) -> dict:
    """``grads`` with every :class:`FactoredGradient` written out (all their bands in one
    hand-off to the threads, shared out by :func:`aepar.rows.calls_in_turns`)."""
    bands = [band for g in grads.values() if isinstance(g, FactoredGradient) for band in g.sized(g.write_calls())]
    if bands:
        parallel_map(lambda call: call(), calls_in_turns([c for c, _ in bands], [n for _, n in bands]))
    return {k: g.out if isinstance(g, FactoredGradient) else g for k, g in grads.items()}


class SGD:
    """SGD with momentum: v = momentum*v - lr*g; p += v (the RBM/backprop recipe).

    With ``trust`` > 0 the weight matrices (2-D parameters) take layer-wise adaptive rates
    (LARS, You, Gitman & Ginsburg 2017): lr * trust * ‖p‖ / (‖g‖ + c‖p‖), c the weight
    decay, so every step moves a matrix by about the same fraction of its norm however
    large the batch (and so however small the averaged gradient); biases keep ``lr``."""

    def __init__(self, be, params: dict, lr: float, momentum: float = 0.0, trust: float = 0.0,
                 weight_decay: float = 0.0):
        self.be, self.params, self.lr, self.momentum, self.trust = be, params, lr, momentum, trust
        # every weight matrix's decay, where a step names none
        self.weight_decay = {k: weight_decay for k, p in params.items() if p.ndim >= 2}
        self.velocity = {k: be.zeros(p.shape, p.dtype) for k, p in params.items()}

    def step(self, grads: dict, lr: float | None = None, momentum: float | None = None,
             weight_decay: dict | None = None):
        """One step; ``weight_decay`` (name -> coefficient; default: the constructor's for
        every 2-D parameter) adds coefficient * p to those gradients inside the step (the
        arrays in ``grads`` are left as they were)."""
        lr = self.lr if lr is None else lr
        momentum = self.momentum if momentum is None else momentum
        weight_decay = self.weight_decay if weight_decay is None else weight_decay
        if self.trust:  # LARS's rates need the gradients' norms
            grads = written(grads)
        decay = {k: float((weight_decay or {}).get(k, 0.0)) for k in self.params}
        factored = [k for k in self.params if isinstance(grads[k], FactoredGradient)]
        names = [k for k in self.params if k not in factored]
        rates = [self.rate(self.params[k], grads[k], lr, decay[k]) for k in names]
        more = [band for k in factored for band in grads[k].sized(
            grads[k].step_calls(self.params[k], self.velocity[k], lr, momentum, decay[k]))]
        one = _on_one_thread(self.params, grads)
        params, grads, velocity = ([d[k] for k in names] for d in (self.params, grads, self.velocity))
        if one:  # the other parameters in one call (one launch on a GPU, not one each)
            for call, _ in more:
                call()
            self.be.K.sgd_momentum_update_many(params, grads, velocity, rates, momentum, [decay[k] for k in names])
            return
        in_bands(lambda p, g, v, rate, c: self.be.K.sgd_momentum_update(p, g, v, rate, momentum, c),
                 params, grads, velocity, extras=[(rate, decay[k]) for rate, k in zip(rates, names)], more=more)

    def rate(self, p, g, lr: float, decay: float) -> float:
        """The step's rate for parameter ``p`` with gradient ``g``: ``lr``, or LARS's."""
        if not self.trust or p.ndim < 2:
            return lr
        p_norm, g_norm = float(self.be.xp.linalg.norm(p)), float(self.be.xp.linalg.norm(g))
        if p_norm == 0.0 or g_norm == 0.0:  # nothing to scale by (a zero start, a zero gradient)
            return lr
        return lr * self.trust * p_norm / (g_norm + decay * p_norm)

    def state(self) -> dict:
        return {f"velocity/{k}": v for k, v in self.velocity.items()}

    def load_state(self, state: dict):
        for k in self.velocity:
            self.velocity[k][...] = self.be.asarray(state[f"velocity/{k}"])


class Adam:
    """Adam (Kingma & Ba) with bias correction.

    ``weight_decay`` > 0 shrinks the weight matrices (2-D parameters; biases are left) by
    1 - lr * weight_decay each step, decoupled from the gradient (AdamW, Loshchilov &
    Hutter 2019): an L2 term in the gradient would be rescaled away by Adam's own
    per-element scaling."""

    def __init__(self, be, params: dict, lr: float = 1e-3, beta1=0.9, beta2=0.999, eps=1e-8,
                 weight_decay: float = 0.0):
        self.be, self.params = be, params
        self.lr, self.beta1, self.beta2, self.eps = lr, beta1, beta2, eps
        self.decays = [weight_decay if p.ndim >= 2 else 0.0 for p in params.values()]  # the matrices only
        self.m = {k: be.zeros(p.shape, p.dtype) for k, p in params.items()}
        self.v = {k: be.zeros(p.shape, p.dtype) for k, p in params.items()}
        self.t = 0

    def step(self, grads: dict, lr: float | None = None):
        self.t += 1
        lr = self.lr if lr is None else lr

        def update(p, g, m, v, c):
            self.be.K.adam_update(p, g, m, v, self.t, lr, self.beta1, self.beta2, self.eps, c)
        if _on_one_thread(self.params, grads):  # every parameter in one call (one launch on a GPU, not one each)
            grads = written(grads)
            names = list(self.params)
            self.be.K.adam_update_many([self.params[k] for k in names], [grads[k] for k in names],
                                       [self.m[k] for k in names], [self.v[k] for k in names], self.t, lr,
                                       self.beta1, self.beta2, self.eps, self.decays)
            return
        # a factored gradient's band is written and stepped by one call: the step is
        # element-wise, so each thread's rows need only their own band (one hand-off a step)
        decay = dict(zip(self.params, self.decays))
        factored = [k for k in self.params if isinstance(grads[k], FactoredGradient)]
        more = [band for k in factored for band in grads[k].sized(grads[k].write_calls(
            then=lambda lo, hi, k=k, g=grads[k].out: update(self.params[k][lo:hi], g[lo:hi], self.m[k][lo:hi],
                                                            self.v[k][lo:hi], decay[k])))]
        names = [k for k in self.params if k not in factored]
        in_bands(update, [self.params[k] for k in names], [grads[k] for k in names], [self.m[k] for k in names],
                 [self.v[k] for k in names], extras=[(decay[k],) for k in names], more=more)

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


def make_optimizer(be, params, kind: str, lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
    """The backprop optimiser a task asked for: ``kind`` "adam" (momentum unused) or "sgd",
    with ``weight_decay`` on the weight matrices (Adam's decoupled, SGD's in the gradient:
    without momentum both shrink the matrices by 1 - lr * weight_decay a step)."""
    if kind == "adam":
        return Adam(be, params, lr=lr, weight_decay=weight_decay)
    return SGD(be, params, lr=lr, momentum=momentum, weight_decay=weight_decay)


def cosine(lr: float, epochs: int, first: int = 0):
    """A learning-rate schedule, the rate of each (0-based) epoch: half a cosine from ``lr``
    at epoch ``first`` toward 0 by the end of epoch ``epochs``; ``lr`` before ``first`` (a
    warm-up sets those)."""
    def lr_at(epoch: int) -> float:
        if epoch < first or epochs <= first:
            return lr
        return lr * 0.5 * (1.0 + math.cos(math.pi * (epoch - first) / (epochs - first)))
    return lr_at


class LBFGSB:
    """L-BFGS-B (scipy's implementation, float64 on the host) whose whole state can be saved.

    The loop of ``scipy.optimize.minimize(method="L-BFGS-B")`` with its defaults (10
    corrections, ftol 2.2e-9, gtol 1e-5, 20 line-search steps), run over scipy's
    ``setulb`` directly so that between iterations the optimiser's memory (its work
    arrays) can go into a checkpoint and come back: a resumed run then takes exactly the
    steps of an uninterrupted one. Where this scipy's ``setulb`` cannot be driven (a
    private interface), :attr:`exact_resume` is False and a resumed run restarts the
    optimiser's memory from the checkpointed θ (README, "Reliability").

    Parameters
    ----------
    fun : callable(theta) -> (cost, grad)
    theta0 : array
    maxiter : int
        Iterations; the evaluations are limited to 2 maxiter + 20, as before.
    """

    MAXCOR, FTOL, GTOL, MAXLS = 10, 2.2204460492503131e-09, 1e-5, 20

    @staticmethod
    def warm_up():
        """Load scipy's ``setulb`` now (:func:`_setulb`), not in a run's timed iterations:
        loading the optimiser is not training time."""
        _setulb()

    def __init__(self, fun, theta0, maxiter: int):
        self.fun = fun
        self.maxiter, self.maxfun = int(maxiter), 2 * int(maxiter) + 20
        n, m = np.size(theta0), self.MAXCOR
        self.x = np.array(theta0, dtype=np.float64).reshape(-1)
        self.f = np.array(0.0)
        self.g = np.zeros(n)
        self.wa = np.zeros(2 * m * n + 5 * n + 11 * m * m + 8 * m)
        self.iwa = np.zeros(3 * n, dtype=np.int32)
        self.task = np.zeros(2, dtype=np.int32)
        self.ln_task = np.zeros(2, dtype=np.int32)
        self.lsave = np.zeros(4, dtype=np.int32)
        self.isave = np.zeros(44, dtype=np.int32)
        self.dsave = np.zeros(29)
        self.iterations = 0
        self.evaluations = 0
        self.exact_resume = _setulb() is not None

    _STATE = ("x", "f", "g", "wa", "iwa", "task", "ln_task", "lsave", "isave", "dsave")

    def state(self) -> dict:
        """Everything needed to continue (between iterations), as arrays."""
        out = {k: np.array(getattr(self, k)) for k in self._STATE}
        out["counts"] = np.array([self.iterations, self.evaluations], dtype=np.int64)
        out["exact"] = np.array(int(self.exact_resume))
        return out

    def load_state(self, state: dict):
        """Continue from :meth:`state`; with an inexact driver, from its θ only."""
        counts = np.asarray(state["counts"])
        self.iterations, self.evaluations = int(counts[0]), int(counts[1])
        if self.exact_resume and int(state.get("exact", 0)):
            for k in self._STATE:
                current = getattr(self, k)
                value = np.asarray(state[k], dtype=current.dtype)
                if value.shape != current.shape:
                    raise ValueError(f"L-BFGS state {k} has shape {value.shape}, not {current.shape}")
                setattr(self, k, value.copy())
        else:
            self.x = np.array(state["x"], dtype=np.float64).reshape(-1)
            self.exact_resume = False
            self._restarted = True

    def run(self, callback=None):
        """Iterate until done or until ``callback(iteration, cost, theta)`` returns True
        (then :meth:`state` is the point to continue from; the callback also sees the last
        iteration, where it cannot pause). Returns a scipy-like result with ``paused`` set
        when the callback stopped it."""
        setulb = _setulb()
        if setulb is None or getattr(self, "_restarted", False):
            return self._run_minimize(callback)
        factr, pgtol = self.FTOL / np.finfo(float).eps, self.GTOL
        n = self.x.size
        nbd, bound = np.zeros(n, np.int32), np.zeros(n)
        paused = False
        while True:
            self.g = self.g.astype(np.float64)
            try:
                setulb(self.MAXCOR, self.x, bound, bound, nbd, self.f, self.g, factr, pgtol, self.wa, self.iwa,
                       self.task, self.lsave, self.isave, self.dsave, self.MAXLS, self.ln_task)
            except TypeError as exc:  # a scipy whose private setulb changed its signature
                _say_once(f"aepar: note: this scipy's setulb takes other arguments ({exc}); L-BFGS runs through "
                          "scipy.optimize.minimize, and a resumed run restarts the optimiser's memory")
                self.exact_resume = False
                return self._run_minimize(callback)
            if self.task[0] == 3:  # FG: evaluate at x
                f, g = self.fun(self.x)
                self.f, self.g = np.array(f, dtype=np.float64), np.asarray(g, dtype=np.float64)
                self.evaluations += 1
            elif self.task[0] == 1:  # NEW_X: an iteration ended
                self.iterations += 1
                done = self.iterations >= self.maxiter or self.evaluations > self.maxfun
                if self.iterations >= self.maxiter:
                    self.task[:] = (5, 504)
                elif self.evaluations > self.maxfun:
                    self.task[:] = (5, 502)
                if callback is not None and callback(self.iterations, float(self.f), self.x) and not done:
                    paused = True
                    break
            else:
                break
        return self._result(paused)

    def _result(self, paused):
        status = {4: "CONVERGENCE", 5: "STOP", 6: "WARNING", 7: "ERROR", 8: "ABNORMAL"}.get(int(self.task[0]), "")
        return LBFGSResult(x=self.x.copy(), fun=float(self.f), nit=self.iterations, nfev=self.evaluations,
                           message=f"{status} ({int(self.task[1])})" if not paused else "paused",
                           success=int(self.task[0]) == 4 or (int(self.task[0]) == 5 and
                                                               int(self.task[1]) in (502, 504)),
                           paused=paused)

    def _run_minimize(self, callback):
        """The public scipy interface: no access to the memory, so it starts afresh from x."""
        from scipy.optimize import minimize

        done = self.iterations
        paused = []

        class Pause(Exception):
            pass

        def on_iteration(intermediate_result):  # scipy passes the result object to this name
            self.iterations += 1
            x, fun = intermediate_result.x, float(intermediate_result.fun)
            self.x, self.f = np.array(x), np.array(fun)
            if callback is not None and callback(self.iterations, fun, x) and self.iterations < self.maxiter:
                paused.append(True)
                raise Pause

        def fun(x):
            self.evaluations += 1
            return self.fun(x)
        try:
            res = minimize(fun, self.x, jac=True, method="L-BFGS-B", callback=on_iteration,
                           options={"maxiter": self.maxiter - done, "maxfun": self.maxfun - self.evaluations,
                                    "maxcor": self.MAXCOR, "ftol": self.FTOL, "gtol": self.GTOL,
                                    "maxls": self.MAXLS})
            self.x, self.f = np.array(res.x), np.array(float(res.fun))
            self.task[:] = (4 if res.success else 5, 0)
        except Pause:
            pass
        return LBFGSResult(x=self.x.copy(), fun=float(self.f), nit=self.iterations, nfev=self.evaluations,
                           message="paused" if paused else "restarted-memory driver",
                           success=not paused, paused=bool(paused))


class LBFGS:
    """L-BFGS without bounds (Nocedal & Wright, Algorithm 7.5), the two-loop direction in
    aepar's own kernel and a strong-Wolfe line search (their Algorithms 3.5 and 3.6, cubic
    interpolation): the method of UFLDL's minFunc, with :class:`LBFGSB`'s interface, limits
    and stopping tests (10 pairs, ftol 2.2e-9 on the relative decrease, gtol 1e-5 on the
    largest gradient element, 20 evaluations a line search).

    For objectives with no bounds, such as the sparse autoencoder's. The root optimiser's
    step is serial: every other rank waits for it, so its cost bounds the speed-up at many
    ranks. Here the direction is one kernel call over the stored pairs, where L-BFGS-B
    (scipy's ``setulb``) also runs its bound-handling machinery (the Cauchy point, the
    subspace minimisation), work for nothing without bounds. Its iterates are its own, not
    L-BFGS-B's. The whole state is a handful of arrays, so a resumed run takes exactly the
    steps of an uninterrupted one.
    """

    MEMORY, FTOL, GTOL, MAXLS, C1, C2 = 10, LBFGSB.FTOL, LBFGSB.GTOL, LBFGSB.MAXLS, 1e-4, 0.9
    exact_resume = True

    def __init__(self, fun, theta0, maxiter: int):
        from aepar.backend import host_kernels

        self.fun, self.kernel = fun, host_kernels().lbfgs
        self.maxiter, self.maxfun = int(maxiter), 2 * int(maxiter) + 20
        n = np.size(theta0)
        self.x = np.array(theta0, dtype=np.float64).reshape(-1)
        self.f = np.array(np.nan)
        self.g = np.zeros(n)
        self.S, self.Y = np.zeros((self.MEMORY, n)), np.zeros((self.MEMORY, n))
        self.rho = np.zeros(self.MEMORY)
        self.pairs = 0  # pairs stored so far: pair k in row k % MEMORY
        self.iterations = self.evaluations = 0
        self._trial = np.empty(n)  # the points the line search evaluates: one array, whose views fun may keep

    _STATE = ("x", "f", "g", "S", "Y", "rho")

    @classmethod
    def warm_up(cls):
        """Three iterations on a small quadratic of unequal curvatures (no exact first step:
        the later directions use the stored pairs), so that Numba loads (or, the first time
        on a machine, compiles) every kernel a run's iterations call now and not in its
        timed iterations: loading the optimiser is not training time."""
        c = np.arange(1.0, 10.0)
        cls(lambda x: (0.5 * float(c @ (x * x)), c * x), np.ones(9), 3).run()

    def state(self) -> dict:
        """Everything needed to continue (between iterations), as arrays."""
        out = {k: np.array(getattr(self, k)) for k in self._STATE}
        out["counts"] = np.array([self.iterations, self.evaluations, self.pairs], dtype=np.int64)
        return out

    def load_state(self, state: dict):
        for k in self._STATE:
            value = np.array(state[k], dtype=np.float64)
            if value.shape != np.shape(getattr(self, k)):
                raise ValueError(f"L-BFGS state {k} has shape {value.shape}, not {np.shape(getattr(self, k))}")
            setattr(self, k, value)
        self.iterations, self.evaluations, self.pairs = (int(c) for c in np.asarray(state["counts"]))

    def _evaluate(self, x):
        f, g = self.fun(x)
        self.evaluations += 1
        return float(f), np.array(g, dtype=np.float64).reshape(-1)

    def run(self, callback=None):
        """Iterate until a stopping test or until ``callback(iteration, cost, theta)``
        returns True (then :meth:`state` continues from there). Returns an
        :class:`LBFGSResult`."""
        if not np.isfinite(self.f):  # a fresh start: the first evaluation
            f, self.g = self._evaluate(self.x)
            self.f = np.array(f)
        d = np.empty_like(self.x)
        status, paused = "STOP: iterations", False
        while self.iterations < self.maxiter:
            # d = -H g and its slope; -g, the pairs forgotten, where rounding made d no descent
            top, slope, self.pairs = self.kernel.direction(self.S, self.Y, self.rho, self.pairs, self.g, d,
                                                           self.GTOL)
            if top <= self.GTOL:
                status = "CONVERGENCE: the gradient"
                break
            # the first step scaled to a unit move (minFunc's), later ones the quasi-Newton step
            t = min(1.0, 1.0 / np.sum(np.abs(self.g))) if self.pairs == 0 else 1.0
            found = self._line_search(d, float(self.f), slope, t)
            if found is None:
                status = "ABNORMAL: the line search found no acceptable step"
                break
            t, f_new, g_new = found
            f_old = float(self.f)
            # x += t d (the point evaluated), g = g_new, and the pair (s, y) kept
            self.pairs = self.kernel.keep_pair(self.x, t, d, self.g, g_new, self.S, self.Y, self.rho, self.pairs)
            self.f = np.array(f_new)
            self.iterations += 1
            small = f_old - f_new <= self.FTOL * max(abs(f_old), abs(f_new), 1.0)
            done = ("CONVERGENCE: the relative decrease" if small
                    else "STOP: evaluations" if self.evaluations > self.maxfun else None)
            # the callback sees every iteration, the last included (where it cannot pause)
            if callback is not None and callback(self.iterations, f_new, self.x) and not done \
                    and self.iterations < self.maxiter:
                paused = True
                break
            if done:
                status = done
                break
        return LBFGSResult(x=self.x.copy(), fun=float(self.f), nit=self.iterations, nfev=self.evaluations,
                           message="paused" if paused else status, paused=paused,
                           success=not paused and not status.startswith("ABNORMAL"))

    def _line_search(self, d, f0, slope, t):
        """A step t along ``d`` with the strong Wolfe conditions: (t, f, g) or None."""
        prev = (0.0, f0, slope, self.g)
        trial = self._trial
        for k in range(self.MAXLS):
            self.kernel.step_to(self.x, t, d, trial)
            f, g = self._evaluate(trial)
            gd = self.kernel.dot(g, d)
            point = (t, f, gd, g)
            if not math.isfinite(f) or f > f0 + self.C1 * t * slope or (k and f >= prev[1]):
                return self._zoom(d, f0, slope, prev, point, self.MAXLS - k - 1, trial)
            if abs(gd) <= -self.C2 * slope:
                return t, f, g
            if gd >= 0:
                return self._zoom(d, f0, slope, point, prev, self.MAXLS - k - 1, trial)
            prev, t = point, _cubic_step(prev, point, 1.1 * t, 10.0 * t) if k else 2.0 * t
        return None

    def _zoom(self, d, f0, slope, lo, hi, left, trial):
        """Algorithm 3.6: ``lo`` the end with the lower cost, the minimiser between lo and hi."""
        for _ in range(left):
            a, b = min(lo[0], hi[0]), max(lo[0], hi[0])
            t = _cubic_step(lo, hi, a + 0.1 * (b - a), b - 0.1 * (b - a))
            self.kernel.step_to(self.x, t, d, trial)
            f, g = self._evaluate(trial)
            gd = self.kernel.dot(g, d)
            if not math.isfinite(f) or f > f0 + self.C1 * t * slope or f >= lo[1]:
                hi = (t, f, gd, g)
                continue
            if abs(gd) <= -self.C2 * slope:
                return t, f, g
            if gd * (hi[0] - lo[0]) >= 0:
                hi = lo
            lo = (t, f, gd, g)
        return (lo[0], lo[1], lo[3]) if lo[0] > 0 else None  # the best decrease found, if any


def _cubic_step(p, q, lo: float, hi: float) -> float:
    """The minimiser of the cubic through two points (t, f, f'(t), ...), kept in [lo, hi];
    the middle where the cubic has none or a cost is not finite."""
    (a, fa, ga), (b, fb, gb) = p[:3], q[:3]
    if math.isfinite(fa) and math.isfinite(fb) and a != b:
        d1 = ga + gb - 3.0 * (fa - fb) / (a - b)
        disc = d1 * d1 - ga * gb
        if disc >= 0.0:
            d2 = math.copysign(math.sqrt(disc), b - a)
            denom = gb - ga + 2.0 * d2
            if denom != 0.0:
                t = b - (b - a) * (gb + d2 - d1) / denom
                if math.isfinite(t):
                    return min(max(t, lo), hi)
    return 0.5 * (lo + hi)


class LBFGSResult(dict):
    """What scipy's OptimizeResult gives (x, fun, nit, nfev, message, success, paused), as a
    dict whose keys are also attributes, without importing scipy.optimize."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


@functools.lru_cache(maxsize=None)
def _say_once(message: str):
    print(message, file=sys.stderr, flush=True)


def _setulb():
    """scipy's ``setulb`` if it has the interface this driver knows (scipy >= 1.15), else None."""
    if os.environ.get("AEPAR_LBFGS_PUBLIC"):  # the tests' way to exercise the fallback
        return None
    return _load_setulb()


@functools.lru_cache(maxsize=None)
def _load_setulb():
    """``setulb`` from scipy's ``_lbfgsb`` extension, loaded from its file without
    scipy.optimize's package: that package imports every solver and parses their
    docstrings, a large part of a short run's start-up (``python -m aepar.sparse
    --iterations 1``). Where the file is not found or does not load so, the package import."""
    try:
        major, minor = (int(p) for p in importlib.metadata.version("scipy").split(".")[:2])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None
    if (major, minor) < (1, 15):
        return None
    from aepar.extensions import from_file

    module = sys.modules.get("scipy.optimize._lbfgsb") or from_file("scipy.optimize._lbfgsb")
    if module is None:
        try:
            from scipy.optimize import _lbfgsb as module
        except ImportError:
            return None
    return getattr(module, "setulb", None)
