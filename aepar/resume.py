"""Checkpoints of a running scheme and the epoch loop that pauses, saves and continues.

A scheme's checkpoint (``checkpoint.h5`` in its run directory, aepar.checkpoint format)
holds every parameter and optimiser state the run has, and in its config a
``progress`` record (phase, layer, epochs done, a paused epoch's :class:`EpochState`, the
statistics so far) and the fingerprint of its data. Resuming rebuilds the run from it and
goes on exactly where it stopped: the same steps, bit for bit, on any number of ranks.
"""
from __future__ import annotations

import numpy as np

from aepar.errors import CheckpointError, Diverged, Interrupted
from aepar.parallel.data_parallel import EpochState, train_epoch

__all__ = ["Checkpointer", "BackpropRun", "timed", "warm_up", "warm_up_rows"]


class Checkpointer:
    """Saving and loading the checkpoints of one run (collective over ``comm``).

    Parameters
    ----------
    run : aepar.rundir.RunDir
    comm : aepar.comm.Comm
    guard : aepar.guard.Guard
    scheme : str
        Written into the checkpoint; a resumed run insists on it.
    fingerprint : str or None
        Of the run's data (rank 0's is the one saved and compared).
    """

    def __init__(self, run, comm, guard, scheme: str, fingerprint: str | None, progress=print):
        self.run, self.comm, self.guard, self.scheme = run, comm, guard, scheme
        self.fingerprint = comm.bcast(fingerprint)
        self.say = progress
        self.epochs_run = 0

    # ---- loading -----------------------------------------------------------------------------
    def load(self):
        """The checkpoint of the run being resumed on every rank, None for a new run.

        Returns
        -------
        (params, opt_state, progress) : host arrays and the progress record
        """
        if not self.run.resumed:
            return None

        def read():
            if not self.comm.is_root:
                return None
            from aepar import checkpoint
            from aepar.rundir import same_data

            ck = checkpoint.load(self.run.checkpoint_path, scheme=self.scheme)
            progress = ck.config.get("progress")
            if not isinstance(progress, dict):
                raise CheckpointError(f"{self.run.checkpoint_path}: holds no progress record to resume from")
            same_data(ck.config.get("data"), self.fingerprint, self.run.checkpoint_path)
            return ck.params, ck.opt_state or {}, progress
        return self.comm.bcast(self.comm.agree(read))

    # ---- saving ------------------------------------------------------------------------------
    def save(self, params: dict, opt_state: dict, progress: dict, label: str, why: str = "periodic", comm=None):
        """Write the checkpoint (every rank of ``comm`` calls, default the run's; the root's
        arrays are written).

        Raises Diverged instead of saving parameters that are not finite: the checkpoint
        on disk stays the last good one.
        """
        from aepar import checkpoint

        comm = comm or self.comm
        bad = [name for name, value in params.items() if not np.isfinite(np.sum(value))] if comm.is_root else None
        bad = comm.bcast(bad)
        if bad:
            err = Diverged(f"diverged: {label}: parameter {bad[0]} is not finite{_note(self.run)}")
            err.collective = True
            raise err
        self.run.save_checkpoint(lambda path: checkpoint.save(
            path, scheme=self.scheme, params=params, opt_state=opt_state,
            config={"progress": progress, "data": self.fingerprint}), label)
        self.guard.saved()
        self.say(f"checkpoint ({why}): {label} -> {self.run.checkpoint_path}")

    @staticmethod
    def gather(state: EpochState | None, comm) -> EpochState | None:
        """A paused epoch's state with the random streams of every rank's blocks (on the
        root of ``comm``; collective over it)."""
        if state is None:
            return None
        parts = comm.gather(state.rng)
        if comm.is_root:
            merged = {}
            for p in parts:
                merged.update(p)
            return EpochState(state.epoch, state.batch, list(state.sums), merged)
        return state

    def interrupted(self, comm=None) -> Interrupted:
        comm = comm or self.comm
        where = comm.bcast(self.run.checkpoint_progress if comm.is_root else None)
        err = Interrupted(f"checkpoint at {where} saved in {self.run.path} after a stop signal; continue "
                          f"with --resume {self.run.path} (on any number of ranks)")
        err.collective = True
        return err

    # ---- the epoch loop ----------------------------------------------------------------------
    def epochs(self, train_one, first: int, last: int, *, save, after_epoch, resume: EpochState | None = None,
               comm=None):
        """Epochs ``first`` .. ``last - 1`` of one model, each through the safe points.

        Parameters
        ----------
        train_one : callable(epoch, EpochState or None) -> EpochResult
        save : callable(epochs_done, EpochState or None, why)
            Writes the scheme's whole checkpoint: after ``epochs_done`` whole epochs, or
            inside the next one at the (gathered) state.
        after_epoch : callable(epoch, EpochResult)
            Statistics, progress line, divergence checks (raise Diverged).
        resume : EpochState, optional
            The paused epoch ``first`` to continue.
        comm : aepar.comm.Comm, optional
            The ranks training this model (default: the run's).
        """
        comm = comm or self.comm
        for epoch in range(first, last):
            result = train_one(epoch, resume if epoch == first else None)
            while not result.complete:
                save(epoch, self.gather(result.state, comm), "signal" if result.stop else "periodic")
                if result.stop:
                    raise self.interrupted(comm)
                result = train_one(epoch, result.state)
            after_epoch(epoch, result)
            self.epochs_run += 1
            if result.stop or result.checkpoint or self.guard.epoch_due(self.epochs_run):
                save(epoch + 1, None, "signal" if result.stop else "periodic")
                if result.stop:
                    raise self.interrupted(comm)


def _note(run) -> str:
    progress = run.checkpoint_progress
    return (f"; the last good checkpoint ({progress}) stays in {run.checkpoint_path}" if progress
            else "; no checkpoint had been saved")


class BackpropRun:
    """The epochs of one network trained by backprop, data-parallel, through the safe points:
    what fine-tuning (aepar.finetune) and classification (aepar.classify) share.

    Checkpoint names: the parameters under ``params_tag`` + name, the optimiser's state under
    ``opt_tag`` + name; the progress record holds ``fields`` (e.g. the phase), the epochs
    done, a paused epoch's state and the statistics under ``record_key``. ``lr_at(epoch)``, when
    given, sets the optimiser's rate before each epoch (a warm-up or a decay: a function of the
    epoch alone, so a resumed run takes the same rates).
    """

    def __init__(self, be, comm, model, optimizer, train, *, batch, what, params_tag, opt_tag, record_key,
                 fields, ckpt=None, guard=None, outer=None, trace=None, span=None, lr_at=None):
        self.be, self.comm, self.model, self.optimizer, self.train = be, comm, model, optimizer, train
        self.lr_at = lr_at
        self.batch, self.what, self.params_tag, self.opt_tag = batch, what, params_tag, opt_tag
        self.record_key, self.fields = record_key, dict(fields)
        self.ckpt, self.guard, self.outer, self.trace, self.span = ckpt, guard, outer, trace, span
        self.record = {"epochs": [], "time_s": 0.0, "eval_s": 0.0}
        self.first, self.state = 0, None

    def restore(self, resume) -> bool:
        """Go on from a checkpoint saved by this run (``resume``: (params, opt_state,
        progress) or None). Returns whether it did."""
        if resume is None:
            return False
        params, opt_state, prog = resume
        for k, v in self.model.params.items():
            v[...] = self.be.asarray(params[f"{self.params_tag}{k}"])
        tag = self.opt_tag
        self.optimizer.load_state({k[len(tag):]: v for k, v in opt_state.items() if k.startswith(tag)})
        record = dict(prog[self.record_key])
        # fallback: a checkpoint of an older aepar names an epoch's seconds "seconds"
        record["epochs"] = [{("epoch_s" if k == "seconds" else k): v for k, v in e.items()} for e in record["epochs"]]
        self.record = record
        self.first = int(prog["epoch"])
        self.state = EpochState.from_dict(prog["state"]) if prog.get("state") else None
        return True

    @property
    def done_before(self) -> float:
        """Epochs done before this process, a paused epoch's share included (for the time left)."""
        return self.first + (self.state.share_done(self.train.blocks.n, self.batch) if self.state else 0.0)

    @property
    def resuming_at(self) -> str:
        return f"epoch {self.first + 1}" + (f", batch {self.state.batch + 1}" if self.state else "")

    def _train_one(self, epoch, resume_state):
        from aepar.trace import span

        comm = self.comm
        if self.lr_at is not None:
            self.optimizer.lr = self.lr_at(epoch)
        with span(self.trace, self.span, epoch=epoch):
            t0 = comm.wtime()
            result = train_epoch(self.model, self.train, epoch, comm, batch=self.batch, optimizer=self.optimizer,
                                 guard=self.guard, resume=resume_state)
            self.be.synchronize()
            self.record["time_s"] += comm.allreduce(comm.wtime() - t0, op="max")
        return result

    def _save(self, epochs_done, epoch_state, why):
        be, comm = self.be, self.comm
        params, opt_state, prog = self.outer() if self.outer is not None else ({}, {}, {})
        if comm.is_root:
            params = dict(params, **{f"{self.params_tag}{k}": be.to_host(v) for k, v in self.model.params.items()})
            opt_state = dict(opt_state, **{f"{self.opt_tag}{k}": be.to_host(v)
                                           for k, v in self.optimizer.state().items()})
        label = (f"{self.what} epoch {epochs_done + 1} batch {epoch_state.batch}" if epoch_state
                 else f"{self.what}, {epochs_done} epochs done")
        self.ckpt.save(params, opt_state, dict(prog, **self.fields, epoch=epochs_done,
                                               state=epoch_state.to_dict() if epoch_state else None,
                                               **{self.record_key: self.record}), label, why, comm=comm)

    def check_epoch(self, loss, where: str):
        """An epoch's loss and the parameters after it are finite, or the run ends (aepar.guard)."""
        if self.guard is not None:
            run = self.ckpt.run if self.ckpt else None
            self.guard.check(loss, "the loss", where, run, self.comm)
            self.guard.check_params(self.model.params, where, run, self.comm)

    def epoch_seconds(self) -> float:
        """Training seconds of the epoch just finished (the record holds the earlier ones)."""
        return self.record["time_s"] - sum(e["epoch_s"] for e in self.record["epochs"])

    def run(self, epochs: int, after_epoch):
        """Epochs ``first`` .. ``epochs - 1``; ``after_epoch(epoch, EpochResult)`` records
        and reports each."""
        import contextlib

        self.model.optimizer = self.optimizer
        if self.ckpt is not None:
            armed = self.guard.training(self.what) if self.guard is not None else contextlib.nullcontext()
            with armed:
                self.ckpt.epochs(self._train_one, self.first, epochs, save=self._save, after_epoch=after_epoch,
                                 resume=self.state, comm=self.comm)
            return
        for epoch in range(self.first, epochs):  # nowhere to save: a pause only ends where the epoch goes on
            result = self._train_one(epoch, self.state if epoch == self.first else None)
            while not result.complete:
                result = self._train_one(epoch, result.state)
            after_epoch(epoch, result)


def timed(comm, be, fn, *args):
    """(result, seconds of the slowest rank) of ``fn(*args)``."""
    t0 = comm.wtime()
    result = fn(*args)
    be.synchronize()
    return result, comm.allreduce(comm.wtime() - t0, op="max")


def warm_up(be, model, x, evaluate, **train):
    """One epoch of a throw-away ``model`` on the rows ``x`` (``train``: train_epoch's
    options, e.g. its optimiser) and ``evaluate(x)``: the kernels are compiled, or loaded
    from Numba's cache, before the first timed epoch. The kernels a layer takes depend on
    its shapes, so ``model`` is a copy of the run's own network and ``x`` rows of its width
    in the run's blocks (:func:`warm_up_rows`)."""
    train_epoch(model, x, 0, **train)
    evaluate(x)
    be.synchronize()


def warm_up_rows(batch: int, width: int, blocks: int) -> np.ndarray:
    """Random host rows for :func:`warm_up`: one step of ``batch`` rows of ``width``, and at
    least one row in each of the run's ``blocks`` (the blocked kernels run only where a
    block has rows)."""
    return np.random.default_rng(0).random((max(int(batch), int(blocks)), int(width)))
