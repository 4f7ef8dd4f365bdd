"""Model-parallel layer-wise pre-training (CMU 15-618): one layer per rank.

Layer n starts one epoch after layer n-1 and trains every epoch on its input through
frozen copies of the layers below it, refreshed once per epoch: after each epoch *slot*
the ranks swap the weights their layers reached, and every rank recomputes its layer's
input from the data through its copies. With more layers than ranks, groups of G = ranks
consecutive layers train this way one group after another (the next group starts when the
group is done); the layers below a group are final, so their output is computed once per
group. There are no extra epochs: layer n trains its own ``epochs``, so a group takes
G - 1 + max(epochs) slots instead of the sum of its layers' epochs.

Reproducible: an epoch depends only on (seed, layer, epoch, data, blocks) and the copies
of the layers below, which follow from the group size alone, not from timing. A run on P
ranks therefore gives the same weights, bit for bit, as one process run with ``group=P``
(which trains the slot's layers in turn), and ``group=1`` is greedy pre-training.

Safe points are the slot boundaries: there every rank's flags are summed, and a
checkpoint (every layer's weights and momentum, the group and slot reached) is written.
"""
from __future__ import annotations

import contextlib

import numpy as np

from aepar import metrics
from aepar.guard import StepsOnly
from aepar.parallel.data_parallel import train_epoch
from aepar.trace import span

__all__ = ["schedule", "owner", "pretrain_model_parallel"]


def schedule(epochs: list[int], group: int) -> list[list[list[tuple[int, int]]]]:
    """The slots of every group: ``groups[g][t]`` lists the (layer, epoch) pairs that train
    in slot t of group g (layers and epochs count from 0).

    >>> schedule([2, 2, 2], 2)
    [[[(0, 0)], [(0, 1), (1, 0)], [(1, 1)]], [[(2, 0)], [(2, 1)]]]
    """
    group = int(group)
    if group < 1:
        raise ValueError(f"a group holds at least one layer, not {group}")
    out = []
    for first in range(0, len(epochs), group):
        members = range(first, min(first + group, len(epochs)))
        n_slots = max(j - first + int(epochs[j]) for j in members)
        out.append([[(j, t - (j - first)) for j in members if 0 <= t - (j - first) < int(epochs[j])]
                    for t in range(n_slots)])
    return out


def owner(layer: int, group: int, size: int) -> int:
    """The rank that trains ``layer``: its place in its group, modulo the ranks (with fewer
    ranks than the group, one rank trains several of the slot's layers in turn)."""
    return (int(layer) % int(group)) % int(size)


def _flat(be, layer):
    return be.xp.concatenate([layer.params[k].ravel() for k in ("W", "bv", "bh")])


def _unflat(be, layer, flat):
    o = 0
    for k in ("W", "bv", "bh"):
        p = layer.params[k]
        p[...] = flat[o:o + p.size].reshape(p.shape)
        o += p.size


def pretrain_model_parallel(be, comm, layers, train, test, *, group: int, ckpt=None, guard=None,
                            position=None, outer=None, trace=None, say=None) -> dict:
    """Pre-train ``layers`` model-parallel over the ranks of ``comm``.

    Parameters
    ----------
    layers : list of RBM or AELayer
        With ``layer.epochs`` set; the same initial weights on every rank.
    train, test : Shard
        All the training and test rows on every rank, each as one process's shard of the
        fixed blocks (an epoch of one layer runs on one rank).
    group : int
        Layers that train at once (default in the schemes: the number of ranks).
    ckpt : aepar.resume.Checkpointer, optional
    guard : aepar.guard.Guard, optional
    position : dict, optional
        The progress record of a checkpoint taken here: go on from its group and slot.
    outer : callable() -> (params, opt_state, progress), optional
        What a calling scheme adds to every checkpoint.
    say : callable(str), optional
        Progress lines (the caller prints on rank 0 only).

    Returns
    -------
    dict
        ``time_s`` (wall time of the slowest rank), ``slots`` (per slot: group, layers
        trained, seconds), ``layers`` (per layer: epoch times, reconstruction errors as
        seen while training, final test error), ``group``.
    """
    run = _ModelParallel(be, comm, layers, group, position or {}, ckpt, guard, outer, trace, say)
    # the watchdog watches every slot: a rank that stops making steps ends the job
    armed = guard.training("model-parallel pre-training") if guard is not None else contextlib.nullcontext()
    with armed:
        run.all_groups(train, test)
    for entry in run.record["layers"]:
        entry["time_s"] = float(sum(entry["epoch_times_s"]) + sum(entry["refresh_s"]))
    return run.record


def _new_record(layers, group: int) -> dict:
    return {"time_s": 0.0, "group": int(group), "slots": [],
            "layers": [{"layer": i + 1, "shape": f"{l.n_in}-{l.n_out}", "kind": l.kind, "hidden": l.hidden,
                        "lr": l.lr, "epoch_times_s": [], "refresh_s": [], "train_error": [], "test_error": []}
                       for i, l in enumerate(layers)]}


class _FrozenCopies:
    """The input of each layer of a group: the final output of the groups below (``below``)
    through the copies of the group's layers below it, as they are now. ``versions[j]`` is
    the version of layer j's copy (its epochs done); an input is recomputed only when one
    of the copies under it changed."""

    def __init__(self, layers, first: int, below, versions: list):
        self.layers, self.first, self.below, self.versions = layers, first, below, versions
        self.cache = {}  # layer -> (versions of the copies below it, its input)

    def input_of(self, j: int):
        """(layer j's input, whether it was recomputed)."""
        versions = tuple(self.versions[self.first:j])
        hit = self.cache.get(j)
        if hit is not None and hit[0] == versions:
            return hit[1], False
        x = self.below
        for i in range(self.first, j):
            x = self.layers[i].transform(x)
        self.cache[j] = (versions, x)
        return x, True


class _ModelParallel:
    """One model-parallel pre-training: the slots of every group, the versions of the copies
    every rank holds, and the record (see :func:`pretrain_model_parallel`)."""

    def __init__(self, be, comm, layers, group, position, ckpt, guard, outer, trace, say):
        self.be, self.comm, self.layers, self.group = be, comm, layers, group
        self.ckpt, self.guard, self.outer, self.trace, self.say = ckpt, guard, outer, trace, say
        self.n = len(layers)
        self.groups = schedule([l.epochs for l in layers], group)
        self.record = position.get("pretrain") or _new_record(layers, group)
        self.start = int(position.get("group", 0)), int(position.get("slot", 0))
        self.steps = (StepsOnly(guard, "the end of this slot (every rank's current epoch)") if guard is not None
                      else None)
        self.metrics = metrics.of(ckpt.run if ckpt is not None else None)
        self.eta = metrics.Eta(sum(len(slots) for slots in self.groups), len(self.record["slots"]))
        # epochs each layer has done: the version of the copy the ranks hold
        self.versions = [0] * self.n
        for g, slots in enumerate(self.groups):
            for t, slot in enumerate(slots):
                if (g, t) < self.start:
                    for j, e in slot:
                        self.versions[j] = e + 1

    def all_groups(self, train, test):
        """Group after group; a group's layers are final when it ends and feed the next."""
        first = 0
        below = train  # the output of the final layers below the current group
        for g, slots in enumerate(self.groups):
            members = sorted({j for slot in slots for j, _ in slot})
            if g < self.start[0]:
                for j in members:
                    below = self.layers[j].transform(below) if j + 1 < self.n else below
                first += len(members)
                continue
            copies = _FrozenCopies(self.layers, first, below, self.versions)
            for t in range(self.start[1] if g == self.start[0] else 0, len(slots)):
                self.slot(g, t, copies)
            below = self.group_done(members, first, below, test)
            first += len(members)

    def slot(self, g: int, t: int, copies: _FrozenCopies):
        """Slot t of group g: every rank trains its layers' epochs on the copies as they were at
        the end of the slot before, then the layers are handed over to every rank."""
        comm, active = self.comm, self.groups[g][t]
        mine = [(j, e) for j, e in active if owner(j, self.group, comm.size) == comm.rank]
        t0 = comm.wtime()
        # every input first: the copies are those of the previous slot's end
        inputs = {}
        for j, _ in mine:
            r0 = comm.wtime()
            with span(self.trace, "recompute", cat="handover", stage=j + 1):  # the input from the new copies
                inputs[j], fresh = copies.input_of(j)
                self.be.synchronize()
            inputs[j] = (inputs[j], comm.wtime() - r0 if fresh else 0.0)
        stats = [self.train(j, e, *inputs[j]) for j, e in mine]
        self.hand_over(active)
        flags = np.array([self.guard.flags() if self.guard is not None else 0.0])
        comm.Allreduce(flags)
        gathered = [s for part in comm.allgather(stats) for s in part]
        dt = comm.allreduce(comm.wtime() - t0, op="max")
        _raise_if_diverged(gathered)
        self.note(g, t, active, gathered, dt)
        self.checkpoint_if_due(g, t, flags)

    def train(self, j: int, e: int, x, refresh: float) -> tuple:
        """Layer j's epoch e on this rank: (j, e, error, seconds, refresh seconds, divergence or None)."""
        layer, guard = self.layers[j], self.guard
        e0 = self.comm.wtime()
        with span(self.trace, f"layer{j + 1}", epoch=e) as info:
            result = train_epoch(layer, x, e, comm=None, batch=layer.batch, key=layer.key, guard=self.steps)
            if info is not None:
                info.update(result.phase_args)
        self.be.synchronize()
        err = result.means[0]
        bad = None
        if guard is not None:
            from aepar.errors import Diverged

            where = f"model-parallel pre-training, layer {j + 1}, epoch {e + 1}"
            try:
                guard.check(err, "the reconstruction error", where)
                guard.check_params(layer.params, where)
            except Diverged as exc:
                bad = str(exc)
        return j, e, err, self.comm.wtime() - e0, refresh, bad

    def hand_over(self, active):
        """Every layer trained in the slot goes from its rank to all: the new copies. The
        ranks meet first, so that the trace tells waiting for the slowest rank ("wait") from
        the messages ("handover")."""
        if self.comm.size > 1:
            with span(self.trace, "wait", cat="wait", what="slot end"):
                self.comm.barrier()
        with span(self.trace, "handover", cat="handover", layers=[j + 1 for j, _ in active]):
            for j, _ in active:
                buf = _flat(self.be, self.layers[j])
                self.comm.Bcast(buf, root=owner(j, self.group, self.comm.size))
                _unflat(self.be, self.layers[j], buf)
                self.versions[j] = dict(active)[j] + 1

    def note(self, g: int, t: int, active, gathered, dt: float):
        """The slot's epochs into the record (and a progress line)."""
        record = self.record
        for j, e, err, sec, refresh, _ in sorted(gathered):
            entry = record["layers"][j]
            entry["epoch_times_s"].append(sec)
            entry["refresh_s"].append(refresh)
            entry["train_error"].append(err)
            self.metrics.add("pretrain", e + 1, stage=j + 1, train_error=err, lr=self.layers[j].lr)
        record["slots"].append({"group": g + 1, "slot": t + 1, "layers": [j + 1 for j, _ in active], "time_s": dt})
        record["time_s"] += dt
        if self.say is not None:
            self.say(f"model-parallel group {g + 1}/{len(self.groups)} slot {t + 1}/{len(self.groups[g])}: "
                     + ", ".join(f"L{j + 1} epoch {e + 1}/{self.layers[j].epochs} recon {err:.4f}"
                                 for j, e, err, *_ in sorted(gathered)) + f"  {dt:6.2f}s",
                     left=self.eta.left(len(record["slots"])))

    def checkpoint_if_due(self, g: int, t: int, flags):
        """The slot boundary is a safe point: a checkpoint on request or when one is due."""
        ckpt, guard = self.ckpt, self.guard
        if ckpt is None:
            return
        checkpoint, stop = guard.decide(float(flags[0])) if guard is not None else (False, False)
        ckpt.epochs_run += 1
        if checkpoint or stop or (guard is not None and guard.epoch_due(ckpt.epochs_run)):
            _save(self.be, self.comm, self.layers, self.group, self.record, g, t + 1, ckpt, self.outer,
                  "signal" if stop else "periodic")
            if stop:
                raise ckpt.interrupted(self.comm)

    def group_done(self, members, first: int, below, test):
        """The group is final: its test errors, then its output (returned) feeds the next group."""
        layers, n = self.layers, self.n
        x_test = test
        for i in range(first):
            x_test = layers[i].transform(x_test)
        for j in members:
            self.record["layers"][j]["test_error"].append(layers[j].recon_error(x_test))
            x_test = layers[j].transform(x_test) if j + 1 < n else x_test
            below = layers[j].transform(below) if j + 1 < n else below
        return below


def _raise_if_diverged(gathered):
    """A layer that diverged on any rank ends the run on every rank alike."""
    bad = next((s[5] for s in gathered if s[5]), None)
    if bad is not None:
        from aepar.errors import Diverged

        err = Diverged(bad)
        err.collective = True
        raise err


def _save(be, comm, layers, group, record, g, next_slot, ckpt, outer, why):
    """Every layer's weights (the same on every rank after the hand-over) and each layer's
    momentum from the rank that trains it."""
    from aepar.checkpoint import layer_state

    params, opt, prog = outer() if outer is not None else ({}, {}, {})
    prefix = prog.get("prefix", "")
    velocities = {j: {k: be.to_host(v) for k, v in layers[j].optimizer.state().items()}
                  for j in range(len(layers)) if owner(j, group, comm.size) == comm.rank}
    parts = comm.gather(velocities)
    if comm.is_root:
        lp, _ = layer_state(be, layers, prefix=prefix)
        params = dict(params, **lp)
        opt = dict(opt)
        for part in parts:
            for j, state in part.items():
                opt.update({f"{prefix}layer{j + 1}/{k}": v for k, v in state.items()})
    label = f"model-parallel group {g + 1}, {next_slot} slot(s) done"
    ckpt.save(params, opt, dict(prog, phase="pretrain", scheme="model", group=g, slot=next_slot,
                                pretrain=record), label, why, comm=comm)


def restore_velocities(be, layers, opt_state: dict, prefix=""):
    """Every layer's momentum from a model-parallel checkpoint (each rank keeps them all;
    only a layer's owner uses its own)."""
    for j, layer in enumerate(layers):
        tag = f"{prefix}layer{j + 1}/"
        state = {k[len(tag):]: v for k, v in opt_state.items() if k.startswith(tag)}
        if state:
            layer.optimizer.load_state(state)
