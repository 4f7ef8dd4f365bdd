"""Data parallelism whose results do not depend on the number of ranks or threads.

The rows of a data set are cut into ``count`` fixed blocks (aepar.rows); a rank holds a
contiguous run of whole blocks (a :class:`aepar.rows.Shard`). One epoch of minibatch
training (:func:`train_epoch`):

- every block draws its own permutation from ``default_rng(key + (epoch, block))`` and
  deals its rows out over the epoch's ceil(n / batch) batches (the block sizes and so the
  batch sizes follow from n alone);
- a step: each block's rows of the batch give that block's gradient, scaled by 1/(global
  batch size), computed by whichever thread of whichever rank holds the block; the
  blocks' gradients are added in the fixed tree (aepar.parallel.blocks.TreeSum) and
  applied on every rank alike.

So one process and any number of ranks up to ``count`` take bit-identical steps, and an
epoch can stop after any step (a safe point: aepar.guard) and go on later - on another
number of ranks - from its :class:`EpochState` as if it had not stopped.

``allreduce=True`` trades that for speed (the 15-618 "data" scheme): each rank adds its
own blocks' gradients in block order and one MPI Allreduce sums the ranks' totals, so
the steps are the same on any number of threads but round differently on different
numbers of ranks.

A model trained this way provides ``be`` (its backend), ``batch`` (the default global
minibatch), ``key`` (its random-stream key), ``grad_shapes()`` (name -> shape of each
gradient), ``n_extra`` (sums a step reports, e.g. its loss), ``leaf_gradient(x, rng,
scale, grads)`` (adds one block's scaled gradient into ``grads``, returns its ``n_extra``
sums; ``rng`` is the block's own stream for any noise) and ``apply(grads, epoch)`` (the
optimiser's step). It may provide ``fused_step(x, rng, epoch)`` too: gradient and step in
one kernel, taken when the data is one block on one process, where there is nothing to
add up; and ``epochs_done``, which a completed epoch advances. A model may provide
``block_factors(xs, rngs, scale, grads) -> ([sums], [{name: (A, D, alpha)}])``, taken
where there are several blocks: all of a rank's blocks of a step at once (lists with one
entry per block, ``grads`` its dicts to fill), every block's result the bits it would
have alone, the model free to take them layer by layer (a layer's weights read once for
all the blocks, one kernel call per layer). The weight gradients it names in
``factored``, products ``alpha * A.T @ D`` of a block's rows, it leaves out of ``grads``
and returns as factors (the CAE names none). Each tree node's sum of the factored
gradients is then one ``block_outer_sum`` call from its blocks' factors, the same bits as
the blocks' own products added in the tree, without writing them out. Where the blocks'
factors lie one after another in arrays the model made (``aepar.rows.BlockFactor``), a
node's rows are views of those arrays; the step's rows come to the model that way too
(``xs`` an ``aepar.rows.BlockRows`` of one gathered array). A layer model may provide
``group_factors(x, starts, rngs, grads, scale) -> ([sums], {name: (A, D, row starts,
alpha)})`` as well: the same for consecutive blocks stacked in ``x`` (block b: rows
``starts[b]:starts[b + 1]``), its factors whole arrays (block b's rows of A and D from
``row starts[b]``). One process on one thread (a GPU's host: always one) holding every
block then takes each batch whose blocks all have rows in one call of it, and the sums
and the step straight from what it returns: the same kernels in the same order as the
blocks' own path, so the same bits, without that path's views and wrappers per block and
thread, which a GPU's host pays on every step. Where the model also provides
``fused_blocks_step(x, starts, rngs, merges, scale, epoch) -> sums`` (the blocks'
gradients and sums added in the tree ``merges`` and the plain SGD step in one kernel
call, with those bits) and its optimiser takes plain steps, such a batch is that one call.

Models never see ranks: where one needs a sum over all ranks' rows (an evaluation) it is
handed ``reducer(comm)``.

Each epoch also reports where this rank's time went (:attr:`EpochResult.phases`, seconds):
``gradient`` (every own block's forward and backward pass, but for the factored weight
gradients; the layer kernels take forward and backward in one call), ``block sums`` (this
rank's blocks added in the tree: the factored weight gradients are computed here, inside
the sum), ``reduction`` (the sum over the ranks and the guard's flags with it: waiting for
slower ranks shows here), ``update`` (the optimiser's step), or ``fused step`` (all of it
in one kernel call: one block on one process, or every block of a batch on one process and
thread; an epoch reports the phases its steps went through). Five clock reads a step,
nothing next to its kernels, so the phases are always on. On a GPU the kernels run after
the host queued them, so the phases would time the queueing: none are reported there.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from time import perf_counter

import numpy as np

from aepar.optim import FactoredGradient, written
from aepar.parallel.blocks import TreeSum
from aepar.rows import (BlockRows, Blocks, Shard, block_bounds, factor_rows, one_thread,
                        parallel_map, threads, tree_merges, weight_bands)

__all__ = ["Minibatches", "EpochState", "EpochResult", "train_epoch", "blockwise_sums", "reducer"]


def blockwise_sums(shard: Shard, fn, comm) -> np.ndarray:
    """Σ over all rows of all ranks of ``fn(rows) -> float64 vector``, taken per block in
    chunks and added in the fixed tree: the same on any number of ranks (on one process,
    :func:`aepar.rows.local_sums`)."""
    parts = shard.block_sums(fn)
    width = next((p.size for p in parts if p is not None), 0)
    width = comm.allreduce(width, op="max") if comm is not None and comm.size > 1 else width
    parts = [np.zeros(width) if p is None else p for p in parts]
    return TreeSum(_serial_if_none(comm), shard.blocks.count).allreduce(parts, np.zeros(width))


def reducer(comm):
    """The sum over the ranks of ``comm`` that a model takes where it needs one (e.g.
    ``RBM.recon_error(shard, reduce=reducer(comm))``): ``reduce(shard, fn) -> vector``."""
    return lambda shard, fn: blockwise_sums(shard, fn, comm)


def batches_per_epoch(rows: int, batch: int) -> int:
    """Steps of one epoch over ``rows`` rows at a global ``batch``."""
    return max(1, -(-int(rows) // int(batch)))


class Minibatches:
    """The batches of one epoch over a shard's blocks (see the module docstring).

    Parameters
    ----------
    blocks : Blocks
    batch : int
        Nominal global batch size; an epoch has ceil(n / batch) batches.
    key : tuple of int
        Random-stream key (e.g. (seed, layer)); block b of epoch e uses key + (e, b).
    epoch : int
    """

    def __init__(self, blocks: Blocks, batch: int, key: tuple, epoch: int):
        self.blocks = blocks
        self.n_batches = batches_per_epoch(blocks.n, batch)
        bounds = blocks.bounds
        sizes = np.diff(bounds)
        # rows of every block (all ranks') in every batch: the batch sizes
        self._cuts = {b: block_bounds(int(sizes[b]), self.n_batches) for b in range(blocks.count)}
        self.sizes = np.sum([np.diff(c) for c in self._cuts.values()], axis=0)
        self.rngs = {b: np.random.default_rng(tuple(int(k) for k in key) + (int(epoch), b)) for b in blocks.mine}
        self.perms = {b: self.rngs[b].permutation(int(sizes[b])) for b in blocks.mine}
        self._first_row = {b: int(bounds[b] - bounds[blocks.first]) for b in blocks.mine}

    def rows(self, b: int, k: int | None = None) -> np.ndarray:
        """Local row indices (within the shard) of block ``b``'s part of batch ``k``; all
        its batches' rows in order if ``k`` is None (batch k's are ``cuts(b)[k]:cuts(b)[k + 1]``)."""
        if k is None:
            return self._first_row[b] + self.perms[b]
        c = self._cuts[b]
        return self._first_row[b] + self.perms[b][c[k]:c[k + 1]]

    def cuts(self, b: int) -> np.ndarray:
        """Where block ``b``'s batches start and end in its :meth:`rows`."""
        return self._cuts[b]

    def states(self) -> dict:
        """The blocks' random streams now (JSON-able), keyed by block."""
        return {str(b): r.bit_generator.state for b, r in self.rngs.items()}

    def restore(self, states: dict):
        for b, r in self.rngs.items():
            r.bit_generator.state = states[str(b)]


@dataclass
class EpochState:
    """Where an epoch stopped: the next batch, the sums so far, every block's random stream
    (gathered from all ranks by the caller before it is saved)."""

    epoch: int
    batch: int
    sums: list
    rng: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"epoch": self.epoch, "batch": self.batch, "sums": list(map(float, self.sums)), "rng": self.rng}

    def share_done(self, rows: int, batch: int) -> float:
        """The share of its epoch done before the pause (``rows`` in ``batch``-row steps),
        which the time left counts as done."""
        return self.batch / batches_per_epoch(rows, batch)

    @classmethod
    def from_dict(cls, d: dict) -> "EpochState":
        return cls(int(d["epoch"]), int(d["batch"]), [float(v) for v in d["sums"]], dict(d.get("rng", {})))


@dataclass
class EpochResult:
    """The epoch's sums (per row: divide by ``n``) and, if it paused at a safe point, where."""

    sums: np.ndarray
    n: int
    state: EpochState | None = None
    checkpoint: bool = False
    stop: bool = False
    phases: dict = field(default_factory=dict)  # seconds per phase (see the module docstring)

    @property
    def complete(self) -> bool:
        return self.state is None

    @property
    def means(self) -> list:
        return [float(s) / self.n for s in self.sums]

    @property
    def phase_args(self) -> dict:
        """:attr:`phases` as an epoch span's arguments in the trace: ``gradient_s``, ...
        (aepar.report.profile reads them back)."""
        return {f"{name.replace(' ', '_')}_s": seconds for name, seconds in self.phases.items()}


class _Buffers:
    """One flat gradient vector per own block (+ the step's sums and the guard's flag), and
    the fixed tree that adds them; made once per model and layout.

    A model's ``factored`` gradients (see :func:`train_epoch`) have no place filled in a
    block's vector: ``block_outer_sum`` writes each tree node's sum of them straight into
    the vector that holds the node; ``filled`` is the slice after them, which the blocks
    fill and ``rows_tree_sum`` adds: the other gradients, the step's sums and the guard's flag.
    """

    def __init__(self, model, shard: Shard, comm, be, allreduce: bool):
        shapes = model.grad_shapes()
        # one block (one process) has nothing to add: BLAS's product into its vector is faster
        self.batched = getattr(model, "block_factors", None) is not None and shard.blocks.count > 1
        self.factored = [k for k in getattr(model, "factored", ()) if k in shapes] if self.batched else []
        # the factored gradients first: the rest of the row (what the blocks fill, clear and
        # add) is then one slice, one operation each (one launch on a GPU, not one per array)
        self.names = self.factored + [k for k in shapes if k not in self.factored]
        self.sizes = [int(np.prod(shapes[k])) for k in self.names]
        self.shapes = [tuple(shapes[k]) for k in self.names]
        # every gradient and every row on a cache line's boundary, as the kernels want their
        # arrays; the gaps stay zero
        line = be.line
        self.offsets = [0]
        for size in self.sizes:
            self.offsets.append(_round_up(self.offsets[-1] + size, line))
        filled_from = self.offsets[len(self.factored)]  # the first gradient after the factored ones
        self.n_grad = self.offsets.pop()  # the step's sums start here
        self.n_extra = int(model.n_extra)
        width = _round_up(self.n_grad + self.n_extra + 1, line)
        self.filled = slice(filled_from, width)
        n_mine = shard.blocks.stop - shard.blocks.first
        self.leaves = be.zeros((max(n_mine, 1), width))
        self.total = be.zeros(width)
        # every row as one object, with its gradients' views, made once: making a view costs
        # host microseconds per array and step (a GPU's steps wait on the host)
        self.rows = [self.leaves[i] for i in range(self.leaves.shape[0])]
        self.filled_rows = [row[self.filled] for row in self.rows]  # each block's filled slice
        self._held = {id(a): (a, self._make_views(a)) for a in self.rows + [self.total]}
        self.tree = None if allreduce else TreeSum(_serial_if_none(comm), shard.blocks.count)
        # the sums this rank takes alone: (tree node or None, its first own block, its
        # postfix tree); with allreduce, its blocks in order
        count, first = shard.blocks.count, shard.blocks.first
        self.groups = [(None, 0, [0] + [1] * (max(n_mine, 1) - 1))] if allreduce else \
            [(node, node[1] - first, tree_merges(*node, count)) for node in self.tree.nodes]
        self.key = _buffers_key(shard, comm, allreduce)

    def views(self, flat) -> dict:
        """{name: gradient} as views of the vector ``flat`` (one of :attr:`rows` or
        :attr:`total`: their views made once; a new dict each call, the arrays shared)."""
        held = self._held.get(id(flat))
        return dict(held[1]) if held is not None and held[0] is flat else self._make_views(flat)

    def _make_views(self, flat) -> dict:
        return {name: flat[o:o + size].reshape(shape)
                for name, o, size, shape in zip(self.names, self.offsets, self.sizes, self.shapes)}


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def _buffers_key(shard: Shard, comm, allreduce: bool):
    return shard.blocks, None if comm is None else (comm.rank, comm.size), bool(allreduce)


def _serial_if_none(comm):
    if comm is not None:
        return comm
    from aepar.comm import Comm

    return Comm.serial()


def train_epoch(model, shard: Shard, epoch: int, comm=None, *, batch: int | None = None, key: tuple | None = None,
                guard=None, resume: EpochState | None = None, optimizer=None, allreduce: bool = False) -> EpochResult:
    """One epoch of data-parallel minibatch training of ``model`` on ``shard`` (every rank of
    ``comm`` calls it with its own shard of the same blocks).

    Parameters
    ----------
    model : see the module docstring
    shard : Shard
    epoch : int
        0-based; picks the random streams (and the model's schedule, in ``apply``).
    comm : aepar.comm.Comm or None
        The ranks sharing the blocks (None: one process).
    batch : int, optional
        Global minibatch; default ``model.batch``.
    key : tuple of int, optional
        The random-stream key; default ``model.key``.
    guard : aepar.guard.Guard, optional
        Per step: heartbeat, faults, and every rank's flags summed with the gradients; a
        checkpoint or stop request pauses the epoch after that step.
    resume : EpochState, optional
        Continue an epoch that paused (this rank's blocks' streams must be in it).
    optimizer : optional
        Set as ``model.optimizer`` before the epoch (the stacked autoencoder's SGD or Adam).
    allreduce : bool
        False (default): the blocks' gradients are added in the fixed tree, the same bits on
        any number of ranks. True: each rank adds its own blocks' rows of the packed buffer
        (gradients, the step's sums, the guard's flag) in block order, and one Allreduce of
        that row per step sums the ranks: faster, but the rounding depends on the number of
        ranks.

    Returns
    -------
    EpochResult
        Paused (``state`` set) after a step whose flags asked for a checkpoint or a stop;
        complete otherwise, with the flags of its last step in ``checkpoint``/``stop``.
        A complete epoch sets ``model.epochs_done`` to at least ``epoch + 1`` when the
        model keeps that count.
    """
    be = model.be
    batch = model.batch if batch is None else batch
    key = model.key if key is None else key
    if optimizer is not None:
        model.optimizer = optimizer
    buf = getattr(model, "_dp_buffers", None)
    if buf is None or buf.key != _buffers_key(shard, comm, allreduce):
        buf = model._dp_buffers = _Buffers(model, shard, comm, be, allreduce)
    result = _run_epoch(model, shard, epoch, comm, be, buf, batch, key, guard, resume)
    if result.complete and hasattr(model, "epochs_done"):
        model.epochs_done = max(model.epochs_done, int(epoch) + 1)
    return result


def _local_sum(be, buf, factors, first, merges, out, defer=False):
    """This rank's blocks ``first``.. added in the postfix tree ``merges`` into the row
    ``out``: the slice the blocks filled by ``rows_tree_sum`` in the leftmost block's row, the
    factored gradients by ``block_outer_sum`` from the blocks' factors (an empty block's
    are none: a zero product). Returns ``out``, and with ``defer`` the factored gradients
    left unwritten, as {name: aepar.optim.FactoredGradient} for the step."""
    # the blocks' filled slices in the tree, the sum in the leftmost block's
    be.K.rows_tree_sum(buf.leaves[first:first + len(merges), buf.filled], merges)
    if buf.rows[first] is not out:
        out[buf.filled] = buf.filled_rows[first]
    grads, factored = buf.views(out), {}
    # the threads take whole weights, or a band of each weight's rows each (an element's
    # sums are the same in any band)
    bands = dict(zip(buf.factored, weight_bands([grads[name].shape for name in buf.factored])))
    for name in buf.factored:
        m, n = grads[name].shape
        parts = [f[name] if f is not None else None for f in factors[first:first + len(merges)]]
        # a factor's rows (of each of its parts: kernels' block_outer_sum), a thread's where they lie
        a, d, starts = factor_rows(be.xp, parts, (m, n), be.dtype)
        alphas = [p[2] if p else 1.0 for p in parts]
        bounds = bands[name]
        factored[name] = FactoredGradient(be.K, [(_columns(a, lo, hi), d, starts, alphas, lo, hi)
                                                 for lo, hi in zip(bounds[:-1], bounds[1:])], merges, grads[name])
    if defer:
        return out, factored
    written(factored)  # every weight's bands in one hand-off
    return out, {}


def _columns(a, lo: int, hi: int):
    """Columns lo:hi of a factor (of each of its parts), as views."""
    return tuple(part[:, lo:hi] for part in a) if isinstance(a, tuple) else a[:, lo:hi]


def _write_sums(xp, buf, live, extras):
    """Each live block's step sums (``extras``: a tuple per block, floats or 0-d device
    arrays) into its row after the gradients: where they are all device arrays and the
    blocks' rows are consecutive, each sum's values stacked straight into its column of
    the rows (on a GPU one launch a sum, where each value was its own)."""
    values = [v for extra in extras for v in extra]
    if values and all(isinstance(v, xp.ndarray) for v in values) and live == list(range(live[0], live[-1] + 1)):
        width = len(values) // len(live)
        rows = buf.leaves[live[0]:live[-1] + 1]
        for j in range(width):
            xp.stack(values[j::width], out=rows[:, buf.n_grad + j])
        return
    for i, extra in zip(live, extras):
        for j, value in enumerate(extra):
            buf.rows[i][buf.n_grad + j] = value


def _run_epoch(model, shard, epoch, comm, be, buf, batch, key, guard, resume) -> EpochResult:
    with one_thread() if _small_steps(model, shard, batch) else contextlib.nullcontext():
        return _epoch_steps(model, shard, epoch, comm, be, buf, batch, key, guard, resume)


# a rank's step of fewer FLOPs than this runs on one thread: a second thread costs a step
# about as much as half of one this size (the hand-offs, and each group's Python run in
# turns under the interpreter lock), so sharing it saves nothing (docs/performance-notes.md)
SHARED_STEP_FLOPS = 100e6


def _small_steps(model, shard, batch) -> bool:
    """Whether this rank's steps are too small to share between its threads
    (:data:`SHARED_STEP_FLOPS`)."""
    flops = getattr(model, "flops_per_sample", None)
    if threads() == 1 or flops is None:
        return False
    mine = batch * len(shard.blocks.mine) / max(shard.blocks.count, 1)  # this rank's rows of a batch
    return flops() * mine < SHARED_STEP_FLOPS


def _epoch_steps(model, shard, epoch, comm, be, buf, batch, key, guard, resume) -> EpochResult:
    run = _Epoch(model, shard, epoch, comm, be, buf, batch, key, guard, resume)
    mb = run.mb
    checkpoint = stop = False
    step = run.fused_step if run.fused is not None else run.step
    for k in range(run.start, mb.n_batches):
        if not mb.sizes[k]:  # no block has rows left for it (a batch smaller than the blocks): no step
            continue
        checkpoint, stop = step(k, 1.0 / float(mb.sizes[k]))
        if (checkpoint or stop) and k + 1 < mb.n_batches:
            host = be.to_host(run.sums)
            return EpochResult(host, shard.n, EpochState(epoch, k + 1, list(host), mb.states()), checkpoint, stop,
                               run.phases())
    # a request in the last step is the caller's to serve, at the end of the epoch
    return EpochResult(be.to_host(run.sums), shard.n, None, checkpoint, stop, run.phases())


class _Epoch:
    """What the steps of one epoch share: its batches, this rank's blocks' row orders on the
    device, the running sums; :meth:`step` (or :meth:`fused_step`) takes batch k and returns
    the (checkpoint, stop) its flags ask for."""

    def __init__(self, model, shard, epoch, comm, be, buf, batch, key, guard, resume):
        self.model, self.shard, self.epoch, self.comm, self.be, self.buf, self.guard = \
            model, shard, epoch, comm, be, buf, guard
        self.mb = mb = Minibatches(shard.blocks, batch, key, epoch)
        # the steps' sums stay where the kernels run: on a GPU, reading them each step would
        # make the host wait for every step's kernels before it queues the next step's
        self.start, self.sums = 0, be.xp.zeros(buf.n_extra, dtype=np.float64)
        if resume is not None:
            if resume.epoch != epoch:
                raise ValueError(f"resuming epoch {resume.epoch} as epoch {epoch}")
            mb.restore(resume.rng)
            self.start, self.sums = resume.batch, be.xp.asarray(np.array(resume.sums, dtype=np.float64))
        # each running sum's own view, which a fused step adds its value into in place (an
        # assignment into a slice would cost a GPU a launch more)
        self.sum_views = [self.sums[j:j + 1] for j in range(buf.n_extra)]
        self.mine = list(shard.blocks.mine)
        self.flag = buf.n_grad + buf.n_extra
        # one process holds the whole tree
        self.alone = buf.tree is not None and buf.tree.comm.size == 1 and len(buf.groups) == 1
        # the fused kernels take the plain SGD step: a layer-wise adaptive rate (LARS) needs the gradient
        plain = not getattr(getattr(model, "optimizer", None), "trust", 0.0)
        self.fused = getattr(model, "fused_step", None) \
            if shard.blocks.count == 1 and (comm is None or comm.size == 1) and plain else None
        # the epoch's row order goes to the device once: a copy of a step's indices costs a GPU
        # tens of microseconds of host time; each batch's rows are gathered from it
        if buf.batched and self.mine:  # all own blocks at once: batch k's rows block after block
            sizes = np.stack([np.diff(mb.cuts(b)) for b in self.mine], axis=1)  # batch x block
            # every own row tagged with its batch, block after block; a stable sort by the
            # batch then puts each batch's rows block after block, each block's in its order
            batch_of = np.concatenate([np.repeat(np.arange(mb.n_batches), sizes[:, i]) for i in range(len(self.mine))])
            order = np.concatenate([mb.rows(b) for b in self.mine])[np.argsort(batch_of, kind="stable")]
            self.batch_order = be.xp.asarray(order)
            self.batch_starts = np.concatenate([[0], np.cumsum(sizes.sum(axis=1))])
            self.block_ends = np.hstack([np.zeros((mb.n_batches, 1), np.int64), np.cumsum(sizes, axis=1)])
            self.live = sizes > 0  # the blocks with rows in each batch (an empty block's row stays 0)
            self.orders = {}
        else:
            self.orders = {b: be.xp.asarray(mb.rows(b)) for b in self.mine}
        # one process and one thread holding every block (on a GPU, always one thread): a
        # batch's blocks in one call of the model's group_factors, summed and stepped straight
        # from it, without the per-block views that the threads and ranks need (the same
        # kernels in the same order: the same bits)
        self.whole = buf.batched and bool(self.mine) and self.alone and threads() == 1 \
            and getattr(model, "group_factors", None) is not None
        if self.whole:  # the blocks' streams (restored in place), gradient views and full batches, once an epoch
            self.full = self.live.all(axis=1).tolist()
            self.block_rngs = [mb.rngs[b] for b in self.mine]
            self.block_grads = [buf.views(row) for row in buf.rows[:len(self.mine)]]
        # such a batch's gradients, their tree and a plain SGD step in one kernel call, where
        # the model has one: the bits of the three, without the Python between them
        self.fused_blocks = getattr(model, "fused_blocks_step", None) if self.whole and plain else None
        self.seconds = dict.fromkeys(("fused step",) if self.fused is not None else
                                     ("gradient", "block sums", "reduction", "update", "fused step"), 0.0)

    def phases(self) -> dict:
        """Seconds per phase so far, of the phases this epoch's steps went through (none on
        a GPU: see the module docstring)."""
        return {} if self.be.device == "gpu" else {k: v for k, v in self.seconds.items() if v}

    def rows(self, b: int, k: int):
        lo, hi = self.mb.cuts(b)[k:k + 2]
        return self.be.xp.take(self.shard.x, self.orders[b][lo:hi], axis=0)

    def fused_step(self, k: int, scale: float) -> tuple[bool, bool]:
        """One block, one process: no sum to take, one fused kernel."""
        guard = self.guard
        t0 = perf_counter()
        x = self.rows(self.mine[0], k)
        if guard is not None:  # flags read before the step, as the blocked path's reduction does
            flags = guard.flags()
            guard.step(poison=x)
        for total, value in zip(self.sum_views, self.fused(x, self.mb.rngs[0], self.epoch)):
            total += value
        self.seconds["fused step"] += perf_counter() - t0
        return guard.decide(flags) if guard is not None else (False, False)

    def step(self, k: int, scale: float) -> tuple[bool, bool]:
        """Every own block's gradient, this rank's sums, the sum over all ranks, the step."""
        buf, guard, comm, flag, alone = self.buf, self.guard, self.comm, self.flag, self.alone
        t0 = perf_counter()
        # One process holding the whole tree leaves the weights' sums to the step, which
        # takes them as they come (not where faults are planted: they poison the gradient as
        # written)
        defer = alone and (guard is None or not guard.faults)
        if self.whole and defer and self.full[k]:
            if self.fused_blocks is not None:
                return self.fused_blocks_step(k, scale)
            values, deferred, t1 = self.whole_batch(k, scale)
        else:
            factors = self.leaf_gradients(k, scale)
            t1 = perf_counter()
            # this rank's sums: its tree nodes, or (allreduce) its blocks in order; a rank
            # without blocks still sends a row: zeros and its guard flag
            values, deferred = {}, {}
            for node, first, merges in buf.groups:
                values[node], left = _local_sum(self.be, buf, factors, first, merges,
                                                buf.total if node is None else buf.rows[first], defer)
                deferred.update(left)
        t2 = perf_counter()
        if guard is not None:
            head = next(iter(values.values()))
            head[flag] = flags = guard.flags()
            guard.step(poison=head[:buf.n_grad])
        if alone:
            total = next(iter(values.values()))  # one process: its one node is the whole tree, no copy
        elif buf.tree is not None:
            total = buf.tree.allreduce_nodes(values, buf.total)
        else:
            total = buf.total
            if comm is not None:
                comm.Allreduce(total)
        t3 = perf_counter()
        self.model.apply({**buf.views(total), **deferred}, self.epoch)
        seconds = self.seconds
        seconds["gradient"] += t1 - t0
        seconds["block sums"] += t2 - t1
        seconds["reduction"] += t3 - t2
        seconds["update"] += perf_counter() - t3
        self.sums += total[buf.n_grad:flag]
        if guard is None:
            return False, False
        # one process: its own flags are the sum (reading it would wait for a GPU)
        return guard.decide(flags if comm is None or comm.size == 1 else float(total[flag]))

    def fused_blocks_step(self, k: int, scale: float) -> tuple[bool, bool]:
        """A batch whose every block is this process's and has rows, on one thread: the
        model's ``fused_blocks_step`` (gradients, tree and step in one kernel call, the
        step's sums added in the tree as :meth:`step` adds them)."""
        guard = self.guard
        t0 = perf_counter()
        if guard is not None:  # flags read before the step, as the fused step does (no faults planted here)
            flags = guard.flags()
            guard.step()
        for total, value in zip(self.sum_views, self.fused_blocks(self.batch_rows(k), self.block_ends[k],
                                                                  self.block_rngs, self.buf.groups[0][2], scale,
                                                                  self.epoch)):
            total += value
        self.seconds["fused step"] += perf_counter() - t0
        return guard.decide(flags) if guard is not None else (False, False)

    def batch_rows(self, k: int):
        """Batch k's rows of all own blocks in one gather, block after block (the batched
        path's)."""
        return self.be.xp.take(self.shard.x, self.batch_order[self.batch_starts[k]:self.batch_starts[k + 1]], axis=0)

    def whole_batch(self, k: int, scale: float) -> tuple[dict, dict, float]:
        """:meth:`leaf_gradients` and the local sums of a batch whose every block is this
        process's and has rows, on one thread: all blocks in one call of the model's
        ``group_factors``, their filled rows added in the tree, the factored gradients
        left to the step. Returns ({tree node: its row}, {name: FactoredGradient}, the
        time the blocks' gradients were done)."""
        buf, xp, K = self.buf, self.be.xp, self.be.K
        node, first, merges = buf.groups[0]
        n = len(self.mine)
        rows = buf.leaves[first:first + n, buf.filled]
        rows[...] = 0
        extras, factors = self.model.group_factors(self.batch_rows(k), self.block_ends[k], self.block_rngs,
                                                   self.block_grads, scale)
        _write_sums(xp, buf, list(range(n)), extras)
        t1 = perf_counter()
        K.rows_tree_sum(rows, merges)
        out = buf.rows[first]  # the tree's sum, in its leftmost block's row
        grads = buf.views(out)
        return {node: out}, {name: FactoredGradient(K, [(a, d, at, [alpha] * n, 0, grads[name].shape[0])], merges,
                                                    grads[name])
                             for name, (a, d, at, alpha) in factors.items()}, t1

    def leaf_gradients(self, k: int, scale: float) -> list:
        """Each own block's gradient and sums of batch k into its row; returns the blocks'
        factors of the factored gradients (None for a block without any)."""
        model, buf, mb, mine, leaves = self.model, self.buf, self.mb, self.mine, self.buf.rows
        factors = [None] * max(len(mine), 1)
        if buf.batched:  # all of this rank's blocks at once
            live = np.flatnonzero(self.live[k]).tolist() if mine else []
            buf.leaves[:len(mine), buf.filled] = 0  # every own block's row, in one operation
            xs = []
            if live:  # the step's rows of all own blocks in one gather, each block's a view
                x = self.batch_rows(k)
                ends = self.block_ends[k]  # the live blocks' rows lie one after another in x
                xs = BlockRows(x, [ends[i] for i in live] + [ends[live[-1] + 1]])
            extras, found = model.block_factors(xs,
                                                [mb.rngs[mine[i]] for i in live],
                                                scale, [buf.views(leaves[i]) for i in live])
            for i, f in zip(live, found):
                factors[i] = f
        else:
            live = [i for i, b in enumerate(mine) if mb.cuts(b)[k + 1] > mb.cuts(b)[k]]  # an empty block's row stays 0

            def leaf(i):
                leaves[i][buf.filled] = 0
                return model.leaf_gradient(self.rows(mine[i], k), mb.rngs[mine[i]], scale, buf.views(leaves[i])) \
                    if i in live else None
            extras = [e for e in parallel_map(leaf, range(len(mine))) if e is not None]
        _write_sums(self.be.xp, buf, live, extras)
        return factors
