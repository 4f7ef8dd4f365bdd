"""Root-only optimisation of a full-batch objective whose sums live on every rank.

Lewis & Canann's scheme: every rank holds the parameters and a shard of the samples;
only the root runs the optimiser (L-BFGS-B). Each evaluation of J(θ) is

1. root: ``Bcast`` of one preallocated buffer [control word, θ] (control: evaluate,
   stop, or "the root failed");
2. every rank: its shard's packed partial sums (``local_partials_fn``);
3. ``Reduce`` of the packed buffer to the root;
4. root: J and ∂J/∂θ from the summed buffer (``assemble_fn``).

That is two collectives per evaluation (the seed issued 2 Bcast + 6 pickled reduces).
The workers loop on the broadcast until the root says stop. An exception on the root (in
the optimiser, in the assembly or in its own partials) never leaves the workers waiting:
the root broadcasts "failed" and the error's one-line description, and the workers raise
:class:`RootFailure` naming it; if the root fails between the broadcast and the reduce
it still takes part in that reduce first, so the collectives stay matched.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["RootOptimizer", "RootResult", "RootFailure", "EVALUATE", "STOP", "FAILED"]

EVALUATE, STOP, FAILED = 1.0, 0.0, -1.0


class RootFailure(RuntimeError):
    """Raised on the workers when the root stopped because of an error."""


@dataclass
class RootResult:
    """What :meth:`RootOptimizer.run` returns on every rank.

    ``theta``, ``cost``, ``iterations``, ``message`` and ``success`` are the optimiser's
    (root only; None elsewhere). Times are this rank's own: take the max over ranks to
    report them.
    """

    theta: np.ndarray | None
    cost: float | None
    iterations: int | None
    evaluations: int
    collectives: int               # collectives issued during evaluations (this rank)
    collectives_total: int         # including the final stop broadcast
    seconds_compute: float         # local partials (+ assembly on the root)
    seconds_comm: float            # bcast + reduce, waiting included
    seconds_total: float
    message: str = ""
    success: bool | None = None

    @property
    def collectives_per_evaluation(self) -> float:
        return self.collectives / self.evaluations if self.evaluations else 0.0


class RootOptimizer:
    """Broadcast θ, reduce packed partials, optimise on the root.

    Parameters
    ----------
    comm : aepar.comm.Comm
    local_partials_fn : callable(theta, out)
        Fills ``out`` with this rank's partial sums at ``theta`` (a view into the
        broadcast buffer, in ``dtype`` on the backend).
    assemble_fn : callable(partials, theta64) -> (cost, grad64)
        Root only: the objective and its float64 gradient from the summed buffer.
    n_theta : int
        Length of θ.
    partials : array
        The packed buffer ``local_partials_fn`` fills and the reduction sums (allocated
        once by the caller, on the backend).
    xp, dtype :
        Array module and dtype of the broadcast buffer (the model's).
    minimize : callable(fun, theta0, maxiter, callback) -> scipy OptimizeResult
        Default :func:`aepar.optim.lbfgs` (L-BFGS-B, float64 on the host).
    synchronize : callable, optional
        Waits for queued device work (``Backend.synchronize``) so that GPU compute time is
        not booked as communication.
    """

    def __init__(self, comm, local_partials_fn, assemble_fn, n_theta: int, partials, *, xp=np,
                 dtype=np.float64, minimize=None, synchronize=None):
        self.comm = comm
        self.local_partials_fn = local_partials_fn
        self.assemble_fn = assemble_fn
        self.n_theta = int(n_theta)
        self.partials = partials
        self.xp = xp
        self.buffer = xp.zeros(self.n_theta + 1, dtype=dtype)  # [control, θ]
        if minimize is None:
            from aepar.optim import lbfgs as minimize
        self.minimize = minimize
        self.synchronize = synchronize or (lambda: None)
        self._reset()

    def _reset(self):
        self.evaluations = 0
        self.collectives = 0
        self.seconds_compute = 0.0
        self.seconds_comm = 0.0
        self.last_cost = None

    # ---- the root's objective ---------------------------------------------------------
    def evaluate(self, theta64):
        """J(θ), ∂J/∂θ over every rank's samples (root only; workers must be serving)."""
        comm, wtime = self.comm, self.comm.wtime
        before = comm.collectives
        t0 = wtime()
        self.buffer[0] = EVALUATE
        self.buffer[1:] = self.xp.asarray(theta64, dtype=self.buffer.dtype)
        comm.bcast(self.buffer)
        t1 = wtime()
        try:
            self.local_partials_fn(self.buffer[1:], self.partials)
            self.synchronize()
        finally:  # the workers are in (or on their way to) this reduce: always join it
            t2 = wtime()
            comm.reduce(self.partials)
            t3 = wtime()
            self.seconds_comm += (t1 - t0) + (t3 - t2)
            self.seconds_compute += t2 - t1
            self.collectives += comm.collectives - before
        cost, grad = self.assemble_fn(self.partials, theta64)
        self.seconds_compute += wtime() - t3
        self.evaluations += 1
        self.last_cost = cost
        return cost, grad

    def _send(self, code: float):
        self.buffer[0] = code
        self.comm.bcast(self.buffer)

    # ---- the loop -----------------------------------------------------------------
    def run(self, theta0=None, maxiter: int = 400, callback=None) -> RootResult:
        """Optimise from ``theta0`` (root) for at most ``maxiter`` iterations.

        Every rank calls it; workers ignore ``theta0`` and serve evaluations until the
        root stops. ``callback(iteration, cost, theta)`` runs on the root after each
        iteration. Raises on the root whatever the optimisation raised, and
        :class:`RootFailure` on the workers when that happened.
        """
        self._reset()
        start = self.comm.wtime()
        total_before = self.comm.collectives
        if self.comm.is_root:
            res = self._run_root(theta0, maxiter, callback)
        else:
            res = self._serve()
        return RootResult(
            theta=None if res is None else np.asarray(res.x, dtype=np.float64),
            cost=None if res is None else float(res.fun),
            iterations=None if res is None else int(res.nit),
            evaluations=self.evaluations, collectives=self.collectives,
            collectives_total=self.comm.collectives - total_before,
            seconds_compute=self.seconds_compute, seconds_comm=self.seconds_comm,
            seconds_total=self.comm.wtime() - start,
            message="" if res is None else str(res.message),
            success=None if res is None else bool(res.success))

    def _run_root(self, theta0, maxiter, callback):
        iteration = [0]

        def on_iteration(intermediate_result):
            iteration[0] += 1
            if callback is not None:
                callback(iteration[0], float(intermediate_result.fun), intermediate_result.x)

        try:
            res = self.minimize(self.evaluate, np.asarray(theta0, dtype=np.float64), maxiter,
                                callback=on_iteration)
        except BaseException as exc:  # stop the workers whatever happened, and tell them why
            self._send(FAILED)
            self.comm.bcast_obj(f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc)
                                else type(exc).__name__)
            raise
        self._send(STOP)
        return res

    def _serve(self):
        comm, wtime = self.comm, self.comm.wtime
        theta = self.buffer[1:]
        while True:
            t0 = wtime()
            comm.bcast(self.buffer)
            t1 = wtime()
            self.seconds_comm += t1 - t0
            code = float(self.buffer[0])
            if code == STOP:
                return None
            if code != EVALUATE:
                # the root's reason comes next: whichever rank's report survives the abort
                # that follows names the real error
                raise RootFailure(f"the root rank failed ({comm.bcast_obj(None)}); stopping")
            before = comm.collectives - 1
            self.local_partials_fn(theta, self.partials)
            self.synchronize()
            t2 = wtime()
            comm.reduce(self.partials)
            self.seconds_compute += t2 - t1
            self.seconds_comm += wtime() - t2
            self.collectives += comm.collectives - before
            self.evaluations += 1
