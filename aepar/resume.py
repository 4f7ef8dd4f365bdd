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
from aepar.parallel.data_parallel import EpochState

__all__ = ["Checkpointer"]


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
        self.fingerprint = comm.bcast_obj(fingerprint)
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
        return self.comm.bcast_obj(self.comm.agree(read))

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
        bad = comm.bcast_obj(bad)
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
        parts = comm.gather_obj(state.rng)
        if comm.is_root:
            merged = {}
            for p in parts:
                merged.update(p)
            return EpochState(state.epoch, state.batch, list(state.sums), merged)
        return state

    def interrupted(self, comm=None) -> Interrupted:
        comm = comm or self.comm
        where = comm.bcast_obj(self.run.checkpoint_progress if comm.is_root else None)
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
