"""Ng's sparse autoencoder, data-parallel L-BFGS (Lewis & Canann 2015).

Every rank holds its fixed blocks of the patches and a copy of the weights; the root runs
L-BFGS-B. Each evaluation of J(θ):

1. broadcast θ;
2. the fixed-tree sum of every rank's hidden activations, sent back to every rank (ρ̂: the
   KL sparsity term then folds into the backward pass, aepar.kernels.ref.sparse_ae);
3. one fixed-tree reduction of a packed buffer of partial sums to the root, which assembles
   the cost and the gradient and takes the next L-BFGS step.

The blocks (128 patches) and the tree do not depend on the number of processes, so 1-16
processes take bit-identical steps; nor on which rank holds which block, so every
``--balance-every`` evaluations the ranks share the blocks anew by their measured speeds.
A checkpoint holds θ and the whole L-BFGS memory: a run stopped by a signal goes on from
it, on any number of processes, to the same final θ.
"""
from __future__ import annotations

import contextlib

from aepar import metrics
from aepar.cli import progress
from aepar.errors import Interrupted, UserError

__all__ = ["train", "load_resume", "resumed_at", "describe", "PROGRESS_EVERY"]

SCHEME = "sparse"
PROGRESS_EVERY = 25


def load_resume(args, run, setup):
    """Root: the checkpoint of the run being resumed (θ and the L-BFGS state), checked."""
    from aepar import checkpoint
    from aepar.rundir import same_data

    v, h = args.patch * args.patch, args.hidden
    ck = checkpoint.load(run.checkpoint_path, scheme=SCHEME,
                         shapes={"W1": (v, h), "W2": (h, v), "b1": (h,), "b2": (v,)})
    if ck.opt_state is None or "counts" not in ck.opt_state:
        raise UserError(f"{run.checkpoint_path}: holds no optimiser state to resume from")
    if ("S" in ck.opt_state) != (args.optimizer == "lbfgs"):  # the pairs of L-BFGS, the work arrays of L-BFGS-B
        raise UserError(f"{run.checkpoint_path}: holds the other optimiser's state, not --optimizer "
                        f"{args.optimizer}'s")
    same_data(ck.config.get("data"), setup.fingerprint, run.checkpoint_path)
    return ck


def resumed_at(resume) -> int | None:
    """The iteration a resumed run goes on from (None: a new run)."""
    return int(resume.opt_state["counts"][0]) if resume is not None else None


def describe(args, comm, setup, resume, run) -> str:
    """The line a run starts with: data, network, processes, kernels."""
    v, be = args.patch * args.patch, setup.be
    return (f"{args.samples} patches {args.patch}x{args.patch} ({setup.source}); "
            f"{v}-{args.hidden}-{v}, rho {args.rho:g} lambda {args.lam:g} beta {args.beta:g}; "
            f"{comm.size} process{'es' if comm.size > 1 else ''} "
            f"({setup.blocks.count} blocks of 128; {setup.patches.shape[0]} patches on rank 0); "
            f"{be.kernel_set} kernels, {be.dtype.name}"
            + (f"; resuming at iteration {resumed_at(resume)} from {run.checkpoint_path}"
               if resume is not None else ""))


def train(args, comm, setup, *, resume=None, run=None, guard=None):
    """Train on every rank from θ0 (or ``resume``, :func:`load_resume`'s checkpoint).
    Returns (summary, model, θ) on rank 0 and ({}, model, None) elsewhere; writes only
    checkpoints (into ``run``)."""
    from aepar.models.sparse_ae import SparseAutoencoder
    from aepar.parallel.root_optimizer import RootOptimizer

    be = setup.be
    model = SparseAutoencoder(be, args.patch * args.patch, args.hidden, rho=args.rho, beta=args.beta, lam=args.lam)
    model.attach(setup.patches, setup.blocks)
    patches = setup.all_patches  # every block's, where shares may move
    opt = RootOptimizer(comm, model, xp=be.xp, dtype=be.dtype, synchronize=be.synchronize, guard=guard, run=run,
                        balance_every=args.balance_every, optimizer=args.optimizer,
                        reattach=None if patches is None else lambda blocks: model.attach(patches[blocks.rows], blocks))
    theta0 = model.init_theta(args.seed) if comm.is_root else None
    # warm-up (not timed, not counted): loads the compiled kernels, the optimiser's too, and
    # touches every buffer
    opt.warm_up()
    comm.barrier()
    start = comm.wtime()
    on_iteration = _watcher(args, comm, setup, model, start, run, guard, resumed_at(resume) or 0)
    with (guard.training("L-BFGS iterations") if guard is not None else contextlib.nullcontext()):
        result = opt.run(theta0, args.iterations, on_iteration,
                         state=resume.opt_state if resume is not None else None)
    if result.paused:
        raise _interrupted(comm, run, run.checkpoint_progress if comm.is_root else None)
    rows = metrics.of(run)
    last = result.iterations
    if comm.is_root and result.cost is not None and last % PROGRESS_EVERY and last != args.iterations:
        rows.add("lbfgs", last, train_loss=result.cost)  # converged between rows: its last iteration too
    total_s = comm.allreduce(comm.wtime() - start, op="max")
    comm_s = comm.allreduce(result.comm_s, op="max")
    # every rank's own compute (the slowest is the run's): the spread is what the others
    # wait for at each evaluation
    per_rank = comm.gather(float(result.compute_s))
    shares = comm.gather(model.blocks.stop - model.blocks.first)
    if not comm.is_root:
        return {}, model, None
    times = {"total_s": total_s, "compute_s": max(per_rank), "comm_s": comm_s, "compute_per_rank_s": per_rank,
             "root_step_s": result.step_s, "blocks_per_rank": shares, "rebalances": result.rebalances}
    return _summary(args, comm, setup, opt, result, times, resume), model, result.theta


def _watcher(args, comm, setup, model, start, run, guard, first=0):
    """The root's call after every L-BFGS iteration: progress and a metrics.csv row every
    PROGRESS_EVERY iterations (the root's cost, as L-BFGS-B saw it), checkpoints at the
    guard's safe points; True stops the optimiser (a stop signal, after its checkpoint)."""
    from aepar import checkpoint

    rows, eta = metrics.of(run), metrics.Eta(args.iterations, first)

    config = {"samples": args.samples, "patch": args.patch, "hidden": args.hidden, "rho": args.rho,
              "lam": args.lam, "beta": args.beta, "seed": args.seed, "dtype": setup.be.dtype.name,
              "data": setup.fingerprint}

    def save(o, why):
        run.save_checkpoint(lambda path: checkpoint.save(path, scheme=SCHEME, params=model.params(o.x),
                                                         opt_state=o.state(), epoch=o.iterations, config=config),
                            f"iteration {o.iterations} of {args.iterations}")
        guard.saved()
        progress(comm, args.quiet, f"checkpoint ({why}): iteration {o.iterations} -> {run.checkpoint_path}")

    def on_iteration(o, cost, flags):
        it = o.iterations
        if it % PROGRESS_EVERY == 0 or it == args.iterations:
            rows.add("lbfgs", it, train_loss=cost)
            progress(comm, args.quiet, f"iteration {it:4d}  cost {cost:.6f}  {comm.wtime() - start:7.2f} s",
                     left=eta.left(it))
        if guard is None or run is None or it >= args.iterations:
            return False
        checkpoint_now, stop = guard.decide(flags)
        if checkpoint_now or stop or guard.epoch_due(it):
            save(o, "signal" if stop else "periodic")
        return stop
    return on_iteration


def _summary(args, comm, setup, opt, result, times: dict, resume) -> dict:
    be = setup.be
    return {
        "scheme": SCHEME,
        "final_cost": result.cost, "iterations": result.iterations, "evaluations": opt.optimizer.evaluations,
        "processes": comm.size, "samples": args.samples, "hidden": args.hidden, "patch": args.patch,
        "dtype": be.dtype.name, "kernels": be.kernel_set, "device": be.device,
        **times,
        "collectives_per_evaluation": result.collectives_per_evaluation,
        "collectives_total": result.collectives_total,
        "seed": args.seed, "source": setup.source,
        "rho": args.rho, "lam": args.lam, "beta": args.beta,
        "blocks": setup.blocks.count, "samples_on_root": int(setup.patches.shape[0]),
        "resumed_from_iteration": resumed_at(resume),
        "optimizer": args.optimizer, "exact_resume": opt.optimizer.exact_resume,
        "optimizer_message": result.message,
    }


def _interrupted(comm, run, where):
    """The Interrupted error every rank raises after a checkpoint on a signal."""
    where = comm.bcast(where)
    err = Interrupted(f"checkpoint at {where} saved in {run.path} after a stop signal; continue with "
                      f"--resume {run.path} (on any number of processes)")
    err.collective = True
    return err
