"""Root-only optimisation of a full-batch objective whose sums live on every rank.

Lewis & Canann's scheme: every rank holds the parameters and a shard of the samples;
only the root runs the optimiser (L-BFGS-B, or aepar's L-BFGS). Each evaluation of J(θ) is

1. root: ``Bcast`` of one preallocated buffer [control word, θ] (control: evaluate,
   stop, pause, or "the root failed");
2. every rank: the sums that every rank needs before its partials, per block
   (``model.shared_sums``: the sparse autoencoder's Σ a2), and their fixed-tree total on
   every rank (the paper's reduce of the average activation and broadcast back);
3. every rank: the packed partial sums of each of its blocks of samples
   (``model.partials``, given that total), plus its safe-point flags (aepar.guard) in
   one extra column;
4. the fixed-tree sum of all blocks to the root (:class:`aepar.parallel.blocks.TreeSum`):
   the same bits on any number of ranks;
5. root: J and ∂J/∂θ from the summed buffer (``model.assemble``).

Every ``balance_every`` evaluations the root broadcasts "balance" instead: the ranks share
their seconds per block since the run's start and, where that shortens the slowest rank's
share by 10% or more, take new contiguous runs of blocks in proportion to their speeds
(``reattach`` gives the model its new samples). The blocks and their tree stay the same,
so the bits do too; only who computes which block moves, towards the ranks that compute
faster (machines of mixed speeds, or virtual CPUs that run at different speeds).

The workers loop on the broadcast until the root says stop. An exception on the root (in
the optimiser, in the assembly or in its own partials) never leaves the workers waiting:
the root broadcasts "failed" and the error, and the workers raise the same kind of error
(a user-facing one - divergence, an interruption - ends every rank with its exit code;
anything else is :class:`RootFailure`). If the root fails between the broadcast and the
reduction it still takes part in both sums first, so the communications stay matched.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from aepar import errors
from aepar.backend import host_kernels
from aepar.parallel.blocks import TreeSum
from aepar.rows import weighted_ranges

__all__ = ["RootOptimizer", "RootResult", "RootFailure", "EVALUATE", "STOP", "PAUSE", "FAILED", "BALANCE"]

EVALUATE, STOP, PAUSE, FAILED, BALANCE = 1.0, 0.0, 2.0, -1.0, 3.0
# the root's optimisers by name (aepar.optim): scipy's L-BFGS-B, aepar's L-BFGS without bounds
OPTIMIZERS = {"lbfgs-b": "LBFGSB", "lbfgs": "LBFGS"}
# a new share of the blocks is taken only if it makes the slowest rank's share this much shorter
BALANCE_GAIN = 0.9


class RootFailure(RuntimeError):
    """Raised on the workers when the root stopped because of an internal error."""


@dataclass
class RootResult:
    """What :meth:`RootOptimizer.run` returns on every rank.

    ``theta``, ``cost``, ``iterations``, ``message`` and ``success`` are the optimiser's
    (root only; None elsewhere). ``paused``: the run stopped at a safe point on request.
    Times are this rank's own: take the max over ranks to report them.
    """

    theta: np.ndarray | None
    cost: float | None
    iterations: int | None
    evaluations: int
    collectives: int               # communications issued during evaluations (this rank)
    collectives_total: int
    compute_s: float               # local partials (+ assembly on the root)
    comm_s: float                  # bcast + tree reduction, waiting included
    total_s: float
    message: str = ""
    success: bool | None = None
    paused: bool = False
    rebalances: int = 0            # times the blocks were shared anew (balance_every)
    # the root: its seconds outside its own blocks and the messages (the assembly, the
    # optimiser's step, the checks), which every other rank waits for; 0 elsewhere
    step_s: float = 0.0

    @property
    def collectives_per_evaluation(self) -> float:
        return self.collectives / self.evaluations if self.evaluations else 0.0


class RootOptimizer:
    """Broadcast θ, sum the blocks' partials in the fixed tree, optimise on the root.

    Parameters
    ----------
    comm : aepar.comm.Comm
    model :
        ``n_theta``, ``n_shared``, ``n_partials``, ``blocks`` (aepar.rows.Blocks: every
        block's samples, this rank's share), ``shared_sums(theta, rows)`` filling the first
        ``n_shared`` columns of one row per own block, ``partials(theta, leaves, shared) ->
        {tree node: row of leaves}`` (the sums of tree nodes that cover the own blocks, in
        the first ``n_partials`` columns, the node starting at the first block in row 0)
        given the total of the shared sums, and on the root ``assemble(total, theta64) ->
        (cost, grad64)``.
    xp, dtype :
        Array module and dtype of the broadcast and partials buffers (the model's).
    synchronize : callable, optional
        Waits for queued device work so that GPU compute is not booked as communication.
    guard : aepar.guard.Guard, optional
        Steps, flags and divergence checks.
    balance_every : int
        Evaluations between two balances of the blocks over the ranks (0: never).
    reattach : callable, optional
        ``reattach(blocks)`` gives the model the samples of its new share (an
        aepar.rows.Blocks); without it the shares stay as they are.
    """

    def __init__(self, comm, model, *, xp=np, dtype=np.float64, synchronize=None, guard=None, run=None,
                 balance_every: int = 0, reattach=None, optimizer: str = "lbfgs-b"):
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {sorted(OPTIMIZERS)}, got {optimizer!r}")
        self.comm, self.model, self.xp, self.dtype = comm, model, xp, dtype
        self.method = optimizer
        self.n_theta = int(model.n_theta)
        self.n = int(model.n_partials)
        self._share(model.blocks)
        self.shared = xp.zeros(int(model.n_shared), dtype=dtype)
        self.buffer = xp.zeros(self.n_theta + 1, dtype=dtype)  # [control, θ]
        self.theta = self.buffer[1:]  # one view, so that the model can keep its views of it
        self.synchronize = synchronize or (lambda: None)
        self.guard, self.run_dir = guard, run
        self.balance_every = int(balance_every) if comm.size > 1 and reattach is not None else 0
        self.reattach = reattach
        self.flags = 0.0
        self.optimizer = None
        self._largest = host_kernels().lbfgs.max_abs
        self._reset()

    def _share(self, blocks, ranges=None):
        """The tree and the buffers of this rank's share of the blocks."""
        self.tree = TreeSum(self.comm, blocks.count, ranges)
        mine = blocks.stop - blocks.first
        self.leaves = self.xp.zeros((mine, self.n + 1), dtype=self.dtype)  # + the flags
        self.shared_rows = self.xp.zeros((mine, int(self.model.n_shared)), dtype=self.dtype)

    def _reset(self):
        self.evaluations = 0
        self.collectives = 0
        self.compute_s = 0.0
        self.comm_s = 0.0
        self.blocks_s = 0.0  # seconds on this rank's own blocks, and their count times the evaluations
        self.block_evaluations = 0
        self.rebalances = 0

    # ---- one evaluation, every rank ----------------------------------------------------------
    def _local(self, theta):
        """This rank's blocks at θ, its flags in the extra column; returns the sum on the root.

        The others are in (or on their way to) both sums whatever happens here, so this
        rank joins both, with whatever its rows hold, before it raises."""
        wtime = self.comm.wtime
        failure = None
        t1 = wtime()
        try:
            self.model.shared_sums(theta, self.shared_rows)
            self.synchronize()
        except BaseException as exc:
            failure = exc
        t2 = wtime()
        self.tree.allreduce(self.shared_rows, self.shared)
        t3 = wtime()
        known = None
        if failure is None:
            try:
                known = self.model.partials(theta, self.leaves, self.shared)
                self.leaves[:, self.n] = 0
                if self.guard is not None:
                    self.leaves[0, self.n] = self.guard.flags()
                    self.guard.step(poison=self.leaves[:, :self.n])
                self.synchronize()
            except BaseException as exc:
                failure = exc
        t4 = wtime()
        # the same messages either way; after a failure, whatever the rows hold
        total = (self.tree.reduce(self.leaves) if failure is not None
                 else self.tree.reduce_nodes(self.tree.node_values_from(known)))
        own = (t2 - t1) + (t4 - t3)
        self.comm_s += (t3 - t2) + (wtime() - t4)
        self.compute_s += own
        self.blocks_s += own
        self.block_evaluations += self.leaves.shape[0]
        self.collectives += 4  # the broadcast of θ, the first sum (a reduction and a broadcast), the second
        if failure is not None:
            raise failure
        return total

    def warm_up(self):
        """Both rounds on this rank's blocks alone, without messages: loads the compiled
        kernels and touches every buffer (at the θ buffer as it is); on the root also the
        assembly of J and ∂J/∂θ (from one block's sums: else the first evaluation loads its
        kernel while every other rank waits), the optimiser's own code (its class's
        ``warm_up``) and the gradient's check."""
        theta = self.theta
        self.model.shared_sums(theta, self.shared_rows)
        self.shared[...] = self.shared_rows.sum(axis=0)  # not the total, but a ρ̂ in (0, 1)
        self.model.partials(theta, self.leaves, self.shared)
        if self.comm.is_root:
            from aepar import optim
            if self.leaves.shape[0]:
                self.model.assemble(self.leaves[0, :self.n], np.zeros(self.n_theta))
            getattr(optim, OPTIMIZERS[self.method]).warm_up()
            self._largest(np.zeros(self.n_theta))

    def evaluate(self, theta64):
        """J(θ), ∂J/∂θ over every rank's samples (root only; workers must be serving)."""
        wtime = self.comm.wtime
        if self.balance_every and self.evaluations and self.evaluations % self.balance_every == 0:
            t0 = wtime()
            self._send(BALANCE)
            self.comm_s += wtime() - t0
            self._balance()
        t0 = wtime()
        self.buffer[0] = EVALUATE
        self.buffer[1:] = self.xp.asarray(theta64, dtype=self.buffer.dtype)
        self.comm.Bcast(self.buffer)
        self.comm_s += wtime() - t0
        total = self._local(self.theta)
        t3 = wtime()
        total = self.xp.asarray(total)
        self.flags = float(total[self.n])
        cost, grad = self.model.assemble(total[:self.n], theta64)
        self.compute_s += wtime() - t3
        self.evaluations += 1
        # one compiled pass finds a non-finite gradient (NaN or infinity: the largest |g_i| is
        # then not finite); only then is the error named, element by element
        if self.guard is not None and not (math.isfinite(cost) and math.isfinite(self._largest(grad))):
            where = f"sparse autoencoder, iteration {self.optimizer.iterations + 1} (evaluation {self.evaluations})"
            self.guard.check(cost, "the cost", where, self.run_dir, self.comm)
            self.guard.check(grad, "the gradient", where, self.run_dir, self.comm)
        return cost, grad

    # ---- the loop -----------------------------------------------------------------------
    def run(self, theta0=None, maxiter: int = 400, on_iteration=None, state=None) -> RootResult:
        """Optimise from ``theta0`` (root) for at most ``maxiter`` iterations.

        Every rank calls it; workers ignore the arguments and serve evaluations until the
        root stops. ``on_iteration(optimizer, cost, flags) -> bool`` runs on the root after
        each iteration (``flags``: every rank's guard flags summed); True pauses the run
        there (``paused`` in the result, on every rank). ``state``: the optimiser's
        ``state()`` (:class:`aepar.optim.LBFGSB` or :class:`aepar.optim.LBFGS`) to continue
        from (root).
        """
        self._reset()
        start = self.comm.wtime()
        total_before = self.comm.collectives
        res = self._run_root(theta0, maxiter, on_iteration, state) if self.comm.is_root else self._serve()
        total_s = self.comm.wtime() - start
        return RootResult(
            theta=None if res is None or res is PAUSE else np.asarray(res.x, dtype=np.float64),
            cost=None if res is None or res is PAUSE else float(res.fun),
            iterations=None if res is None or res is PAUSE else int(res.nit),
            evaluations=self.evaluations, collectives=self.collectives,
            collectives_total=self.comm.collectives - total_before,
            compute_s=self.compute_s, comm_s=self.comm_s,
            total_s=total_s,
            message="" if res is None or res is PAUSE else str(res.message),
            success=None if res is None or res is PAUSE else bool(res.success),
            paused=res is PAUSE or bool(getattr(res, "paused", False)), rebalances=self.rebalances,
            step_s=max(total_s - self.blocks_s - self.comm_s, 0.0) if self.comm.is_root else 0.0)

    def _run_root(self, theta0, maxiter, on_iteration, state):
        from aepar import optim

        self.optimizer = opt = getattr(optim, OPTIMIZERS[self.method])(self.evaluate, theta0, maxiter)
        if state is not None:
            opt.load_state(state)

        def callback(iteration, cost, theta):
            return bool(on_iteration(opt, cost, self.flags)) if on_iteration is not None else False

        try:
            res = opt.run(callback)
        except BaseException as exc:  # stop the workers whatever happened, and tell them why
            self._send(FAILED)
            self.comm.bcast(errors.describe(exc))
            if isinstance(exc, errors.UserError) and self.comm.parallel:
                exc.collective = True
            raise
        self._send(PAUSE if res.paused else STOP)
        return res

    def _balance(self):
        """Every rank: the blocks shared anew in proportion to the ranks' speeds since the
        run's start, where that shortens the slowest share by 1 - BALANCE_GAIN or more
        (every rank decides the same from the same gathered times). Over the whole run, not
        the last stretch: ranks that the system moves between cores, or that share one
        with another process in turns, are slow one stretch and fast the next, and shares
        made from single stretches only chase that (measured: slower than equal shares)."""
        t0 = self.comm.wtime()
        blocks = self.model.blocks
        per_block = self.comm.allgather(self.blocks_s / max(self.block_evaluations, 1))
        if min(per_block) > 0:
            now = self.tree.ranges
            new = weighted_ranges(blocks.count, [1.0 / t for t in per_block])

            def slowest(ranges):
                return max((stop - first) * t for (first, stop), t in zip(ranges, per_block))
            if new != now and slowest(new) < BALANCE_GAIN * slowest(now):
                first, stop = new[self.comm.rank]
                self.reattach(replace(blocks, first=first, stop=stop))
                self._share(self.model.blocks, new)
                self.rebalances += 1
        self.comm_s += self.comm.wtime() - t0

    def _send(self, code: float):
        self.buffer[0] = code
        self.comm.Bcast(self.buffer)

    def _serve(self):
        comm, wtime = self.comm, self.comm.wtime
        theta = self.theta
        while True:
            t0 = wtime()
            comm.Bcast(self.buffer)
            self.comm_s += wtime() - t0
            code = float(self.buffer[0])
            if code == STOP:
                return None
            if code == PAUSE:
                return PAUSE
            if code == BALANCE:
                self._balance()
                continue
            if code != EVALUATE:
                raise _rebuild(comm.bcast(None))
            self._local(theta)
            self.evaluations += 1


def _rebuild(described):
    """The workers' copy of the root's error: the same user-facing kind, or RootFailure."""
    return errors.rebuild(described) or RootFailure(f"the root rank failed ({described[0]}: {described[1]}); stopping")
