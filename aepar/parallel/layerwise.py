"""Layer by layer: train a stack's layers one after another, each on the outputs of the
ones below, every step data-parallel over the ranks given (the greedy and data schemes).

Each epoch is one :func:`aepar.parallel.data_parallel.train_epoch`: the rows are this rank's
fixed blocks, the blocks' gradients are added in one fixed tree (the same weights on any
number of ranks) or, ``allreduce``, with one MPI Allreduce of the packed gradient. A
checkpoint taken mid-layer holds every layer, the layer and epoch reached, the batch inside
the epoch and the random streams, so a resumed run ends with the same weights.
"""
from __future__ import annotations

import contextlib

from aepar.checkpoint import layer_state, restore_layers
from aepar import metrics
from aepar.cli import progress
from aepar.parallel.data_parallel import EpochState, reducer, train_epoch
from aepar.trace import span

__all__ = ["train_layer_by_layer", "resume_point"]


def resume_point(be, layers, loaded, prefix="") -> dict | None:
    """Restore ``layers`` (and the momentum of the one being trained) from a checkpoint
    taken during :func:`train_layer_by_layer`; its progress record, None for a new run."""
    if loaded is None:
        return None
    params, opt_state, position = loaded
    restore_layers(be, layers, params, opt_state, int(position["layer"]), prefix=prefix)
    return position


def train_layer_by_layer(be, comm, layers, train, test, *, quiet=False, trace=None, ckpt=None, guard=None,
                         position=None, outer=None, allreduce=False, lr_at=None, what="pre-training") -> dict:
    """Train ``layers`` one after another, each on the previous one's outputs.

    Parameters
    ----------
    layers : list of RBM or AELayer
        With ``layer.epochs`` set (see :func:`aepar.stack.make_layers`).
    train, test : Shard
        This rank's blocks of the training and test rows (test only for reporting).
    ckpt : aepar.resume.Checkpointer, optional
        Safe points: checkpoints, stops.
    position : dict, optional
        The progress record of a checkpoint taken during this training: go on from it.
    outer : callable() -> (params, opt_state, progress), optional
        What the caller adds to every checkpoint (``progress["prefix"]`` goes before the
        layers' names).
    allreduce : bool
        Sum each step's gradients with one MPI Allreduce of the packed buffer (fast, but the
        rounding depends on the ranks) instead of the fixed tree.
    lr_at : callable(layer, epoch) -> float, optional
        The learning rate of an epoch; default the layer's own.
    what : str
        How a failed check names this training ("greedy pre-training").

    Returns
    -------
    dict
        ``time_s``: wall time of the slowest rank (epochs and transforms, evaluation
        excluded); ``eval_s``; ``layers``: per layer the epoch times and the train (as seen
        while training) and test reconstruction errors per epoch.
    """
    position = position or {}
    record = position.get("pretrain") or {"time_s": 0.0, "eval_s": 0.0, "layers": []}
    start = int(position.get("layer", 0))
    stack = _Stack(be, comm, layers, record, quiet=quiet, trace=trace, ckpt=ckpt, guard=guard, outer=outer,
                   allreduce=allreduce, lr_at=lr_at, what=what)
    for i, layer in enumerate(layers):
        if i < start:  # trained before the checkpoint: only its output is needed
            train, test = layer.transform(train), layer.transform(test)
            continue
        state = EpochState.from_dict(position["state"]) if i == start and position.get("state") else None
        stack.train_layer(i, train, test, state)
        t0 = comm.wtime()
        if i + 1 < len(layers):  # the code layer's output feeds nothing
            train, test = layer.transform(train), layer.transform(test)
            be.synchronize()
        dt = comm.allreduce(comm.wtime() - t0, op="max")
        entry = record["layers"][i]
        entry["transform_s"] = dt
        entry["time_s"] = sum(entry["epoch_times_s"]) + dt
        record["time_s"] += dt
    record["eval_s"] = comm.allreduce(record["eval_s"], op="max")
    return record


class _Stack:
    """The epochs of one layer after another, with their record, checks and checkpoints."""

    def __init__(self, be, comm, layers, record, *, quiet, trace, ckpt, guard, outer, allreduce, lr_at, what):
        self.be, self.comm, self.layers, self.record = be, comm, layers, record
        self.quiet, self.trace, self.ckpt, self.guard, self.outer = quiet, trace, ckpt, guard, outer
        self.allreduce, self.lr_at, self.what = allreduce, lr_at, what
        self.run = ckpt.run if ckpt else None
        self.metrics = metrics.of(self.run)
        self.prefix = outer()[2].get("prefix", "") if outer is not None else ""  # the compared greedy stage's
        done = [len(e["epoch_times_s"]) for e in record["layers"]] + [0] * (len(layers) - len(record["layers"]))
        self.eta = metrics.Eta(sum(self._work(i, l.epochs) for i, l in enumerate(layers)),
                               sum(self._work(i, d) for i, d in enumerate(done)))

    def _work(self, i, epochs) -> float:
        """Epochs of layer ``i`` weighted by its size, for the time left (the big layers take longest)."""
        layer = self.layers[i]
        return float(epochs) * layer.n_in * layer.n_out

    def train_layer(self, i, train, test, state):
        """Layer ``i``'s remaining epochs (from ``state``, a checkpoint's place inside an epoch)."""
        layer, record = self.layers[i], self.record
        if i == len(record["layers"]):
            record["layers"].append({"layer": i + 1, "shape": f"{layer.n_in}-{layer.n_out}", "kind": layer.kind,
                                     "hidden": layer.hidden, "lr": layer.lr, "epoch_times_s": [],
                                     "train_error": [], "test_error": []})
        first = len(record["layers"][i]["epoch_times_s"])
        if state is not None or first:
            progress(self.comm, self.quiet, f"layer {i + 1}: resuming at epoch {first + 1}"
                                            + (f", batch {state.batch + 1}" if state else ""))
        if state is not None:  # the paused epoch's steps before the stop are no pace of this process
            self.eta.first += self._work(i, state.share_done(train.blocks.n, layer.batch))
        # this epoch's training seconds, slowest rank: a paused epoch's from its checkpoint
        paused = record.pop("paused_epoch_s", 0.0)
        clock = {"t": paused if state is not None else 0.0}

        def train_one(epoch, resume):
            return self._epoch(i, train, epoch, resume, clock)

        def after_epoch(epoch, result):
            self._after_epoch(i, test, epoch, result, clock)

        def save(epochs_done, epoch_state, why):
            self._save(i, epochs_done, epoch_state, why, clock["t"])

        if self.ckpt is None:
            for epoch in range(first, layer.epochs):
                after_epoch(epoch, train_one(epoch, None))
            return
        armed = self.guard.training(f"pre-training layer {i + 1}") if self.guard else contextlib.nullcontext()
        with armed:
            self.ckpt.epochs(train_one, first, layer.epochs, save=save, after_epoch=after_epoch, resume=state,
                             comm=self.comm)

    def _epoch(self, i, train, epoch, resume, clock):
        comm, layer = self.comm, self.layers[i]
        comm.barrier()
        t0 = comm.wtime()
        with span(self.trace, f"layer{i + 1}", epoch=epoch) as info:
            if self.lr_at is not None:
                layer.optimizer.lr = self.lr_at(layer, epoch)
            result = train_epoch(layer, train, epoch, comm, guard=self.guard, resume=resume,
                                 allreduce=self.allreduce)
            if info is not None:
                info.update(result.phase_args)
        self.be.synchronize()
        clock["t"] += comm.allreduce(comm.wtime() - t0, op="max")
        return result

    def _after_epoch(self, i, test, epoch, result, clock):
        comm, layer, guard = self.comm, self.layers[i], self.guard
        entry = self.record["layers"][i]
        err = result.means[0]
        where = f"{self.what}, layer {i + 1} ({entry['shape']}), epoch {epoch + 1}"
        if guard is not None:
            guard.check(err, "the reconstruction error", where, self.run, comm)
            guard.check_params(layer.params, where, self.run, comm)
        t0 = comm.wtime()
        test_err = layer.recon_error(test, reducer(comm))
        self.record["eval_s"] += comm.wtime() - t0
        if guard is not None:
            guard.check(test_err, "the test reconstruction error", where, self.run, comm)
        dt, clock["t"] = clock["t"], 0.0
        self.record["time_s"] += dt
        entry["epoch_times_s"].append(dt)
        entry["train_error"].append(err)
        entry["test_error"].append(test_err)
        self.metrics.add("pretrain", epoch + 1, stage=f"{self.prefix}{i + 1}", train_error=err, val_error=test_err,
                         lr=self.lr_at(layer, epoch) if self.lr_at is not None else layer.lr)
        done = sum(self._work(j, len(e["epoch_times_s"])) for j, e in enumerate(self.record["layers"]))
        progress(comm, self.quiet, f"layer {i + 1}/{len(self.layers)} ({entry['shape']}, {layer.kind}) "
                                   f"epoch {epoch + 1:3d}/{layer.epochs}  recon error {err:9.4f}  "
                                   f"test {test_err:9.4f}  {dt:7.2f}s", left=self.eta.left(done))

    def _save(self, i, epochs_done, epoch_state, why, paused_s):
        """The checkpoint after ``epochs_done`` epochs of layer ``i``, or inside the next one
        at ``epoch_state``, whose ``paused_s`` seconds so far the resumed epoch goes on from."""
        comm = self.comm
        params, opt, prog = self.outer() if self.outer is not None else ({}, {}, {})
        if comm.is_root:
            lp, lo = layer_state(self.be, self.layers, current=i, prefix=prog.get("prefix", ""))
            params, opt = dict(params, **lp), dict(opt, **lo)
        label = (f"layer {i + 1} epoch {epochs_done + 1} batch {epoch_state.batch}" if epoch_state
                 else f"layer {i + 1}, {epochs_done} epochs done")
        record = dict(self.record, paused_epoch_s=paused_s) if epoch_state else self.record
        self.ckpt.save(params, opt, dict(prog, phase="pretrain", layer=i, pretrain=record,
                                         state=epoch_state.to_dict() if epoch_state else None),
                       label, why, comm=comm)
